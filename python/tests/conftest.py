"""Shared fixtures: where the repository, the golden archives, the `kpack-fuse` program and the
C library are. scripts/test-python.sh sets KPACK_FUSE_BIN and KPACK_FUSE_LIB to the debug build."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"

# The golden archives' kernels (tests/fixtures/README: the reference writer's test assets).
NOOP_KERNELS = [
    ("lib/libtest.so#0", "gfx900", b"KERNEL1_GFX900_DATA" + b"\0" * 100),
    ("lib/libtest.so#0", "gfx906", b"KERNEL2_GFX906_DATA" + b"\0" * 200),
    ("bin/testapp#0", "gfx900", b"KERNEL3_APP_GFX900" + b"\xff" * 150),
]
ZSTD_KERNELS = [
    ("lib/libhip.so#0", "gfx1100", b"HIP_KERNEL_GFX1100_" + b"A" * 500 + b"B" * 500),
    ("lib/libhip.so#0", "gfx1101", b"HIP_KERNEL_GFX1101_" + b"X" * 300 + b"Y" * 300),
    ("bin/hiptest#0", "gfx1100", b"TEST_APP_KERNEL___" + b"\x42" * 1000),
]


def _built(env: str, default: str) -> Path:
    path = Path(os.environ.get(env, REPO / "target" / "debug" / default))
    if not path.exists():
        pytest.fail(f"{path} does not exist: build the repository first (cargo build), or set {env}")
    return path


@pytest.fixture(scope="session")
def kpack_bin() -> Path:
    return _built("KPACK_FUSE_BIN", "kpack-fuse")


@pytest.fixture(scope="session")
def kpack_lib() -> Path:
    return _built("KPACK_FUSE_LIB", "librocm_kpack.so")
