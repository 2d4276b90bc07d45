"""The switch that makes the reference's module names resolve to ours, shown on a tool of the
reference tooling's shape (tests/tools/pack_tree_like.py imports only `rocm_kpack`)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kpack_fuse.compression import ZstdCompressor
from kpack_fuse.kpack import PackedKernelArchive

TOOL = Path(__file__).parent / "tools" / "pack_tree_like.py"

TREE = {
    "lib/librocfoo.so#0": {"gfx1100": b"A" * 3000, "gfx1101": b"B" * 2000, "gfx942": b"C" * 100},
    "bin/footest#0": {"gfx1100": b"D" * 777},
    "lib/librocfoo.so#1": {"gfx942:xnack+": bytes(range(200)) * 9},
}


def make_tree(root):
    for key, arches in TREE.items():
        for arch, data in arches.items():
            d = root / "tree" / key
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{arch}.hsaco").write_bytes(data)


def expected_archive(path, family, arches, items):
    archive = PackedKernelArchive("foo", family, arches, compressor=ZstdCompressor())
    for key, arch, data, name in items:
        archive.add_kernel(archive.prepare_kernel(key, arch, data, metadata={"source": name}))
    archive.finalize_archive()
    archive.write(path)
    return path.read_bytes()


def run(args, env_extra):
    env = {k: v for k, v in os.environ.items() if k != "KPACK_FUSE_AS_ROCM_KPACK"}
    env.update(env_extra)
    return subprocess.run(args, capture_output=True, text=True, env=env)


def check_outputs(tmp_path, result):
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "foo-gfx110X.kpack 3 kpack_fuse.kpack",
        "foo-gfx94X.kpack 2 kpack_fuse.kpack",
    ]
    items = sorted(
        (key, arch, data, f"{arch}.hsaco")
        for key, arches in TREE.items() for arch, data in arches.items()
        if arch.startswith("gfx110")
    )
    want = expected_archive(tmp_path / "want.kpack", "gfx110X", ["gfx1100", "gfx1101"], items)
    assert (tmp_path / "out" / "foo-gfx110X.kpack").read_bytes() == want


def test_without_the_switch_the_tool_cannot_import(tmp_path):
    make_tree(tmp_path)
    (tmp_path / "out").mkdir()
    result = run([sys.executable, TOOL, tmp_path / "tree", tmp_path / "out", "foo"], {})
    assert result.returncode == 1
    assert "ModuleNotFoundError: No module named 'rocm_kpack'" in result.stderr


def test_environment_switch(tmp_path):
    make_tree(tmp_path)
    (tmp_path / "out").mkdir()
    result = run([sys.executable, TOOL, tmp_path / "tree", tmp_path / "out", "foo"],
                 {"KPACK_FUSE_AS_ROCM_KPACK": "1"})
    check_outputs(tmp_path, result)


def test_one_line_switch(tmp_path):
    make_tree(tmp_path)
    (tmp_path / "out").mkdir()
    code = ("import kpack_fuse.as_rocm_kpack, runpy, sys; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    result = run([sys.executable, "-c", code, TOOL, tmp_path / "tree", tmp_path / "out", "foo"], {})
    check_outputs(tmp_path, result)


def test_switch_binds_the_modules_and_keeps_a_real_package(tmp_path):
    # An installed rocm_kpack with other modules: those stay importable, its own relative
    # imports of .kpack get ours.
    pkg = tmp_path / "site" / "rocm_kpack"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .kpack import PackedKernelArchive\n")
    (pkg / "kpack.py").write_text("raise RuntimeError('the reference module was imported')\n")
    (pkg / "binutils.py").write_text("NAME = 'binutils'\n")
    code = (
        "import kpack_fuse.as_rocm_kpack, kpack_fuse.kpack, kpack_fuse.compression, sys\n"
        "import rocm_kpack, rocm_kpack.kpack, rocm_kpack.compression, rocm_kpack.binutils\n"
        "from rocm_kpack.kpack import PackedKernelArchive\n"
        "assert rocm_kpack.kpack is kpack_fuse.kpack\n"
        "assert rocm_kpack.compression is kpack_fuse.compression\n"
        "assert rocm_kpack.PackedKernelArchive is PackedKernelArchive\n"
        "print(rocm_kpack.binutils.NAME, rocm_kpack.__file__.endswith('__init__.py'))\n"
    )
    result = run([sys.executable, "-c", code], {"PYTHONPATH": str(tmp_path / "site")})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "binutils True\n"
    for value in ("0", ""):
        result = run([sys.executable, "-c", "import rocm_kpack"],
                     {"KPACK_FUSE_AS_ROCM_KPACK": value})
        assert "No module named 'rocm_kpack'" in result.stderr
