#!/usr/bin/env python3
"""An independent .kpack reader for interop tests, written from the format description only.

Usage: read_kpack.py ARCHIVE OUTDIR
Writes OUTDIR/<n>.bin for every kernel and OUTDIR/manifest.tsv with lines
"n<TAB>key<TAB>arch<TAB>ordinal<TAB>length", plus OUTDIR/meta.tsv with the TOC's scalar fields.
"""
import os
import struct
import sys

import msgpack
import zstandard


def main(archive, outdir):
    with open(archive, "rb") as f:
        data = f.read()
    magic, version, toc_offset = struct.unpack_from("<4sIQ", data, 0)
    if magic != b"KPAK" or version != 1:
        raise SystemExit("not a version-1 kpack archive")
    toc = msgpack.unpackb(data[toc_offset:], raw=False, strict_map_key=False)
    scheme = toc.get("compression_scheme", "none")
    if scheme == "none":
        spans = [(b["offset"], b["size"]) for b in toc["blobs"]]

        def kernel(ordinal, _size):
            off, size = spans[ordinal]
            return data[off:off + size]
    elif scheme == "zstd-per-kernel":
        pos = toc["zstd_offset"]
        (count,) = struct.unpack_from("<I", data, pos)
        pos += 4
        frames = []
        for _ in range(count):
            (size,) = struct.unpack_from("<I", data, pos)
            pos += 4
            frames.append(data[pos:pos + size])
            pos += size
        dctx = zstandard.ZstdDecompressor()

        def kernel(ordinal, size):
            return dctx.decompress(frames[ordinal], max_output_size=size)
    else:
        raise SystemExit("unknown scheme " + scheme)

    os.makedirs(outdir, exist_ok=True)
    n = 0
    with open(os.path.join(outdir, "manifest.tsv"), "w") as manifest:
        for key, arches in toc["toc"].items():
            for arch, entry in arches.items():
                blob = kernel(entry["ordinal"], entry["original_size"])
                with open(os.path.join(outdir, "%d.bin" % n), "wb") as out:
                    out.write(blob)
                manifest.write("%d\t%s\t%s\t%d\t%d\n" % (n, key, arch, entry["ordinal"], len(blob)))
                n += 1
    with open(os.path.join(outdir, "meta.tsv"), "w") as meta:
        for field in ("format_version", "group_name", "gfx_arch_family", "compression_scheme"):
            meta.write("%s\t%s\n" % (field, toc.get(field)))
        meta.write("gfx_arches\t%s\n" % ",".join(toc["gfx_arches"]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
