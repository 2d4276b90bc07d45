"""A user's own Python `Compressor` goes through the same calls, as in the reference."""

import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kpack_fuse import compression
from kpack_fuse.compression import (
    COMPRESSION_SCHEMES, CompressionInput, Compressor, ZstdCompressor,
)
from kpack_fuse.kpack import PackedKernelArchive

from conftest import ZSTD_KERNELS


class ZlibInput(CompressionInput):
    def __init__(self, data):
        self.data = data


class ZlibCompressor(Compressor):
    """A whole-blob scheme: kernels are concatenated and deflated as one stream."""

    SCHEME_NAME = "zlib-blob"

    def __init__(self):
        self._path = None
        self._offset = None
        self._sizes = None
        self._plain = None

    def prepare_kernel(self, kernel_data, kernel_id):
        return ZlibInput(bytes(kernel_data))

    def finalize(self, inputs):
        plain = b"".join(i.data for _, i in inputs)
        return zlib.compress(plain), {"zlib_offset": 0, "sizes": [len(i.data) for _, i in inputs]}

    @staticmethod
    def from_toc(toc_data, file_path):
        c = ZlibCompressor()
        c._path = Path(file_path)
        c._sizes = toc_data["sizes"]
        c._toc_seen = sorted(toc_data["toc"])
        return c

    def decompress_kernel(self, ordinal):
        if self._plain is None:
            raw = self._path.read_bytes()
            toc_offset = struct.unpack_from("<Q", raw, 8)[0]
            self._plain = zlib.decompress(raw[64:toc_offset])
        start = sum(self._sizes[:ordinal])
        return self._plain[start:start + self._sizes[ordinal]]


def test_user_compressor_round_trip(tmp_path, monkeypatch):
    monkeypatch.setitem(COMPRESSION_SCHEMES, ZlibCompressor.SCHEME_NAME, ZlibCompressor)
    archive = PackedKernelArchive("g", "gfx110X", ["gfx1100", "gfx1101"], compressor=ZlibCompressor())
    with ThreadPoolExecutor(2) as pool:
        for p in pool.map(lambda k: archive.prepare_kernel(*k), ZSTD_KERNELS):
            archive.add_kernel(p)
    archive.finalize_archive()
    assert archive._compression_metadata == {"zlib_offset": 0, "sizes": [1019, 619, 1018]}
    path = tmp_path / "zlib.kpack"
    archive.write(path)
    raw = path.read_bytes()
    blob = zlib.compress(b"".join(d for _, _, d in ZSTD_KERNELS))
    assert raw[:16] == struct.pack("<4sIQ", b"KPAK", 1, 64 + len(blob))
    assert raw[16:64] == bytes(48) and raw[64:64 + len(blob)] == blob
    import msgpack

    toc = msgpack.unpackb(raw[64 + len(blob):], raw=False)
    assert list(toc) == ["format_version", "group_name", "gfx_arch_family", "gfx_arches", "toc",
                         "compression_scheme", "zlib_offset", "sizes"]
    assert toc["compression_scheme"] == "zlib-blob"
    read = PackedKernelArchive.read(path)
    assert type(read._compressor) is ZlibCompressor
    assert read._compressor._toc_seen == ["bin/hiptest#0", "lib/libhip.so#0"]
    for key, arch, data in ZSTD_KERNELS:
        assert read.get_kernel(key, arch) == data
    with pytest.raises(RuntimeError):
        read.verify()


def test_subclass_of_builtin_compressor_uses_its_overrides(tmp_path):
    calls = []

    class Counting(ZstdCompressor):
        def prepare_kernel(self, kernel_data, kernel_id):
            calls.append(kernel_id)
            return super().prepare_kernel(kernel_data, kernel_id)

        def finalize(self, inputs):
            calls.append(len(inputs))
            return super().finalize(inputs)

    archive = PackedKernelArchive("test", "gfx110X", ["gfx1100", "gfx1101"], compressor=Counting())
    for key, arch, data in ZSTD_KERNELS:
        archive.add_kernel(archive.prepare_kernel(key, arch, data))
    archive.finalize_archive()
    archive.write(tmp_path / "a.kpack")
    assert calls == ["lib/libhip.so#0@gfx1100", "lib/libhip.so#0@gfx1101", "bin/hiptest#0@gfx1100", 3]
    golden = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "test_zstd.kpack"
    assert (tmp_path / "a.kpack").read_bytes() == golden.read_bytes()
    assert compression.ZstdCompressor is ZstdCompressor
