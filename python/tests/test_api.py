"""Every method, attribute, default and error of the reference API, with exact values."""

import dataclasses
import inspect
import struct
from pathlib import Path

import pytest

from kpack_fuse import compression as c
from kpack_fuse.compression import (
    COMPRESSION_SCHEMES,
    CompressionInput,
    Compressor,
    NoOpCompressionInput,
    NoOpCompressor,
    ZstdCompressionInput,
    ZstdCompressor,
    create_compressor_from_toc,
)
from kpack_fuse.kpack import PackedKernelArchive, PreparedKernel

from conftest import FIXTURES, NOOP_KERNELS, ZSTD_KERNELS


def build(kernels, compressor=None, **kw):
    archive = PackedKernelArchive("test", "gfx900X", ["gfx900", "gfx906"], compressor=compressor, **kw)
    for key, arch, data in kernels:
        archive.add_kernel(archive.prepare_kernel(key, arch, data))
    archive.finalize_archive()
    return archive


def test_class_constants_and_signatures():
    assert PackedKernelArchive.MAGIC == b"KPAK"
    assert PackedKernelArchive.FORMAT_VERSION == 1
    assert PackedKernelArchive.HEADER_SIZE == 16
    assert PackedKernelArchive.BLOB_ALIGNMENT == 64
    init = inspect.signature(PackedKernelArchive.__init__)
    assert list(init.parameters)[:6] == [
        "self", "group_name", "gfx_arch_family", "gfx_arches", "output_path", "compressor",
    ]
    assert init.parameters["output_path"].default is None
    assert init.parameters["compressor"].default is None
    prep = inspect.signature(PackedKernelArchive.prepare_kernel)
    assert list(prep.parameters) == ["self", "relative_path", "gfx_arch", "hsaco_data", "metadata"]
    assert prep.parameters["metadata"].default is None
    assert list(inspect.signature(PackedKernelArchive.get_kernel).parameters) == [
        "self", "relative_path", "gfx_arch",
    ]
    assert isinstance(inspect.getattr_static(PackedKernelArchive, "read"), staticmethod)
    assert isinstance(
        inspect.getattr_static(PackedKernelArchive, "compute_pack_filename"), staticmethod
    )
    assert inspect.signature(ZstdCompressor).parameters["compression_level"].default == 3
    assert ZstdCompressor().compression_level == 3
    assert NoOpCompressor.SCHEME_NAME == "none"
    assert ZstdCompressor.SCHEME_NAME == "zstd-per-kernel"
    assert Compressor.SCHEME_NAME is NotImplemented
    assert COMPRESSION_SCHEMES == {"none": NoOpCompressor, "zstd-per-kernel": ZstdCompressor}
    assert issubclass(NoOpCompressionInput, CompressionInput)
    assert issubclass(ZstdCompressionInput, CompressionInput)
    with pytest.raises(TypeError):
        Compressor()


def test_prepared_kernel_dataclass():
    fields = [(f.name, f.default) for f in dataclasses.fields(PreparedKernel)]
    assert fields == [
        ("relative_path", dataclasses.MISSING),
        ("gfx_arch", dataclasses.MISSING),
        ("compression_input", dataclasses.MISSING),
        ("kernel_id", dataclasses.MISSING),
        ("original_size", dataclasses.MISSING),
        ("metadata", None),
    ]
    archive = PackedKernelArchive("g", "f", ["gfx900"])
    p = archive.prepare_kernel("bin\\sub\\app#0", "gfx900", b"abc", {"k": "v"})
    assert p.relative_path == "bin/sub/app#0"
    assert p.gfx_arch == "gfx900"
    assert p.kernel_id == "bin/sub/app#0@gfx900"
    assert p.original_size == 3
    assert p.metadata == {"k": "v"}
    assert isinstance(p.compression_input, NoOpCompressionInput)
    assert p.compression_input.data == b"abc"


def test_default_compressor_is_noop_and_streaming_mode_is_refused():
    archive = PackedKernelArchive("g", "f", ["gfx900"])
    assert type(archive._compressor) is NoOpCompressor
    assert archive.toc == {}
    assert (archive.group_name, archive.gfx_arch_family, archive.gfx_arches) == ("g", "f", ["gfx900"])
    with pytest.raises(ValueError) as e:
        PackedKernelArchive("g", "f", ["gfx900"], output_path=Path("x.kpack"))
    assert str(e.value) == (
        "Streaming write mode not yet supported. "
        "Use in-memory mode (output_path=None) and call write(path) when done."
    )


