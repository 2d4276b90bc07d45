"""`PackedKernelArchive`: building and reading `.kpack` archives with the reference's API.

Writing follows the reference's calls and writes its bytes: `prepare_kernel` (the map phase, safe
from several threads; the built-in compressors release the GIL while they work), `add_kernel` in
ordinal order, `finalize_archive`, `write`. With the built-in compressors each stored kernel is
moved to a temporary file as it is added, and `write` copies it from there, so the kernels are
never all in memory. `digests=True` also records each kernel's frame position and BLAKE3 digests
(the layout of `kpack-fuse pack`, checked by every reader of this project).

Reading (`read`) opens the archive as the C library does: the header and TOC only. The `toc`
dict is built when first used, and each kernel is read with one positioned read of its blob or
frame and checked against the digests the archive records.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import _native
from .compression import (
    CompressionInput,
    Compressor,
    NoOpCompressionInput,
    NoOpCompressor,
    ZstdCompressionInput,
    ZstdCompressor,
    _Spooled,
    create_compressor_from_toc,
)

__all__ = ["PackedKernelArchive", "PreparedKernel"]

# The compressors whose kernels an archive spools and writes itself (their `finalize` is then
# not called), and the input type each makes.
_NATIVE_INPUTS = {NoOpCompressor: NoOpCompressionInput, ZstdCompressor: ZstdCompressionInput}


@dataclass
class PreparedKernel:
    """One kernel after the map phase (`prepare_kernel`), ready for `add_kernel`."""

    relative_path: str
    gfx_arch: str
    compression_input: CompressionInput
    kernel_id: str
    original_size: int
    metadata: Optional[Dict[str, Any]] = None


class PackedKernelArchive:
    """The kernels of one architecture family: built in memory and written with `write`, or
    read from a file with `read`. `toc` maps binary path -> arch -> entry."""

    MAGIC = b"KPAK"
    FORMAT_VERSION = 1
    HEADER_SIZE = 16
    BLOB_ALIGNMENT = 64

    def __init__(
        self,
        group_name: str,
        gfx_arch_family: str,
        gfx_arches: List[str],
        output_path: Optional[Path] = None,
        compressor: Optional[Compressor] = None,
        *,
        digests: bool = False,
    ):
        self.group_name = group_name
        self.gfx_arch_family = gfx_arch_family
        self.gfx_arches = gfx_arches
        self._toc: Optional[Dict[str, Dict[str, Dict[str, Any]]]] = {}
        self._file_path: Optional[Path] = None
        if compressor is None:
            compressor = NoOpCompressor()
        self._compressor: Compressor = compressor
        self._compression_inputs: List[Tuple[str, CompressionInput]] = []
        self._compressed_blob: Optional[bytes] = None
        self._compression_metadata: Optional[Dict[str, Any]] = None
        self._archive_finalized = False
        self._kernel_ordinal_counter = 0
        # Built-in compressors: kernels go to a spool as they are added.
        self._native_input = _NATIVE_INPUTS.get(type(compressor))
        self._spool = None
        self._blob_spans: List[Tuple[int, int]] = []
        self._digests = bool(digests)
        # Read mode: the TOC as read (converted to `toc` when first used) and the open archive.
        self._toc_source = None
        self._reader = None
        if output_path is not None:
            raise ValueError(
                "Streaming write mode not yet supported. "
                "Use in-memory mode (output_path=None) and call write(path) when done."
            )
        if self._digests and self._native_input is None:
            raise ValueError("digests=True needs NoOpCompressor or ZstdCompressor")

    @property
    def toc(self) -> Dict[str, Dict[str, Dict[str, Any]]]:
        if self._toc is None:
            self._toc = self._toc_source.toc()
        return self._toc

    @toc.setter
    def toc(self, value: Dict[str, Dict[str, Dict[str, Any]]]) -> None:
        self._toc = value

    def prepare_kernel(
        self,
        relative_path: str,
        gfx_arch: str,
        hsaco_data: bytes,
        metadata: Optional[Dict[str, Any]] = None,
    ) -> PreparedKernel:
        """The map phase for one kernel (safe to call from several threads): its path with
        backslashes made `/`, its id `path@arch`, and the compressor's prepared input."""
        relative_path = relative_path.replace("\\", "/")
        kernel_id = f"{relative_path}@{gfx_arch}"
        if self._digests:
            prepared = self._compressor._prepare(hsaco_data, kernel_id, True)
        else:
            prepared = self._compressor.prepare_kernel(hsaco_data, kernel_id)
        return PreparedKernel(
            relative_path=relative_path,
            gfx_arch=gfx_arch,
            compression_input=prepared,
            kernel_id=kernel_id,
            original_size=len(hsaco_data),
            metadata=metadata,
        )

    def add_kernel(self, prepared: PreparedKernel) -> None:
        """Adds a prepared kernel under the next ordinal. `ValueError` when the archive already
        has a kernel for its (path, arch)."""
        relative_path = prepared.relative_path
        gfx_arch = prepared.gfx_arch
        toc = self.toc
        if relative_path in toc and gfx_arch in toc[relative_path]:
            raise ValueError(f"Kernel already exists for {relative_path} @ {gfx_arch}")
        entry: Dict[str, Any] = {
            "type": "hsaco",
            "ordinal": self._kernel_ordinal_counter,
            "original_size": prepared.original_size,
        }
        if self._native_input is not None:
            extra = self._spool_kernel(prepared)
            if extra:
                metadata = dict(prepared.metadata) if prepared.metadata else {}
                metadata.update(extra)
                entry["metadata"] = metadata
            elif prepared.metadata:
                entry["metadata"] = prepared.metadata
        else:
            if prepared.metadata:
                entry["metadata"] = prepared.metadata
            self._compression_inputs.append((prepared.kernel_id, prepared.compression_input))
        self._kernel_ordinal_counter += 1
        toc.setdefault(relative_path, {})[gfx_arch] = entry

    def _spool_kernel(self, prepared: PreparedKernel) -> Optional[Dict[str, Any]]:
        """Moves a built-in compressor's stored bytes to the spool; returns the digest fields of
        the entry's metadata when they are recorded."""
        if self._archive_finalized:
            raise RuntimeError("Cannot add_kernel() after finalize_archive()")
        prepared_input = prepared.compression_input
        if not isinstance(prepared_input, self._native_input):
            raise TypeError(
                f"{prepared.kernel_id}: a {type(prepared_input).__name__} cannot be added to an "
                f"archive using {type(self._compressor).__name__}"
            )
        if self._spool is None:
            self._spool = _native.Spool()
        zstd = self._native_input is ZstdCompressionInput
        stored = _as_stored(prepared_input.compressed_frame if zstd else prepared_input.data)
        start = self._spool.append(stored, zstd)
        body = start + 4 if zstd else start
        spooled = _Spooled(self._spool, body, len(stored))
        if zstd:
            prepared_input._frame = None
        else:
            prepared_input._data = None
            self._blob_spans.append((start, len(stored)))
        prepared_input._spooled = spooled
        if not self._digests:
            return None
        kernel_digest, frame_digest = prepared_input._digests or (None, None)
        if kernel_digest is None:
            raise ValueError(
                f"{prepared.kernel_id}: prepared without digests; prepare it with this archive"
            )
        extra: Dict[str, Any] = {}
        if zstd:
            # The frame's size word, as an absolute file offset: header and padding, the frame
            # count word, then the spool.
            extra[_native.META_FRAME] = [self.BLOB_ALIGNMENT + 4 + start, len(stored)]
        extra[_native.META_BLAKE3] = kernel_digest
        if zstd:
            extra[_native.META_FRAME_BLAKE3] = frame_digest
        return extra

    def finalize_archive(self) -> None:
        """The reduce phase: the compressor's blob and TOC fields. `RuntimeError` when called
        twice."""
        if self._archive_finalized:
            raise RuntimeError("Archive already finalized")
        if self._native_input is ZstdCompressionInput:
            spooled = len(self._spool) if self._spool is not None else 0
            metadata: Dict[str, Any] = {"zstd_offset": 0, "zstd_size": 4 + spooled}
        elif self._native_input is NoOpCompressionInput:
            metadata = {"blobs": [{"offset": o, "size": s} for o, s in self._blob_spans]}
        else:
            self._compressed_blob, metadata = self._compressor.finalize(self._compression_inputs)
        self._compression_metadata = metadata
        self._archive_finalized = True
        self._compression_inputs.clear()

    def write(self, output_path: Path) -> None:
        """Writes the archive (creating parent directories): header, padding to byte 64, blob,
        msgpack TOC. `RuntimeError` before `finalize_archive`."""
        if not self._archive_finalized:
            raise RuntimeError("Archive not finalized. Call finalize_archive() first.")
        scheme = self._compressor.SCHEME_NAME
        toc_metadata: Dict[str, Any] = {"compression_scheme": scheme}
        toc_metadata.update(self._compression_metadata)
        if scheme == "zstd-per-kernel":
            toc_metadata["zstd_offset"] = self.BLOB_ALIGNMENT
        elif scheme == "none":
            toc_metadata["blobs"] = [
                dict(blob, offset=blob["offset"] + self.BLOB_ALIGNMENT)
                for blob in toc_metadata["blobs"]
            ]
        toc_data = {
            "format_version": self.FORMAT_VERSION,
            "group_name": self.group_name,
            "gfx_arch_family": self.gfx_arch_family,
            "gfx_arches": self.gfx_arches,
            "toc": self.toc,
            **toc_metadata,
        }
        toc_bytes = _native.packb(toc_data)
        if self._native_input is ZstdCompressionInput:
            count = self._kernel_ordinal_counter
            _native.write_archive(output_path, struct.pack("<I", count), self._spool, toc_bytes)
        elif self._native_input is NoOpCompressionInput:
            _native.write_archive(output_path, b"", self._spool, toc_bytes)
        else:
            _native.write_archive(output_path, bytes(self._compressed_blob), None, toc_bytes)

    @staticmethod
    def read(input_path: Path) -> "PackedKernelArchive":
        """Opens an archive: checks its header, reads its TOC and makes the compressor of its
        scheme. `ValueError` for a bad magic, version, TOC or scheme (and, for the built-in
        schemes, anything the C library's open rejects)."""
        path = Path(input_path)
        with path.open("rb") as f:
            header = f.read(PackedKernelArchive.HEADER_SIZE)
        if len(header) < PackedKernelArchive.HEADER_SIZE:
            raise ValueError(
                f"Truncated header: {len(header)} bytes "
                f"(expected {PackedKernelArchive.HEADER_SIZE})"
            )
        magic, version, toc_offset = struct.unpack("<4sIQ", header)
        if magic != PackedKernelArchive.MAGIC:
            raise ValueError(
                f"Invalid magic number: {magic!r} (expected {PackedKernelArchive.MAGIC!r})"
            )
        if version != PackedKernelArchive.FORMAT_VERSION:
            raise ValueError(
                f"Unsupported format version: {version} "
                f"(expected {PackedKernelArchive.FORMAT_VERSION})"
            )
        source = _native.TocData(path, toc_offset)
        toc_data = source.head()
        for field in ("group_name", "gfx_arch_family", "gfx_arches"):
            if field not in toc_data:
                raise ValueError(f"Invalid TOC: no {field!r} field")
        if not source.has_toc():
            raise ValueError("Invalid TOC: no 'toc' map")
        archive = PackedKernelArchive(
            group_name=toc_data["group_name"],
            gfx_arch_family=toc_data["gfx_arch_family"],
            gfx_arches=toc_data["gfx_arches"],
        )
        archive._toc = None
        archive._toc_source = source
        archive._file_path = input_path
        scheme = toc_data.get("compression_scheme", "none")
        if scheme not in ("none", "zstd-per-kernel"):
            # Another scheme's from_toc may read any part of the TOC.
            toc_data["toc"] = archive.toc
        archive._compressor = create_compressor_from_toc(toc_data, path)
        if type(archive._compressor) in _NATIVE_INPUTS:
            archive._reader = _native.Reader(path)
            archive._compressor._reader = archive._reader
        archive._archive_finalized = True
        return archive

    def get_kernel(self, relative_path: str, gfx_arch: str) -> Optional[bytes]:
        """The kernel of a binary for an arch, decompressed; `None` when the archive has none.
        `RuntimeError` when it has one but the archive is not finalized."""
        relative_path = relative_path.replace("\\", "/")
        if self._toc is None and self._reader is not None:
            return self._reader.get(relative_path, gfx_arch)
        toc = self.toc
        if relative_path not in toc:
            return None
        arches = toc[relative_path]
        if not isinstance(arches, dict):
            raise ValueError(f"Invalid TOC: the entry of {relative_path} is not a map")
        if gfx_arch not in arches:
            return None
        entry = arches[gfx_arch]
        ordinal = entry.get("ordinal") if isinstance(entry, dict) else None
        if not isinstance(ordinal, int):
            raise ValueError(
                f"Invalid TOC entry for {relative_path} @ {gfx_arch}: no integer ordinal"
            )
        if self._archive_finalized:
            return self._compressor.decompress_kernel(ordinal)
        raise RuntimeError(
            "Cannot get_kernel() before archive is finalized. Call finalize_archive() first."
        )

    @staticmethod
    def compute_pack_filename(group_name: str, gfx_arch_family: str) -> str:
        """The legacy archive name `{group_name}-{gfx_arch_family}.kpack`."""
        return f"{group_name}-{gfx_arch_family}.kpack"

    # Additions to the reference API.

    def __iter__(self) -> Iterator[Tuple[str, str]]:
        """Every (relative_path, gfx_arch) of the TOC, in TOC order."""
        for relative_path, arches in self.toc.items():
            for gfx_arch in arches:
                yield relative_path, gfx_arch

    def kernel_count(self) -> int:
        """The number of kernels. (No `__len__`: an empty archive stays truthy, as in the
        reference.)"""
        return sum(len(arches) for arches in self.toc.values())

    def items(self) -> Iterator[Tuple[str, str, bytes]]:
        """Every kernel as (relative_path, gfx_arch, bytes), in TOC order."""
        for relative_path, gfx_arch in self:
            yield relative_path, gfx_arch, self.get_kernel(relative_path, gfx_arch)

    def verify(self) -> int:
        """Reads every kernel of an archive opened with `read` and checks it against what the
        archive records (frame bounds and sizes, and the BLAKE3 digests when it has them).
        Returns how many kernels were checked; `ValueError` naming the first that fails."""
        if self._reader is None:
            raise RuntimeError("verify() needs an archive opened with read()")
        return self._reader.verify()

    @property
    def has_digests(self) -> bool:
        """Whether an archive opened with `read` records a BLAKE3 digest for every kernel."""
        return self._reader is not None and self._reader.has_digests()

    def __repr__(self) -> str:
        toc = self.toc
        return (
            f"PackedKernelArchive("
            f"group={self.group_name}, "
            f"family={self.gfx_arch_family}, "
            f"binaries={len(toc)}, "
            f"kernels={sum(len(arches) for arches in toc.values())})"
        )


def _as_stored(data) -> bytes:
    return data if type(data) is bytes else bytes(data)
