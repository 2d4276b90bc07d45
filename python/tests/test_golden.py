"""The reference writer's golden archives, rebuilt through the API byte for byte."""

import pytest

from kpack_fuse.compression import NoOpCompressor, ZstdCompressor
from kpack_fuse.kpack import PackedKernelArchive

from conftest import FIXTURES, NOOP_KERNELS, ZSTD_KERNELS

GOLDENS = [
    ("test_noop.kpack", "gfx900X", ["gfx900", "gfx906"], None, NOOP_KERNELS),
    ("test_noop.kpack", "gfx900X", ["gfx900", "gfx906"], NoOpCompressor, NOOP_KERNELS),
    ("test_zstd.kpack", "gfx110X", ["gfx1100", "gfx1101"], ZstdCompressor, ZSTD_KERNELS),
]


@pytest.mark.parametrize("name,family,arches,compressor,kernels", GOLDENS)
def test_golden_rebuilt_byte_for_byte(tmp_path, name, family, arches, compressor, kernels):
    archive = PackedKernelArchive(
        "test", family, arches, compressor=compressor() if compressor else None
    )
    for key, arch, data in kernels:
        archive.add_kernel(archive.prepare_kernel(key, arch, data))
    archive.finalize_archive()
    out = tmp_path / name
    archive.write(out)
    assert out.read_bytes() == (FIXTURES / name).read_bytes()


def test_zstd_level_3_is_the_default(tmp_path):
    archive = PackedKernelArchive("test", "gfx110X", ["gfx1100", "gfx1101"], compressor=ZstdCompressor())
    for key, arch, data in ZSTD_KERNELS:
        archive.add_kernel(archive.prepare_kernel(key, arch, data))
    archive.finalize_archive()
    archive.write(str(tmp_path / "str-path.kpack"))
    assert (tmp_path / "str-path.kpack").read_bytes() == (FIXTURES / "test_zstd.kpack").read_bytes()


@pytest.mark.parametrize("compressor", [NoOpCompressor, ZstdCompressor])
def test_empty_archive_bytes(tmp_path, compressor):
    import struct

    import msgpack

    archive = PackedKernelArchive("g", "gfx9X", ["gfx900"], compressor=compressor())
    archive.finalize_archive()
    archive.write(tmp_path / "empty.kpack")
    blob = b"" if compressor is NoOpCompressor else struct.pack("<I", 0)
    fields = {"blobs": []} if compressor is NoOpCompressor else {"zstd_offset": 64, "zstd_size": 4}
    toc = msgpack.packb({
        "format_version": 1, "group_name": "g", "gfx_arch_family": "gfx9X",
        "gfx_arches": ["gfx900"], "toc": {}, "compression_scheme": compressor.SCHEME_NAME, **fields,
    }, use_bin_type=True)
    header = struct.pack("<4sIQ", b"KPAK", 1, 64 + len(blob))
    assert (tmp_path / "empty.kpack").read_bytes() == header + bytes(48) + blob + toc
    read = PackedKernelArchive.read(tmp_path / "empty.kpack")
    assert read.toc == {} and list(read) == [] and read.get_kernel("k", "gfx900") is None


def test_metadata_of_every_type_is_encoded_as_msgpack_does(tmp_path):
    import struct

    import msgpack

    metadata = {
        "target": "hipv4-amdgcn-amd-amdhsa--gfx900", "n": 1, "big": 2**63 + 5, "neg": -200,
        "small_neg": -3, "f": 1.5, "flag": True, "none": None, "raw": b"\x00\x01",
        "list": [1, "two", [3.0]], "tuple": (4, 5), "nested": {"k": {"deep": [None]}},
        "u16": 65535, "i32": -(2**31), "long": "x" * 300,
    }
    archive = PackedKernelArchive("g", "gfx9X", ["gfx900"])
    archive.add_kernel(archive.prepare_kernel("lib/a.so#0", "gfx900", b"abc", metadata))
    archive.finalize_archive()
    archive.write(tmp_path / "m.kpack")
    raw = (tmp_path / "m.kpack").read_bytes()
    toc_offset = struct.unpack_from("<Q", raw, 8)[0]
    expected = msgpack.packb({
        "format_version": 1, "group_name": "g", "gfx_arch_family": "gfx9X", "gfx_arches": ["gfx900"],
        "toc": archive.toc, "compression_scheme": "none", "blobs": [{"offset": 64, "size": 3}],
    }, use_bin_type=True)
    assert raw[toc_offset:] == expected
    entry = PackedKernelArchive.read(tmp_path / "m.kpack").toc["lib/a.so#0"]["gfx900"]
    assert entry["metadata"] == dict(metadata, tuple=[4, 5])


def test_unencodable_metadata_is_a_type_error(tmp_path):
    archive = PackedKernelArchive("g", "gfx9X", ["gfx900"])
    archive.add_kernel(archive.prepare_kernel("k", "gfx900", b"abc", {"s": {1, 2}}))
    archive.finalize_archive()
    with pytest.raises(TypeError) as e:
        archive.write(tmp_path / "m.kpack")
    assert str(e.value) == "can not serialize 'set' object"
    with pytest.raises(OverflowError):
        archive.toc["k"]["gfx900"]["metadata"] = {"s": 2**64}
        archive.write(tmp_path / "m.kpack")