def test_add_kernel_builds_the_toc_and_refuses_duplicates():
    archive = PackedKernelArchive("g", "f", ["gfx900", "gfx906"], compressor=ZstdCompressor())
    archive.add_kernel(archive.prepare_kernel("lib/a.so#0", "gfx900", b"x" * 10, {"target": "t"}))
    archive.add_kernel(archive.prepare_kernel("lib/a.so#0", "gfx906", b"y" * 20, {}))
    archive.add_kernel(archive.prepare_kernel("bin/b#0", "gfx900", b"z" * 30))
    assert archive.toc == {
        "lib/a.so#0": {
            "gfx900": {"type": "hsaco", "ordinal": 0, "original_size": 10, "metadata": {"target": "t"}},
            "gfx906": {"type": "hsaco", "ordinal": 1, "original_size": 20},
        },
        "bin/b#0": {"gfx900": {"type": "hsaco", "ordinal": 2, "original_size": 30}},
    }
    assert list(archive.toc) == ["lib/a.so#0", "bin/b#0"]
    with pytest.raises(ValueError) as e:
        archive.add_kernel(archive.prepare_kernel("lib\\a.so#0", "gfx906", b"again"))
    assert str(e.value) == "Kernel already exists for lib/a.so#0 @ gfx906"
    assert repr(archive) == "PackedKernelArchive(group=g, family=f, binaries=2, kernels=3)"


def test_finalize_write_and_get_kernel_errors(tmp_path):
    archive = PackedKernelArchive("g", "f", ["gfx900"], compressor=ZstdCompressor())
    archive.add_kernel(archive.prepare_kernel("k", "gfx900", b"data"))
    with pytest.raises(RuntimeError) as e:
        archive.write(tmp_path / "a.kpack")
    assert str(e.value) == "Archive not finalized. Call finalize_archive() first."
    with pytest.raises(RuntimeError) as e:
        archive.get_kernel("k", "gfx900")
    assert str(e.value) == (
        "Cannot get_kernel() before archive is finalized. Call finalize_archive() first."
    )
    assert archive.get_kernel("k", "gfx906") is None
    assert archive.get_kernel("missing", "gfx900") is None
    archive.finalize_archive()
    with pytest.raises(RuntimeError) as e:
        archive.finalize_archive()
    assert str(e.value) == "Archive already finalized"
    # A built archive's compressor was not made from a TOC, as in the reference.
    with pytest.raises(RuntimeError) as e:
        archive.get_kernel("k", "gfx900")
    assert str(e.value) == "Compressor not initialized from TOC"
    out = tmp_path / "new" / "dir" / "a.kpack"
    archive.write(out)
    assert out.read_bytes()[:16] == struct.pack("<4sIQ", b"KPAK", 1, 64 + 4 + 4 + len(
        ZstdCompressor().prepare_kernel(b"data", "k").compressed_frame))
    assert PackedKernelArchive.read(out).get_kernel("k", "gfx900") == b"data"
    # Writing twice writes the same bytes.
    archive.write(tmp_path / "b.kpack")
    assert (tmp_path / "b.kpack").read_bytes() == out.read_bytes()


def test_compute_pack_filename():
    assert PackedKernelArchive.compute_pack_filename("blas", "gfx100X") == "blas-gfx100X.kpack"


@pytest.mark.parametrize("name,kernels", [("noop", NOOP_KERNELS), ("zstd", ZSTD_KERNELS)])
def test_read_golden(name, kernels):
    archive = PackedKernelArchive.read(FIXTURES / f"test_{name}.kpack")
    assert archive.group_name == "test"
    assert archive.gfx_arch_family == ("gfx900X" if name == "noop" else "gfx110X")
    assert archive.gfx_arches == (["gfx900", "gfx906"] if name == "noop" else ["gfx1100", "gfx1101"])
    for key, arch, data in kernels:
        assert archive.get_kernel(key, arch) == data
        assert archive.get_kernel(key.replace("/", "\\"), arch) == data
    assert archive.get_kernel("lib/none.so#0", "gfx900") is None
    assert archive.get_kernel(kernels[0][0], "gfx942") is None
    expected_toc = {}
    for ordinal, (key, arch, data) in enumerate(kernels):
        expected_toc.setdefault(key, {})[arch] = {
            "type": "hsaco", "ordinal": ordinal, "original_size": len(data),
        }
    assert archive.toc == expected_toc
    assert list(archive.toc) == [kernels[0][0], kernels[2][0]]
    # After the dict is built, reads go through it and the compressor, as in the reference.
    for key, arch, data in kernels:
        assert archive.get_kernel(key, arch) == data
    assert repr(archive) == (
        f"PackedKernelArchive(group=test, family={archive.gfx_arch_family}, binaries=2, kernels=3)"
    )
    assert archive._archive_finalized
    expected_type = NoOpCompressor if name == "noop" else ZstdCompressor
    assert type(archive._compressor) is expected_type


