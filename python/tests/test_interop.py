"""Archives written through the API read by the C library and the command line, and the reverse."""

import ctypes
import json
import subprocess

import pytest

from kpack_fuse.compression import NoOpCompressor, ZstdCompressor
from kpack_fuse.kpack import PackedKernelArchive

from conftest import ZSTD_KERNELS

KERNELS = ZSTD_KERNELS + [
    ("lib/libhip.so#1", "gfx90a:xnack-", bytes(range(256)) * 40),
    ("bin\\win#0", "gfx1100", b""),
]
AS_STORED = [(k.replace("\\", "/"), a, d) for k, a, d in KERNELS]
ARCHES = ["gfx1100", "gfx1101", "gfx90a:xnack-"]


def write_api(path, compressor, digests=False, kernels=KERNELS):
    archive = PackedKernelArchive("group", "family", ARCHES, compressor=compressor, digests=digests)
    for key, arch, data in kernels:
        archive.add_kernel(archive.prepare_kernel(key, arch, data))
    archive.finalize_archive()
    archive.write(path)


class CLib:
    """The 14-function C library through ctypes: open, list and get, as a C caller does."""

    def __init__(self, path):
        lib = ctypes.CDLL(str(path))
        lib.kpack_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.kpack_close.argtypes = [ctypes.c_void_p]
        lib.kpack_get_kernel.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
            ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
        ]
        lib.kpack_free_kernel.argtypes = [ctypes.c_void_p]
        lib.kpack_get_architecture_count.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        lib.kpack_get_architecture.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p)]
        self.lib = lib

    def read_all(self, path, wanted):
        h = ctypes.c_void_p()
        assert self.lib.kpack_open(str(path).encode(), ctypes.byref(h)) == 0
        try:
            n = ctypes.c_size_t()
            assert self.lib.kpack_get_architecture_count(h, ctypes.byref(n)) == 0
            arches = []
            for i in range(n.value):
                s = ctypes.c_char_p()
                assert self.lib.kpack_get_architecture(h, i, ctypes.byref(s)) == 0
                arches.append(s.value.decode())
            got = []
            for key, arch in wanted:
                data, size = ctypes.c_void_p(), ctypes.c_size_t()
                rc = self.lib.kpack_get_kernel(h, key.encode(), arch.encode(),
                                               ctypes.byref(data), ctypes.byref(size))
                assert rc == 0, (key, arch, rc)
                got.append((key, arch, ctypes.string_at(data, size.value) if size.value else b""))
                self.lib.kpack_free_kernel(data)
            # A missing kernel is KPACK_ERROR_KERNEL_NOT_FOUND (5).
            data, size = ctypes.c_void_p(), ctypes.c_size_t()
            assert self.lib.kpack_get_kernel(h, b"nope", b"gfx1100", ctypes.byref(data),
                                             ctypes.byref(size)) == 5
            return arches, got
        finally:
            self.lib.kpack_close(h)


@pytest.mark.parametrize("make", [ZstdCompressor, NoOpCompressor])
@pytest.mark.parametrize("digests", [False, True])
def test_api_archive_read_by_c_library_and_cli(tmp_path, kpack_bin, kpack_lib, make, digests):
    path = tmp_path / "api.kpack"
    write_api(path, make(), digests)
    arches, got = CLib(kpack_lib).read_all(path, [(k, a) for k, a, _ in AS_STORED])
    assert arches == ARCHES
    assert got == AS_STORED
    listed = json.loads(subprocess.run([kpack_bin, "list", "--json", path], check=True,
                                       capture_output=True, text=True).stdout)
    assert listed["scheme"] == make.SCHEME_NAME
    assert listed["group_name"] == "group" and listed["gfx_arch_family"] == "family"
    assert listed["gfx_arches"] == ARCHES
    rows = sorted((k["binary"], k["arch"], k["ordinal"], k["size"]) for k in listed["kernels"])
    assert rows == sorted((k, a, i, len(d)) for i, (k, a, d) in enumerate(AS_STORED))
    assert all((k["blake3"] is not None) == digests for k in listed["kernels"])
    verify = subprocess.run([kpack_bin, "verify", path], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    subprocess.run([kpack_bin, "extract", path, tmp_path / "out"], check=True)
    for key, arch, data in AS_STORED:
        assert (tmp_path / "out" / key / f"{arch}.hsaco").read_bytes() == data


def manifest(tmp_path, kernels):
    lines = []
    for i, (key, arch, data) in enumerate(kernels):
        (tmp_path / f"k{i}").write_bytes(data)
        lines.append(f"{key}\t{arch}\tk{i}")
    m = tmp_path / "manifest.txt"
    m.write_text("\n".join(lines) + "\n")
    return m


@pytest.mark.parametrize("scheme,make", [("zstd", ZstdCompressor), ("none", NoOpCompressor)])
@pytest.mark.parametrize("digests", [False, True])
def test_cli_pack_equals_api_and_reads_through_it(tmp_path, kpack_bin, scheme, make, digests):
    m = manifest(tmp_path, AS_STORED)
    cli = tmp_path / "cli.kpack"
    args = [kpack_bin, "pack", "--manifest", m, "-o", cli, "--compression", scheme,
            "--group", "group", "--family", "family"]
    for a in ARCHES:
        args += ["--arch", a]
    if not digests:
        args.append("--reference-layout")
    subprocess.run(args, check=True, capture_output=True)
    api = tmp_path / "api.kpack"
    write_api(api, make(), digests)
    assert api.read_bytes() == cli.read_bytes()
    read = PackedKernelArchive.read(cli)
    assert [(k, a, read.get_kernel(k, a)) for k, a, _ in AS_STORED] == AS_STORED
    assert read.verify() == len(AS_STORED)
    assert read.has_digests == digests
