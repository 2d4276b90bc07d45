"""Importing this module makes `rocm_kpack.kpack` and `rocm_kpack.compression` resolve to
`kpack_fuse.kpack` and `kpack_fuse.compression` for the rest of the process.

The two names are bound in `sys.modules` before anything imports them, so `import
rocm_kpack.kpack`, `from rocm_kpack.kpack import PackedKernelArchive` and the package's own
relative imports (`from .kpack import ...`) all get these modules. Other modules of an installed
`rocm_kpack` package stay importable as they are; when none is installed, `rocm_kpack` is an empty
package holding just the two.

The same happens at interpreter start-up when `KPACK_FUSE_AS_ROCM_KPACK` is set to a value not
starting with "0" (the wheel installs a `.pth` hook that checks it).
"""

import importlib
import importlib.util
import sys
import types

from . import compression, kpack

_ALIASES = {"rocm_kpack.kpack": kpack, "rocm_kpack.compression": compression}


def install() -> None:
    """Binds the aliases (again, if something replaced them)."""
    sys.modules.update(_ALIASES)
    package = sys.modules.get("rocm_kpack")
    if package is None:
        try:
            spec = importlib.util.find_spec("rocm_kpack")
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            package = importlib.import_module("rocm_kpack")
        else:
            package = types.ModuleType("rocm_kpack")
            package.__path__ = []
            package.__doc__ = "kpack_fuse standing in for the reference's rocm_kpack package."
            sys.modules["rocm_kpack"] = package
    package.kpack = kpack
    package.compression = compression

install()
