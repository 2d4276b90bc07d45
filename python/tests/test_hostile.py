"""Hostile archives: a ValueError with a clear message (never a Rust panic or a hang)."""

import struct

import msgpack
import pytest

from kpack_fuse.kpack import PackedKernelArchive

from conftest import FIXTURES, NOOP_KERNELS, ZSTD_KERNELS

NOOP = (FIXTURES / "test_noop.kpack").read_bytes()
ZSTD = (FIXTURES / "test_zstd.kpack").read_bytes()


def toc_of(golden):
    off = struct.unpack_from("<Q", golden, 8)[0]
    return off, msgpack.unpackb(golden[off:], raw=False)


def with_toc(golden, toc):
    off, _ = toc_of(golden)
    return golden[:off] + msgpack.packb(toc, use_bin_type=True)


def edit(golden, fn):
    _, toc = toc_of(golden)
    fn(toc)
    return with_toc(golden, toc)


def read_fails(tmp_path, data, message_part, *, at_get=None):
    path = tmp_path / "hostile.kpack"
    path.write_bytes(data)
    with pytest.raises(ValueError) as e:
        archive = PackedKernelArchive.read(path)
        if at_get is not None:
            archive.get_kernel(*at_get)
    assert message_part in str(e.value), str(e.value)
    assert type(e.value) is ValueError or isinstance(e.value, ValueError)
    return str(e.value)


def test_truncated_and_bad_headers(tmp_path):
    assert read_fails(tmp_path, b"", "Truncated header") == "Truncated header: 0 bytes (expected 16)"
    read_fails(tmp_path, NOOP[:15], "Truncated header: 15 bytes")
    read_fails(tmp_path, b"kpak" + NOOP[4:], "Invalid magic number: b'kpak'")
    read_fails(tmp_path, NOOP[:4] + struct.pack("<I", 0) + NOOP[8:], "Unsupported format version: 0")


