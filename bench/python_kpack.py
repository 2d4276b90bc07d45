"""The benchmarks' pure-Python baseline of the kpack archive API: `PackedKernelArchive` with the
"none" and "zstd-per-kernel" compressors, in plain Python on `msgpack` and `zstandard`, writing
the same bytes as `kpack_fuse.kpack` for the same calls.

It works the way the API's contract suggests without a native core: the map phase keeps each
compressed frame in memory, the reduce phase (`finalize`) joins them into one blob, and a reader
loads the whole blob on its first kernel and slices frames out of it. python-zstandard releases
the GIL while it compresses, so a thread pool speeds its map phase up too.

Used by bench/python_api.py; not part of the package.
"""

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import msgpack
import zstandard


class NoOpCompressor:
    SCHEME_NAME = "none"

    def __init__(self):
        self._path = None
        self._blobs = None

    def prepare_kernel(self, kernel_data, kernel_id):
        return kernel_data

    def finalize(self, inputs):
        blobs, pos = [], 0
        for _, data in inputs:
            blobs.append({"offset": pos, "size": len(data)})
            pos += len(data)
        return b"".join(d for _, d in inputs), {"blobs": blobs}

    @staticmethod
    def from_toc(toc_data, file_path):
        c = NoOpCompressor()
        c._path, c._blobs = Path(file_path), toc_data["blobs"]
        return c

    def decompress_kernel(self, ordinal):
        blob = self._blobs[ordinal]
        with self._path.open("rb") as f:
            f.seek(blob["offset"])
            return f.read(blob["size"])


class ZstdCompressor:
    SCHEME_NAME = "zstd-per-kernel"

    def __init__(self, compression_level=3):
        self.compression_level = compression_level
        self._path = None
        self._blob = None
        self._frames = None

    def prepare_kernel(self, kernel_data, kernel_id):
        # A compressor object is not shareable between threads: one per call.
        return zstandard.ZstdCompressor(level=self.compression_level).compress(kernel_data)

    def finalize(self, inputs):
        parts = [struct.pack("<I", len(inputs))]
        for _, frame in inputs:
            parts += [struct.pack("<I", len(frame)), frame]
        blob = b"".join(parts)
        return blob, {"zstd_offset": 0, "zstd_size": len(blob)}

    @staticmethod
    def from_toc(toc_data, file_path):
        c = ZstdCompressor()
        c._path = Path(file_path)
        c._offset, c._size = toc_data["zstd_offset"], toc_data["zstd_size"]
        return c

    def decompress_kernel(self, ordinal):
        if self._blob is None:
            with self._path.open("rb") as f:
                f.seek(self._offset)
                self._blob = f.read(self._size)
            self._frames, pos = [], 4
            for _ in range(struct.unpack_from("<I", self._blob)[0]):
                (n,) = struct.unpack_from("<I", self._blob, pos)
                self._frames.append((pos + 4, n))
                pos += 4 + n
            self._dctx = zstandard.ZstdDecompressor()
        start, n = self._frames[ordinal]
        return self._dctx.decompress(self._blob[start:start + n])


SCHEMES = {"none": NoOpCompressor, "zstd-per-kernel": ZstdCompressor}


@dataclass
class PreparedKernel:
    relative_path: str
    gfx_arch: str
    compression_input: Any
    kernel_id: str
    original_size: int
    metadata: Optional[dict] = None


class PackedKernelArchive:
    def __init__(self, group_name, gfx_arch_family, gfx_arches, output_path=None, compressor=None):
        self.group_name, self.gfx_arch_family, self.gfx_arches = group_name, gfx_arch_family, gfx_arches
        self.toc = {}
        self._compressor = compressor or NoOpCompressor()
        self._inputs = []
        self._blob = None
        self._meta = None

    def prepare_kernel(self, relative_path, gfx_arch, hsaco_data, metadata=None):
        relative_path = relative_path.replace("\\", "/")
        kernel_id = f"{relative_path}@{gfx_arch}"
        prepared = self._compressor.prepare_kernel(hsaco_data, kernel_id)
        return PreparedKernel(relative_path, gfx_arch, prepared, kernel_id, len(hsaco_data), metadata)

    def add_kernel(self, p):
        arches = self.toc.setdefault(p.relative_path, {})
        if p.gfx_arch in arches:
            raise ValueError(f"Kernel already exists for {p.relative_path} @ {p.gfx_arch}")
        entry = {"type": "hsaco", "ordinal": len(self._inputs), "original_size": p.original_size}
        if p.metadata:
            entry["metadata"] = p.metadata
        arches[p.gfx_arch] = entry
        self._inputs.append((p.kernel_id, p.compression_input))

    def finalize_archive(self):
        self._blob, self._meta = self._compressor.finalize(self._inputs)
        self._inputs = []

    def write(self, output_path):
        fields = {"compression_scheme": self._compressor.SCHEME_NAME, **self._meta}
        if "zstd_offset" in fields:
            fields["zstd_offset"] = 64
        if "blobs" in fields:
            fields["blobs"] = [{"offset": b["offset"] + 64, "size": b["size"]} for b in fields["blobs"]]
        toc = msgpack.packb({
            "format_version": 1,
            "group_name": self.group_name,
            "gfx_arch_family": self.gfx_arch_family,
            "gfx_arches": self.gfx_arches,
            "toc": self.toc,
            **fields,
        }, use_bin_type=True)
        with open(output_path, "wb") as f:
            f.write(struct.pack("<4sIQ", b"KPAK", 1, 64 + len(self._blob)) + bytes(48))
            f.write(self._blob)
            f.write(toc)

    @staticmethod
    def read(input_path):
        with open(input_path, "rb") as f:
            magic, version, toc_offset = struct.unpack("<4sIQ", f.read(16))
            if magic != b"KPAK" or version != 1:
                raise ValueError("not a kpack archive")
            f.seek(toc_offset)
            toc_data = msgpack.unpack(f, raw=False)
        archive = PackedKernelArchive(toc_data["group_name"], toc_data["gfx_arch_family"],
                                      toc_data["gfx_arches"])
        archive.toc = toc_data["toc"]
        archive._compressor = SCHEMES[toc_data.get("compression_scheme", "none")].from_toc(
            toc_data, input_path)
        return archive

    def get_kernel(self, relative_path, gfx_arch):
        entry = self.toc.get(relative_path.replace("\\", "/"), {}).get(gfx_arch)
        if entry is None:
            return None
        return self._compressor.decompress_kernel(entry["ordinal"])
