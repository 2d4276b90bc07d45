#!/usr/bin/env python3
"""The Python API against its pure-Python baseline (bench/python_kpack.py), in the same run.

    python_api.py --tree DIR [--rounds N]   a tree of <binary key>/<arch>.hsaco files (the real
                                            rocSPARSE set: bench/fetch-rocsparse.sh makes it)
    python_api.py --quick                   a small synthetic tree, one round: a smoke run that
                                            prints figures but no verdicts

Three measurements, each in a fresh interpreter, taking turns between the two implementations:
- write: one zstd archive of every kernel, `prepare_kernel` on a thread pool of 2 (each worker
  reads its kernel's file), `add_kernel` in input order, `finalize_archive`, `write`. The two
  archives must be byte-identical.
- read+1: `read` of that archive and one `get_kernel` of a kernel of the mean size.
- read all: `read` and `get_kernel` of every kernel through `toc`.
Each prints wall and CPU (user+system) time and peak memory above the interpreter's resident
size after imports (the peak resident size, VmHWM, minus the resident size before the work), as the median of
the rounds, and the ratios API / baseline. Run it with the wheel installed (scripts/test-python.sh
makes a venv that has it).
"""

import argparse
import filecmp
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

TARGETS = {"write": 0.9, "read+1": 0.1, "read all": 1.0}


