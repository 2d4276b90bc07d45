"""The code blocks of docs/python.md run as they stand (doc_blocks.py says how they are found):
the examples here, against the installed package; the install commands in
scripts/test-python.sh, which builds the wheel, installs it and installs from source with them."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kpack_fuse.kpack import PackedKernelArchive

import doc_blocks
from conftest import REPO

# Blocks run by scripts/test-python.sh (by name: `doc_block NAME` or `install_and_test NAME`).
RUN_BY_SCRIPT = ("build-wheel", "install-wheel", "install-source")
# Blocks that are the expected output of another.
OUTPUTS = ("use-output",)
# Blocks run here.
RUN_HERE = ("use", "switch-env", "switch-import")
# Unmarked blocks no test runs, by their first line, and why.
NOT_RUN = {
    # The benchmark: it runs this whole test script, then downloads rocSPARSE's kernels.
    "scripts/test-python.sh    # once, for the venv with the wheel",
}


def run_python(code, cwd, env=None):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def clean_env():
    """This process's environment without the switch, with this interpreter's directory first
    on PATH, so that a documented `python3` is the one the package is installed in."""
    env = {k: v for k, v in os.environ.items() if k != "KPACK_FUSE_AS_ROCM_KPACK"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_every_block_is_run():
    script = (REPO / "scripts" / "test-python.sh").read_text()
    unrun = []
    for b in doc_blocks.blocks():
        if b.name is None:
            if b.first_line() not in NOT_RUN:
                unrun.append(f"line {b.line}: unmarked block: {b.first_line()}")
        elif b.name in RUN_BY_SCRIPT:
            if not re.search(rf"^\s*(doc_block|install_and_test) {b.name}\b", script, re.M):
                unrun.append(f"line {b.line}: '{b.name}' is not run by scripts/test-python.sh")
        elif b.name not in RUN_HERE + OUTPUTS:
            unrun.append(f"line {b.line}: '{b.name}' is run by no test")
    assert unrun == []


def test_every_named_block_is_there():
    names = {b.name for b in doc_blocks.blocks()}
    assert set(RUN_BY_SCRIPT + OUTPUTS + RUN_HERE) - names == set()


def test_use_example_prints_what_the_document_shows(tmp_path):
    # From a directory of its own that has the repository's samples/, as the repository root has.
    (tmp_path / "samples").symlink_to(REPO / "samples")
    result = run_python(doc_blocks.block("use"), tmp_path, clean_env())
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout == doc_blocks.block("use-output")
    # The archive it wrote holds the sample's code objects, byte for byte.
    sample = PackedKernelArchive.read(REPO / "samples" / "rocrand-sample.kpack")
    written = PackedKernelArchive.read(tmp_path / "rocrand-gfx1030-gfx90a.kpack")
    assert list(written.items()) == list(sample.items())
    assert written.verify() == 3


def test_switch_by_environment(tmp_path):
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", doc_blocks.block("switch-env")],
                            cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                            timeout=60)
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "kpack_fuse.kpack\n")


def test_switch_by_import(tmp_path):
    check = "assert PackedKernelArchive.__module__ == 'kpack_fuse.kpack', PackedKernelArchive\n"
    result = run_python(doc_blocks.block("switch-import") + check, tmp_path, clean_env())
    assert (result.returncode, result.stderr) == (0, "")


def test_doc_blocks_rejects_a_marker_without_its_block(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- test: lost -->\nsome prose\n\n```sh\ntrue\n```\n")
    with pytest.raises(ValueError, match=r"doc.md:1: marker 'lost' has no block"):
        doc_blocks.blocks(doc)


def test_doc_blocks_takes_off_a_list_items_indentation(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("- item:\n  <!-- test: one -->\n\n  ```sh\n  echo a\n    echo b\n  ```\n")
    assert doc_blocks.block("one", doc) == "echo a\n  echo b\n"