def test_toc_offset_and_toc_bytes(tmp_path):
    read_fails(tmp_path, NOOP[:8] + struct.pack("<Q", len(NOOP)) + NOOP[16:],
               f"Invalid TOC offset: {len(NOOP)} is not inside the file")
    read_fails(tmp_path, NOOP[:8] + struct.pack("<Q", 1 << 63) + NOOP[16:], "Invalid TOC offset")
    off, _ = toc_of(NOOP)
    read_fails(tmp_path, NOOP[:-3], "Invalid TOC")
    read_fails(tmp_path, NOOP[:off] + b"\x93\x01\x02\x03", "Invalid TOC: a array instead of a map")
    # Declared lengths past the bytes present are refused, not allocated.
    for five in (b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff"):
        read_fails(tmp_path, NOOP[:off] + five, "Invalid TOC")
    read_fails(tmp_path, NOOP[:off] + b"\x81\xa1a\xc7\x01\x05x", "extension")
    read_fails(tmp_path, NOOP[:off] + b"\x81\x01\x02", "only str and bytes keys")
    read_fails(tmp_path, NOOP[:off] + b"\x81\xa3toc\xa2\xff\xfe", "not valid UTF-8")


def test_missing_fields(tmp_path):
    for field in ("group_name", "gfx_arch_family", "gfx_arches"):
        msg = read_fails(tmp_path, edit(NOOP, lambda t: t.pop(field)), "Invalid TOC")
        assert msg == f"Invalid TOC: no {field!r} field"
    assert read_fails(tmp_path, edit(NOOP, lambda t: t.pop("toc")), "") == "Invalid TOC: no 'toc' map"
    assert read_fails(tmp_path, edit(NOOP, lambda t: t.update(toc=[1])), "") == "Invalid TOC: no 'toc' map"
    assert read_fails(tmp_path, edit(NOOP, lambda t: t.pop("blobs")), "") == (
        "Invalid TOC: scheme 'none' needs a 'blobs' list")
    assert read_fails(tmp_path, edit(ZSTD, lambda t: t.pop("zstd_size")), "") == (
        "Invalid TOC: scheme 'zstd-per-kernel' needs an integer 'zstd_size'")
    read_fails(tmp_path, edit(NOOP, lambda t: t.update(compression_scheme=[1])), "Unknown compression scheme: [1]")


def test_bad_entries(tmp_path):
    def bad_ordinal(value):
        def f(t):
            t["toc"]["lib/libtest.so#0"]["gfx900"]["ordinal"] = value
        return f
    for value in ("x", -1, 1 << 32, 1.5):
        read_fails(tmp_path, edit(NOOP, bad_ordinal(value)), "ordinal")


def test_noop_blob_past_the_end(tmp_path):
    data = edit(NOOP, lambda t: t["blobs"][1].update(offset=10_000))
    msg = read_fails(tmp_path, data, "claims bytes", at_get=("lib/libtest.so#0", "gfx906"))
    assert "10000..10219 but the file has" in msg
    # The other kernels still read.
    path = tmp_path / "hostile.kpack"
    assert PackedKernelArchive.read(path).get_kernel(*NOOP_KERNELS[0][:2]) == NOOP_KERNELS[0][2]


def test_zstd_structure(tmp_path):
    # Frame count larger than the frames present.
    data = bytearray(ZSTD)
    data[64:68] = struct.pack("<I", 4)
    read_fails(tmp_path, bytes(data), "zstd")
    # Frame size past the blob.
    data = bytearray(ZSTD)
    data[68:72] = struct.pack("<I", 10_000)
    read_fails(tmp_path, bytes(data), "zstd")
    read_fails(tmp_path, edit(ZSTD, lambda t: t.update(zstd_size=3)), "zstd")
    read_fails(tmp_path, edit(ZSTD, lambda t: t.update(zstd_size=1 << 40)), "")


def test_corrupt_frame_and_wrong_size(tmp_path):
    data = bytearray(ZSTD)
    data[80] ^= 0xFF
    msg = read_fails(tmp_path, bytes(data), "failed to decode", at_get=ZSTD_KERNELS[0][:2])
    assert "lib/libhip.so#0" in msg
    data = edit(ZSTD, lambda t: t["toc"]["bin/hiptest#0"]["gfx1100"].update(original_size=1 << 40))
    read_fails(tmp_path, data, "", at_get=ZSTD_KERNELS[2][:2])
    # Through the dict and the compressor too.
    path = tmp_path / "hostile.kpack"
    archive = PackedKernelArchive.read(path)
    assert archive.toc["bin/hiptest#0"]["gfx1100"]["original_size"] == 1 << 40
    with pytest.raises(ValueError):
        archive.get_kernel(*ZSTD_KERNELS[2][:2])


def test_digest_mismatch(tmp_path):
    from kpack_fuse.compression import ZstdCompressor

    archive = PackedKernelArchive("g", "f", ["gfx1100"], compressor=ZstdCompressor(), digests=True)
    for key, arch, data in ZSTD_KERNELS:
        archive.add_kernel(archive.prepare_kernel(key, arch, data))
    archive.finalize_archive()
    path = tmp_path / "d.kpack"
    archive.write(path)
    data = bytearray(path.read_bytes())
    data[80] ^= 0x01
    path.write_bytes(bytes(data))
    read = PackedKernelArchive.read(path)
    with pytest.raises(ValueError) as e:
        read.get_kernel(*ZSTD_KERNELS[0][:2])
    assert "BLAKE3 digest mismatch" in str(e.value)
    with pytest.raises(ValueError) as e:
        read.verify()
    assert "BLAKE3 digest mismatch" in str(e.value)
    assert read.get_kernel(*ZSTD_KERNELS[2][:2]) == ZSTD_KERNELS[2][2]


def test_fuzzed_bytes_never_escape_as_other_errors(tmp_path):
    import random

    rng = random.Random(1)
    path = tmp_path / "fuzz.kpack"
    for golden in (NOOP, ZSTD):
        for _ in range(300):
            data = bytearray(golden)
            for _ in range(rng.randrange(1, 6)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            if rng.random() < 0.2:
                del data[rng.randrange(len(data)):]
            path.write_bytes(bytes(data))
            try:
                archive = PackedKernelArchive.read(path)
                for key, arches in archive.toc.items():
                    if isinstance(key, str) and isinstance(arches, dict):
                        for arch in arches:
                            if isinstance(arch, str):
                                archive.get_kernel(key, arch)
            except ValueError:
                pass
