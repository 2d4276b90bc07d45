#!/usr/bin/env python3
"""A packaging tool of the reference's shape, written against `rocm_kpack` (not kpack_fuse):
packs a tree of `<binary key>/<arch>.hsaco` files into one archive per arch family, preparing
kernels on a thread pool and adding them in input order, then reads every archive back.

usage: pack_tree_like.py TREE OUTDIR GROUP
Prints one line per archive: its name, kernel count and the module that served the API.
"""
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rocm_kpack.compression import ZstdCompressor
from rocm_kpack.kpack import PackedKernelArchive


def family_of(arch):
    return arch.split(":")[0][:-1] + "X"


def main():
    tree, outdir, group = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    by_family = {}
    for f in sorted(tree.rglob("*.hsaco")):
        key = f.parent.relative_to(tree).as_posix()
        arch = f.stem
        by_family.setdefault(family_of(arch), []).append((key, arch, f))
    for family, items in sorted(by_family.items()):
        arches = sorted({a for _, a, _ in items})
        archive = PackedKernelArchive(group, family, arches, compressor=ZstdCompressor())

        def prepare(item):
            key, arch, f = item
            return archive.prepare_kernel(key, arch, f.read_bytes(), metadata={"source": str(f.name)})

        with ThreadPoolExecutor(max_workers=2) as pool:
            for prepared in pool.map(prepare, items):
                archive.add_kernel(prepared)
        archive.finalize_archive()
        out = outdir / PackedKernelArchive.compute_pack_filename(group, family)
        archive.write(out)

        back = PackedKernelArchive.read(out)
        for key, arch, f in items:
            assert back.get_kernel(key, arch) == f.read_bytes(), (key, arch)
        n = sum(len(a) for a in back.toc.values())
        print(out.name, n, type(back).__module__)


if __name__ == "__main__":
    main()
