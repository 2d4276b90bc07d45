"""Compressors for kpack archives: the reference's map/reduce interface and its two schemes.

`Compressor` is the interface a scheme implements: `prepare_kernel` (the map phase, called from
several threads at once), `finalize` (the reduce phase: the blob and the TOC fields of the
scheme), `from_toc` (a compressor for reading an archive) and `decompress_kernel` (one kernel by
ordinal). `NoOpCompressor` ("none") stores kernels as they are; `ZstdCompressor`
("zstd-per-kernel") stores each as one zstd frame. Both do their work in the Rust core: the
frames are made with the GIL released, and a compressor made by `from_toc` reads one kernel at a
time with a positioned read instead of loading the whole blob.

A Python subclass of `Compressor` works through the same calls (`PackedKernelArchive` then uses
its `finalize` as the reference does).
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import _native

__all__ = [
    "COMPRESSION_SCHEMES",
    "CompressionInput",
    "Compressor",
    "NoOpCompressionInput",
    "NoOpCompressor",
    "ZstdCompressionInput",
    "ZstdCompressor",
    "create_compressor_from_toc",
]


def _as_bytes(data) -> bytes:
    """Kernel bytes as `bytes` (the native calls borrow a `bytes` object's buffer)."""
    return data if type(data) is bytes else bytes(data)


class CompressionInput:
    """What the map phase hands to the reduce phase; each scheme has its own subclass."""


class Compressor(ABC):
    """A storage scheme for kernels, used in two phases (map, then reduce) when writing and by
    ordinal when reading. `SCHEME_NAME` is what the TOC's `compression_scheme` records."""

    SCHEME_NAME: str = NotImplemented

    @abstractmethod
    def prepare_kernel(self, kernel_data: bytes, kernel_id: str) -> CompressionInput:
        """Map phase: prepares one kernel. Must be safe to call from several threads."""

    @abstractmethod
    def finalize(
        self, inputs: List[Tuple[str, CompressionInput]]
    ) -> Tuple[bytes, Dict[str, object]]:
        """Reduce phase: the blob and the scheme's TOC fields, from every `(kernel_id, input)`
        in ordinal order."""

    @staticmethod
    @abstractmethod
    def from_toc(toc_data: Dict[str, object], file_path: Path) -> "Compressor":
        """A compressor that reads the archive at `file_path`, whose TOC is `toc_data`."""

    @abstractmethod
    def decompress_kernel(self, ordinal: int) -> bytes:
        """The kernel stored under `ordinal`."""


class _Spooled:
    """Where a kernel's stored bytes went once its archive spooled them: a spool (the archive's
    temporary file), an offset and a size. The input then reads them back when asked."""

    __slots__ = ("spool", "offset", "size")

    def __init__(self, spool, offset: int, size: int):
        self.spool = spool
        self.offset = offset
        self.size = size

    def load(self) -> bytes:
        return self.spool.read(self.offset, self.size)


class _SpoolableBytes:
    """A bytes attribute of a prepared kernel that an archive may move to its spool file (it then
    sets the slot to None and `_spooled`): reading loads it back, assigning replaces it."""

    def __init__(self, slot: str):
        self.slot = slot

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        value = getattr(obj, self.slot)
        if value is None and obj._spooled is not None:
            return obj._spooled.load()
        return value

    def __set__(self, obj, value: bytes) -> None:
        setattr(obj, self.slot, value)
        obj._spooled = None


class NoOpCompressionInput(CompressionInput):
    """A kernel stored as it is (`data`)."""

    _digests = None

    data = _SpoolableBytes("_data")

    def __init__(self, data: bytes):
        self.data = data


class NoOpCompressor(Compressor):
    """Scheme "none": kernels stored back to back, located by the TOC's `blobs` list."""

    SCHEME_NAME = "none"

    def __init__(self):
        self._file_path: Optional[Path] = None
        self._blobs: Optional[list] = None
        self._reader = None

    def prepare_kernel(self, kernel_data: bytes, kernel_id: str) -> CompressionInput:
        return NoOpCompressionInput(data=kernel_data)

    def _prepare(self, kernel_data, kernel_id: str, digests: bool) -> CompressionInput:
        prepared = NoOpCompressionInput(data=kernel_data)
        if digests:
            prepared._digests = (_native.blake3_digest(_as_bytes(kernel_data)), None)
        return prepared

    def finalize(
        self, inputs: List[Tuple[str, CompressionInput]]
    ) -> Tuple[bytes, Dict[str, object]]:
        parts = []
        blobs = []
        offset = 0
        for kernel_id, prepared in inputs:
            if not isinstance(prepared, NoOpCompressionInput):
                raise TypeError(
                    f"{kernel_id}: NoOpCompressor cannot finalize a {type(prepared).__name__}"
                )
            data = prepared.data
            parts.append(data)
            blobs.append({"offset": offset, "size": len(data)})
            offset += len(data)
        return b"".join(parts), {"blobs": blobs}

    @staticmethod
    def from_toc(toc_data: Dict[str, object], file_path: Path) -> "NoOpCompressor":
        blobs = toc_data.get("blobs")
        if not isinstance(blobs, list):
            raise ValueError("Invalid TOC: scheme 'none' needs a 'blobs' list")
        compressor = NoOpCompressor()
        compressor._file_path = Path(file_path)
        compressor._blobs = blobs
        return compressor

    def _open_reader(self):
        if self._reader is None:
            self._reader = _native.Reader(self._file_path)
        return self._reader

    def decompress_kernel(self, ordinal: int) -> bytes:
        if self._blobs is None or self._file_path is None:
            raise RuntimeError("Compressor not initialized from TOC")
        if ordinal < 0 or ordinal >= len(self._blobs):
            raise ValueError(f"Ordinal {ordinal} out of range (0..{len(self._blobs)-1})")
        return self._open_reader().get_ordinal(ordinal)


class ZstdCompressionInput(CompressionInput):
    """A kernel compressed to one zstd frame (`compressed_frame`) of `original_size` bytes."""

    _digests = None
    compressed_frame = _SpoolableBytes("_frame")

    def __init__(self, kernel_id: str, compressed_frame: bytes, original_size: int):
        self.kernel_id = kernel_id
        self.compressed_frame = compressed_frame
        self.original_size = original_size


class ZstdCompressor(Compressor):
    """Scheme "zstd-per-kernel": one zstd frame per kernel (content size recorded, no checksum),
    in a blob of a `u32` frame count and, per frame, a `u32` size and the frame (little-endian).
    Levels 1 to 22."""

    SCHEME_NAME = "zstd-per-kernel"

    def __init__(self, compression_level: int = 3):
        self.compression_level = compression_level
        self._file_path: Optional[Path] = None
        self._zstd_offset: Optional[int] = None
        self._zstd_size: Optional[int] = None
        self._reader = None

    def prepare_kernel(self, kernel_data: bytes, kernel_id: str) -> CompressionInput:
        return self._prepare(kernel_data, kernel_id, False)

    def _prepare(self, kernel_data, kernel_id: str, digests: bool) -> CompressionInput:
        data = _as_bytes(kernel_data)
        frame, kernel_digest, frame_digest = _native.zstd_frame(
            data, self.compression_level, digests
        )
        prepared = ZstdCompressionInput(
            kernel_id=kernel_id, compressed_frame=frame, original_size=len(data)
        )
        if digests:
            prepared._digests = (kernel_digest, frame_digest)
        return prepared

    def finalize(
        self, inputs: List[Tuple[str, CompressionInput]]
    ) -> Tuple[bytes, Dict[str, object]]:
        parts = [struct.pack("<I", len(inputs))]
        for kernel_id, prepared in inputs:
            if not isinstance(prepared, ZstdCompressionInput):
                raise TypeError(
                    f"{kernel_id}: ZstdCompressor cannot finalize a {type(prepared).__name__}"
                )
            frame = prepared.compressed_frame
            parts.append(struct.pack("<I", len(frame)))
            parts.append(frame)
        blob = b"".join(parts)
        return blob, {"zstd_offset": 0, "zstd_size": len(blob)}

    @staticmethod
    def from_toc(toc_data: Dict[str, object], file_path: Path) -> "ZstdCompressor":
        for field in ("zstd_offset", "zstd_size"):
            if not isinstance(toc_data.get(field), int):
                raise ValueError(f"Invalid TOC: scheme 'zstd-per-kernel' needs an integer {field!r}")
        compressor = ZstdCompressor()
        compressor._file_path = Path(file_path)
        compressor._zstd_offset = toc_data["zstd_offset"]
        compressor._zstd_size = toc_data["zstd_size"]
        return compressor

    def _open_reader(self):
        if self._reader is None:
            self._reader = _native.Reader(self._file_path)
        return self._reader

    def decompress_kernel(self, ordinal: int) -> bytes:
        if self._zstd_offset is None or self._file_path is None:
            raise RuntimeError("Compressor not initialized from TOC")
        return self._open_reader().get_ordinal(ordinal)


COMPRESSION_SCHEMES = {
    NoOpCompressor.SCHEME_NAME: NoOpCompressor,
    ZstdCompressor.SCHEME_NAME: ZstdCompressor,
}


def create_compressor_from_toc(toc_data: Dict[str, object], file_path: Path) -> Compressor:
    """The compressor for an archive's scheme (`compression_scheme`, "none" when absent), made
    by that scheme's `from_toc`. `ValueError` for a scheme not in `COMPRESSION_SCHEMES`."""
    scheme = toc_data.get("compression_scheme", "none")
    try:
        known = scheme in COMPRESSION_SCHEMES
    except TypeError:
        known = False
    if not known:
        raise ValueError(f"Unknown compression scheme: {scheme}")
    return COMPRESSION_SCHEMES[scheme].from_toc(toc_data, file_path)
