#!/usr/bin/env python3
"""Single-threaded Python baseline for the split and pack benchmarks (benches/split.rs).

`fatbin HOST OUTDIR`: reads the .hip_fatbin section of an ELF64 host binary, walks its
uncompressed offload bundles, compresses every device code object with zstandard level 3 (one
frame each, content size recorded, no checksum) and writes one kpack archive per arch
(header, zstd-per-kernel blob, msgpack TOC), as the reference tooling does, on one thread.

`tree DIR OUT`: packs a tree laid out as <key>/<arch>.hsaco into one archive the same way.

Prints nothing; the caller times it.
"""
import os
import struct
import sys

import msgpack
import zstandard

MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"


def fatbin_section(path):
    with open(path, "rb") as f:
        ehdr = f.read(64)
        shoff, = struct.unpack_from("<Q", ehdr, 40)
        shnum, shstrndx = struct.unpack_from("<HH", ehdr, 60)
        f.seek(shoff)
        table = f.read(shnum * 64)
        shdrs = [struct.unpack_from("<IIQQQQIIQQ", table, i * 64) for i in range(shnum)]
        names = shdrs[shstrndx]
        f.seek(names[4])
        strtab = f.read(names[5])
        for s in shdrs:
            name = strtab[s[0]:strtab.index(b"\0", s[0])]
            if name == b".hip_fatbin":
                return s[4], s[5]
    raise SystemExit(f"{path}: no .hip_fatbin")


def code_objects(path):
    """(arch, triple, bytes) in bundle order, reading one bundle table at a time."""
    base, size = fatbin_section(path)
    with open(path, "rb") as f:
        pos = 0
        while pos < size:
            f.seek(base + pos)
            window = f.read(min(1 << 20, size - pos))
            at = window.find(MAGIC)
            if at < 0:
                if pos + len(window) >= size:
                    return
                pos += len(window) - len(MAGIC) + 1
                continue
            start = pos + at
            f.seek(base + start)
            head = f.read(65536)
            count, = struct.unpack_from("<Q", head, 24)
            at, end, entries = 32, 0, []
            for _ in range(count):
                off, sz, tl = struct.unpack_from("<QQQ", head, at)
                triple = head[at + 24:at + 24 + tl].decode()
                at += 24 + tl
                end = max(end, off + sz)
                if not triple.startswith("host-"):
                    entries.append((triple, off, sz))
            for triple, off, sz in entries:
                f.seek(base + start + off)
                yield triple.rsplit("--", 1)[1], triple, f.read(sz)
            pos = start + max(end, at)


CCTX = zstandard.ZstdCompressor(level=3, write_content_size=True, write_checksum=False)


def write_archive(path, group, family, arches, kernels):
    """kernels: iterable of (key, arch, zstd frame, original size, metadata) in ordinal order."""
    toc, count = {}, 0
    with open(path, "wb") as out:
        out.write(b"\0" * 68)
        blob_len = 4
        for key, arch, frame, size, meta in kernels:
            out.write(struct.pack("<I", len(frame)))
            out.write(frame)
            blob_len += 4 + len(frame)
            entry = {"type": "hsaco", "ordinal": count, "original_size": size}
            if meta:
                entry["metadata"] = meta
            toc.setdefault(key, {})[arch] = entry
            count += 1
        doc = {
            "format_version": 1, "group_name": group, "gfx_arch_family": family,
            "gfx_arches": arches, "toc": toc, "compression_scheme": "zstd-per-kernel",
            "zstd_offset": 64, "zstd_size": blob_len,
        }
        out.write(msgpack.packb(doc, use_bin_type=True))
        out.seek(0)
        out.write(b"KPAK" + struct.pack("<IQ", 1, 64 + blob_len))
        out.seek(64)
        out.write(struct.pack("<I", count))


def pack_fatbin(host, outdir):
    os.makedirs(outdir, exist_ok=True)
    name = os.path.basename(host)
    per_arch, counters = {}, {}
    for arch, triple, data in code_objects(host):
        i = counters.get(arch, 0)
        counters[arch] = i + 1
        frame = CCTX.compress(data)
        per_arch.setdefault(arch, []).append((f"{name}#{i}", arch, frame, len(data), {"target": triple}))
    for arch, kernels in per_arch.items():
        write_archive(os.path.join(outdir, f"bench_{arch}.kpack"), "bench", arch, [arch], kernels)


def pack_tree(tree, out):
    # Keys may have several components (`lib/libfoo.so#0`): a key is the directory holding the
    # `.hsaco` files, relative to the tree, walked in sorted order like `kpack-fuse pack`.
    files = []
    for d, subdirs, names in os.walk(tree):
        subdirs.sort()
        key = os.path.relpath(d, tree)
        files += [(key, n) for n in sorted(names) if n.endswith(".hsaco")]
    files.sort()

    def kernels():
        for key, f in files:
            with open(os.path.join(tree, key, f), "rb") as fh:
                data = fh.read()
            yield key, f[:-len(".hsaco")], CCTX.compress(data), len(data), None
    arches = sorted({f[:-len(".hsaco")] for _, f in files})
    write_archive(out, "bench", "mixed", arches, kernels())


if __name__ == "__main__":
    if sys.argv[1] == "fatbin":
        pack_fatbin(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "tree":
        pack_tree(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("usage: python_pack.py fatbin HOST OUTDIR | tree DIR OUT")
