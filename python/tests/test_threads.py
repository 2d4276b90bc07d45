"""The map phase on a thread pool: the same bytes as a sequential run, and the GIL released while
a kernel compresses."""

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from kpack_fuse import _native
from kpack_fuse.compression import NoOpCompressor, ZstdCompressor
from kpack_fuse.kpack import PackedKernelArchive


def kernels(n=200):
    rng = random.Random(7)
    out = []
    for i in range(n):
        # Compressible but not trivial: repeated random words.
        words = [rng.getrandbits(64).to_bytes(8, "little") for _ in range(32)]
        data = b"".join(rng.choice(words) for _ in range(rng.randrange(100, 3000)))
        out.append((f"lib/lib{i % 17}.so#{i % 3}", f"gfx9{i // 51:02d}", data))
    return out


def pack(items, compressor, pool, digests=False):
    archive = PackedKernelArchive("g", "gfx9X", sorted({a for _, a, _ in items}),
                                  compressor=compressor, digests=digests)
    if pool:
        with ThreadPoolExecutor(max_workers=pool) as ex:
            for prepared in ex.map(lambda it: archive.prepare_kernel(*it), items):
                archive.add_kernel(prepared)
    else:
        for it in items:
            archive.add_kernel(archive.prepare_kernel(*it))
    archive.finalize_archive()
    return archive


@pytest.mark.parametrize("make", [ZstdCompressor, NoOpCompressor, lambda: ZstdCompressor(9)])
@pytest.mark.parametrize("digests", [False, True])
def test_pool_writes_the_sequential_bytes(tmp_path, make, digests):
    items = kernels()
    pack(items, make(), 0, digests).write(tmp_path / "seq.kpack")
    pack(items, make(), 4, digests).write(tmp_path / "pool.kpack")
    seq = (tmp_path / "seq.kpack").read_bytes()
    assert (tmp_path / "pool.kpack").read_bytes() == seq
    read = PackedKernelArchive.read(tmp_path / "pool.kpack")
    assert [(k, a, read.get_kernel(k, a)) for k, a, _ in items] == items


def test_compression_releases_the_gil():
    """While one thread compresses a large input, another runs Python code at most of its
    normal pace. With the GIL held, it could run for at most one switch interval (5 ms)."""
    # 16 MiB of 8-byte words from a small vocabulary: level 9 takes about 0.4 s on this
    # machine (4 MiB took 0.09 s, too close to the 0.1 s the check needs).
    rng = random.Random(5)
    words = [rng.getrandbits(64).to_bytes(8, "little") for _ in range(4096)]
    data = b"".join(rng.choices(words, k=1 << 21))
    done = threading.Event()
    counter = [0]

    def spin():
        while not done.is_set():
            counter[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.05)
        before, t0 = counter[0], time.perf_counter()
        time.sleep(0.2)  # the main thread waits without the GIL: the spinner's own pace
        rate = (counter[0] - before) / (time.perf_counter() - t0)
        before, t0 = counter[0], time.perf_counter()
        _native.zstd_frame(data, 9, False)
        elapsed = time.perf_counter() - t0
        during = counter[0] - before
    finally:
        done.set()
        t.join()
    assert elapsed > 0.1, f"the input compressed in {elapsed:.3f} s: too fast to tell"
    expected = rate * elapsed
    assert during > 0.25 * expected, (
        f"{during} iterations ran during {elapsed:.3f} s of compression; {expected:.0f} expected"
    )
