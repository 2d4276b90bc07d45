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