def test_read_errors(tmp_path):
    golden = (FIXTURES / "test_zstd.kpack").read_bytes()
    bad_magic = tmp_path / "magic.kpack"
    bad_magic.write_bytes(b"XPAK" + golden[4:])
    with pytest.raises(ValueError) as e:
        PackedKernelArchive.read(bad_magic)
    assert str(e.value) == "Invalid magic number: b'XPAK' (expected b'KPAK')"
    bad_version = tmp_path / "version.kpack"
    bad_version.write_bytes(golden[:4] + struct.pack("<I", 2) + golden[8:])
    with pytest.raises(ValueError) as e:
        PackedKernelArchive.read(bad_version)
    assert str(e.value) == "Unsupported format version: 2 (expected 1)"
    with pytest.raises(FileNotFoundError):
        PackedKernelArchive.read(tmp_path / "missing.kpack")


def rewrite_toc(golden: bytes, **changes) -> bytes:
    """The golden archive with TOC fields replaced (None removes one)."""
    import msgpack

    toc_offset = struct.unpack_from("<Q", golden, 8)[0]
    toc = msgpack.unpackb(golden[toc_offset:], raw=False)
    for k, v in changes.items():
        if v is None:
            toc.pop(k)
        else:
            toc[k] = v
    return golden[:toc_offset] + msgpack.packb(toc, use_bin_type=True)


def test_unknown_scheme(tmp_path):
    path = tmp_path / "lz4.kpack"
    path.write_bytes(rewrite_toc((FIXTURES / "test_noop.kpack").read_bytes(), compression_scheme="lz4"))
    with pytest.raises(ValueError) as e:
        PackedKernelArchive.read(path)
    assert str(e.value) == "Unknown compression scheme: lz4"
    with pytest.raises(ValueError) as e:
        create_compressor_from_toc({"compression_scheme": "lz4"}, path)
    assert str(e.value) == "Unknown compression scheme: lz4"
    # A missing scheme means "none".
    path.write_bytes(rewrite_toc((FIXTURES / "test_noop.kpack").read_bytes(), compression_scheme=None))
    archive = PackedKernelArchive.read(path)
    assert type(archive._compressor) is NoOpCompressor
    assert archive.get_kernel(*NOOP_KERNELS[1][:2]) == NOOP_KERNELS[1][2]


def test_compressors_directly(tmp_path):
    kernels = [b"a" * 100, b"", b"xyz" * 1000]
    zstd = ZstdCompressor(compression_level=3)
    inputs = [(f"k{i}", zstd.prepare_kernel(d, f"k{i}")) for i, d in enumerate(kernels)]
    for (kid, inp), data in zip(inputs, kernels):
        assert type(inp) is ZstdCompressionInput
        assert inp.kernel_id == kid
        assert inp.original_size == len(data)
        assert inp.compressed_frame[:4] == b"\x28\xb5\x2f\xfd"
    blob, meta = zstd.finalize(inputs)
    assert meta == {"zstd_offset": 0, "zstd_size": len(blob)}
    assert struct.unpack_from("<I", blob)[0] == 3
    frame0 = inputs[0][1].compressed_frame
    assert blob[4:8] == struct.pack("<I", len(frame0)) and blob[8:8 + len(frame0)] == frame0

    noop = NoOpCompressor()
    ninputs = [(f"k{i}", noop.prepare_kernel(d, f"k{i}")) for i, d in enumerate(kernels)]
    nblob, nmeta = noop.finalize(ninputs)
    assert nblob == b"".join(kernels)
    assert nmeta == {"blobs": [{"offset": 0, "size": 100}, {"offset": 100, "size": 0},
                               {"offset": 100, "size": 3000}]}

    for compressor in (ZstdCompressor(), NoOpCompressor()):
        with pytest.raises(RuntimeError) as e:
            compressor.decompress_kernel(0)
        assert str(e.value) == "Compressor not initialized from TOC"

    golden_noop = FIXTURES / "test_noop.kpack"
    archive = PackedKernelArchive.read(golden_noop)
    from_toc = NoOpCompressor.from_toc(
        {"blobs": [{"offset": 64, "size": 119}, {"offset": 183, "size": 219}, {"offset": 402, "size": 168}]},
        golden_noop,
    )
    assert from_toc.decompress_kernel(2) == NOOP_KERNELS[2][2]
    for bad in (3, -1):
        with pytest.raises(ValueError) as e:
            from_toc.decompress_kernel(bad)
        assert str(e.value) == f"Ordinal {bad} out of range (0..2)"
    assert archive._compressor.decompress_kernel(0) == NOOP_KERNELS[0][2]

    golden_zstd = FIXTURES / "test_zstd.kpack"
    zc = create_compressor_from_toc(
        {"compression_scheme": "zstd-per-kernel", "zstd_offset": 64, "zstd_size": 134}, golden_zstd
    )
    assert type(zc) is ZstdCompressor
    assert zc._zstd_offset == 64 and zc._zstd_size == 134
    assert [zc.decompress_kernel(i) for i in range(3)] == [k[2] for k in ZSTD_KERNELS]
    for bad in (3, -1):
        with pytest.raises(ValueError) as e:
            zc.decompress_kernel(bad)
        assert str(e.value) == f"Ordinal {bad} out of range (0..2)"


