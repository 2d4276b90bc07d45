"""kpack-fuse for Python: ROCm's kpack archive API (`kpack_fuse.kpack`,
`kpack_fuse.compression`) on the kpack-fuse Rust core.

`import kpack_fuse.as_rocm_kpack` (or `KPACK_FUSE_AS_ROCM_KPACK=1` in the environment) makes the
reference's modules `rocm_kpack.kpack` and `rocm_kpack.compression` resolve to these, so tools
written against the reference run unchanged. See docs/python.md.
"""

__version__ = "0.1.0"