def status_kb(field):
    """A size from /proc/self/status: VmRSS now, or VmHWM, the peak since this program started
    (getrusage's ru_maxrss would carry the parent's peak across exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise SystemExit(f"no {field} in /proc/self/status")


def child(impl, mode, tree, archive):
    if impl == "api":
        from kpack_fuse.compression import ZstdCompressor
        from kpack_fuse.kpack import PackedKernelArchive
    else:
        sys.path.insert(0, str(HERE))
        from python_kpack import PackedKernelArchive, ZstdCompressor
    from concurrent.futures import ThreadPoolExecutor

    items = []
    if mode == "write":
        for f in sorted(Path(tree).rglob("*.hsaco")):
            items.append((f.parent.relative_to(tree).as_posix(), f.stem, f))
    base = status_kb("VmRSS")
    t0, c0 = time.perf_counter(), os.times()
    if mode == "write":
        archive = PackedKernelArchive("bench", "all", sorted({a for _, a, _ in items}),
                                      compressor=ZstdCompressor())

        def prepare(item):
            key, arch, f = item
            return archive.prepare_kernel(key, arch, f.read_bytes())

        with ThreadPoolExecutor(max_workers=2) as pool:
            for prepared in pool.map(prepare, items):
                archive.add_kernel(prepared)
        archive.finalize_archive()
        archive.write(Path(archive_path := archive_out(archive, impl)))
        result = archive_path
    elif mode == "read+1":
        archive = PackedKernelArchive.read(Path(archive))
        key, arch = json.loads(os.environ["BENCH_LARGEST"])
        result = len(archive.get_kernel(key, arch))
    else:
        archive = PackedKernelArchive.read(Path(archive))
        total = 0
        for key, arches in archive.toc.items():
            for arch in arches:
                total += len(archive.get_kernel(key, arch))
        result = total
    wall = time.perf_counter() - t0
    c1 = os.times()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    peak = status_kb("VmHWM")
    print(json.dumps({"wall": wall, "cpu": cpu, "mem_kb": peak - base, "result": result}))


def archive_out(archive, impl):
    return os.path.join(os.environ["BENCH_OUT"], f"{impl}.kpack")


def run_child(impl, mode, tree, archive, env):
    out = subprocess.run(
        [sys.executable, __file__, "--child", impl, mode, str(tree), str(archive)],
        check=True, capture_output=True, text=True, env=env,
    )
    return json.loads(out.stdout)


def synthetic_tree(root, n=300):
    rng = random.Random(3)
    words = [rng.getrandbits(128).to_bytes(16, "little") for _ in range(64)]
    for i in range(n):
        d = root / f"lib/librocfoo.so#{i // 3}"
        d.mkdir(parents=True, exist_ok=True)
        data = b"".join(rng.choice(words) for _ in range(rng.randrange(200, 6000)))
        (d / f"gfx{900 + i % 3}.hsaco").write_bytes(data)


def typical(tree):
    """The kernel whose size is closest to the mean: the one kernel a loader asks for."""
    files = [(f, f.stat().st_size) for f in Path(tree).rglob("*.hsaco")]
    mean = sum(n for _, n in files) / len(files)
    best, size = min(files, key=lambda fn: (abs(fn[1] - mean), str(fn[0])))
    return best.parent.relative_to(tree).as_posix(), best.stem, size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tree")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", nargs=4)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    with tempfile.TemporaryDirectory(prefix="kpack-pyapi-") as work:
        work = Path(work)
        if args.quick:
            tree = work / "tree"
            synthetic_tree(tree)
            rounds = 1
        elif args.tree:
            tree = Path(args.tree)
            rounds = args.rounds
        else:
            ap.error("give --tree DIR (bench/fetch-rocsparse.sh makes one) or --quick")
        key, arch, size = typical(tree)
        files = list(Path(tree).rglob("*.hsaco"))
        total = sum(f.stat().st_size for f in files)
        print(f"kernels: {len(files)}, {total / 2**20:.1f} MiB; read+1 reads {key} [{arch}], "
              f"{size / 2**20:.2f} MiB; rounds: {rounds}")
        env = dict(os.environ, BENCH_OUT=str(work), BENCH_LARGEST=json.dumps([key, arch]))
        figures = {m: {"api": [], "baseline": []} for m in TARGETS}
        for r in range(rounds):
            order = ["api", "baseline"] if r % 2 == 0 else ["baseline", "api"]
            for impl in order:
                figures["write"][impl].append(run_child(impl, "write", tree, "", env))
            if not filecmp.cmp(work / "api.kpack", work / "baseline.kpack", shallow=False):
                sys.exit("python_api: the two implementations wrote different archives")
            archive = work / "api.kpack"
            for mode in ("read+1", "read all"):
                for impl in order:
                    figures[mode][impl].append(run_child(impl, mode, tree, archive, env))
        size = (work / "api.kpack").stat().st_size
        print(f"archive: {size / 2**20:.1f} MiB (identical bytes from both)")
        print(f"{'':10} {'API wall':>9} {'base wall':>9} {'ratio':>6} | {'API cpu':>8} "
              f"{'base cpu':>8} {'ratio':>6} | {'API MiB':>8} {'base MiB':>8} {'ratio':>6}"
              + ("" if args.quick else "  target"))
        for mode, target in TARGETS.items():
            med = {impl: {k: statistics.median(f[k] for f in runs) for k in ("wall", "cpu", "mem_kb")}
                   for impl, runs in figures[mode].items()}
            a, b = med["api"], med["baseline"]
            ratio = lambda k: a[k] / b[k] if b[k] else float("nan")  # noqa: E731
            line = (f"{mode:10} {a['wall']:9.3f} {b['wall']:9.3f} {ratio('wall'):6.2f} | "
                    f"{a['cpu']:8.2f} {b['cpu']:8.2f} {ratio('cpu'):6.2f} | "
                    f"{a['mem_kb'] / 1024:8.1f} {b['mem_kb'] / 1024:8.1f} {ratio('mem_kb'):6.2f}")
            line += (f"  API {plainly(ratio('wall'), 'faster', 'slower', 'as fast')}, "
                     f"{plainly(ratio('mem_kb'), 'less', 'more', 'the same')} memory")
            if not args.quick:
                time_ok = ratio("wall") <= target
                mem_target = {"write": 0.5, "read+1": 0.1, "read all": None}[mode]
                mem_ok = mem_target is None or ratio("mem_kb") <= mem_target
                line += (f"  time <= {target}x: {'met' if time_ok else 'MISSED'}"
                         + ("" if mem_target is None else
                            f", memory <= {mem_target}x: {'met' if mem_ok else 'MISSED'}"))
            print(line)


def plainly(ratio, below, above, even):
    """An API/baseline ratio of times or sizes in words (within 2% of 1 counts as even)."""
    if ratio < 0.98:
        return below
    if ratio > 1.02:
        return above
    return even


if __name__ == "__main__":
    main()
