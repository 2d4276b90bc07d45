/*
 * kpack_types.h - handles, error codes and constants of librocm_kpack.
 *
 * The numeric values below are part of the ABI: programs built against the
 * ROCm implementation of this header keep working with this library, so no
 * value may ever change.
 */
#ifndef ROCM_KPACK_KPACK_TYPES_H
#define ROCM_KPACK_KPACK_TYPES_H

/* Self-contained, as the ROCm header is: a file that includes only this one can use size_t and
 * the fixed-width integer types. */
#include <stddef.h>
#include <stdint.h>

/* Opaque handle to an open .kpack archive (kpack_open / kpack_close). */
typedef struct kpack_archive* kpack_archive_t;

/* Opaque handle to a loader cache (kpack_cache_create / kpack_cache_destroy). */
typedef struct kpack_cache* kpack_cache_t;

/* Result of every fallible call. Zero means success. */
typedef enum {
  KPACK_SUCCESS = 0,
  KPACK_ERROR_INVALID_ARGUMENT = 1,     /* a NULL pointer, zero count or bad index */
  KPACK_ERROR_FILE_NOT_FOUND = 2,       /* the archive file does not exist */
  KPACK_ERROR_INVALID_FORMAT = 3,       /* not a kpack file, or a malformed layout */
  KPACK_ERROR_UNSUPPORTED_VERSION = 4,  /* header version other than 1 */
  KPACK_ERROR_KERNEL_NOT_FOUND = 5,     /* no such (binary, arch) entry */
  KPACK_ERROR_DECOMPRESSION_FAILED = 6, /* a stored kernel did not decode */
  KPACK_ERROR_OUT_OF_MEMORY = 7,        /* an allocation failed */
  KPACK_ERROR_NOT_IMPLEMENTED = 8,      /* unsupported here, or loading disabled */
  KPACK_ERROR_IO_ERROR = 9,             /* reading the file failed */
  KPACK_ERROR_MSGPACK_PARSE_FAILED = 10, /* the table of contents is not valid */
  /* Codes of the loader API */
  KPACK_ERROR_PATH_DISCOVERY_FAILED = 11, /* no mapped file holds the address */
  KPACK_ERROR_INVALID_METADATA = 12,      /* HIPK metadata missing or malformed */
  KPACK_ERROR_ARCHIVE_NOT_FOUND = 13,     /* no search path named a usable archive */
  KPACK_ERROR_ARCH_NOT_FOUND = 14         /* no archive lists a requested arch */
} kpack_error_t;

/* The first four bytes of every archive. */
#define KPACK_MAGIC "KPAK"
#define KPACK_MAGIC_SIZE 4

/* The only archive format version this library reads. */
#define KPACK_CURRENT_VERSION 1

/* How kernels are stored inside an archive. */
typedef enum {
  KPACK_COMPRESSION_NOOP = 0,            /* stored as plain bytes */
  KPACK_COMPRESSION_ZSTD_PER_KERNEL = 1  /* one zstd frame per kernel */
} kpack_compression_scheme_t;

#endif /* ROCM_KPACK_KPACK_TYPES_H */