def test_spooled_inputs_still_show_their_bytes():
    for compressor in (ZstdCompressor(), NoOpCompressor()):
        archive = PackedKernelArchive("g", "f", ["gfx900"], compressor=compressor)
        prepared = archive.prepare_kernel("k", "gfx900", b"kernel bytes" * 50)
        before = (prepared.compression_input.compressed_frame if isinstance(compressor, ZstdCompressor)
                  else prepared.compression_input.data)
        archive.add_kernel(prepared)
        after = (prepared.compression_input.compressed_frame if isinstance(compressor, ZstdCompressor)
                 else prepared.compression_input.data)
        assert after == before


def test_additions_iteration_verify_digests(tmp_path):
    archive = build(ZSTD_KERNELS, ZstdCompressor(), digests=True)
    out = tmp_path / "d.kpack"
    archive.write(out)
    read = PackedKernelArchive.read(out)
    assert read.has_digests
    assert list(read) == [(k, a) for k, a, _ in ZSTD_KERNELS]
    assert read.kernel_count() == 3
    assert bool(PackedKernelArchive("g", "f", []))
    assert list(read.items()) == ZSTD_KERNELS
    assert read.verify() == 3
    entry = read.toc["lib/libhip.so#0"]["gfx1100"]
    assert list(entry["metadata"]) == ["frame", "blake3", "frame_blake3"]
    frame0 = ZstdCompressor().prepare_kernel(ZSTD_KERNELS[0][2], "k").compressed_frame
    assert entry["metadata"]["frame"] == [64 + 4, len(frame0)]
    assert len(entry["metadata"]["blake3"]) == 32 and len(entry["metadata"]["frame_blake3"]) == 32
    with pytest.raises(RuntimeError) as e:
        archive.verify()
    assert str(e.value) == "verify() needs an archive opened with read()"


def test_level_out_of_range_is_a_value_error():
    with pytest.raises(ValueError) as e:
        ZstdCompressor(compression_level=23).prepare_kernel(b"x", "k")
    assert str(e.value) == "zstd level 23 is outside 1..=22"


def test_digests_need_a_builtin_compressor():
    class Mine(NoOpCompressor):
        pass

    with pytest.raises(ValueError) as e:
        PackedKernelArchive("g", "f", [], compressor=Mine(), digests=True)
    assert str(e.value) == "digests=True needs NoOpCompressor or ZstdCompressor"
    assert c.COMPRESSION_SCHEMES is COMPRESSION_SCHEMES


def test_inputs_of_another_scheme_and_late_adds_are_refused():
    zstd_archive = PackedKernelArchive("g", "f", ["gfx900"], compressor=ZstdCompressor())
    noop_prepared = PackedKernelArchive("g", "f", ["gfx900"]).prepare_kernel("k", "gfx900", b"x")
    with pytest.raises(TypeError) as e:
        zstd_archive.add_kernel(noop_prepared)
    assert str(e.value) == (
        "k@gfx900: a NoOpCompressionInput cannot be added to an archive using ZstdCompressor"
    )
    assert zstd_archive.toc == {}
    zstd_archive.finalize_archive()
    with pytest.raises(RuntimeError) as e:
        zstd_archive.add_kernel(zstd_archive.prepare_kernel("k", "gfx900", b"x"))
    assert str(e.value) == "Cannot add_kernel() after finalize_archive()"
    assert zstd_archive.toc == {}
