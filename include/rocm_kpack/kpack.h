/*
 * kpack.h - C interface of librocm_kpack.
 *
 * Two groups of functions:
 *   - the archive API reads .kpack files directly (open, list, fetch kernels);
 *   - the loader API is what the HIP runtime calls for binaries whose device
 *     code was moved out into .kpack archives (HIPK wrappers): it resolves the
 *     archive search paths, caches open archives and picks the best code
 *     object for a list of target ISAs.
 *
 * Ownership rules shared by all functions:
 *   - Output parameters are written only when the call returns KPACK_SUCCESS.
 *   - Kernel and code-object buffers are allocated with malloc; release them
 *     with kpack_free_kernel / kpack_free_code_object (or free).
 *   - Strings handed out by an archive belong to it and stay valid, at the
 *     same address, until kpack_close.
 *
 * Usable from C99 and later and from C++.
 */
#ifndef ROCM_KPACK_KPACK_H
#define ROCM_KPACK_KPACK_H

#include <stddef.h>
#include <stdint.h>
#ifndef __cplusplus
#include <stdbool.h>
#endif

#include "kpack_export.h"
#include "kpack_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Archive API ------------------------------------------------------- */

/*
 * Opens and validates the archive at `path`. On success *archive receives a
 * handle to release with kpack_close. On failure *archive is left as it was.
 */
KPACK_API kpack_error_t kpack_open(const char* path, kpack_archive_t* archive);

/* Releases an archive handle and every string it handed out. NULL is ignored. */
KPACK_API void kpack_close(kpack_archive_t archive);

/* Number of architectures the archive declares (its gfx_arches list). */
KPACK_API kpack_error_t kpack_get_architecture_count(kpack_archive_t archive,
                                                     size_t* count);

/*
 * Architecture number `index` (0-based, archive order). The string belongs to
 * the archive. An index at or past the count is KPACK_ERROR_INVALID_ARGUMENT.
 */
KPACK_API kpack_error_t kpack_get_architecture(kpack_archive_t archive,
                                               size_t index, const char** arch);

/* Number of distinct binary names in the archive. */
KPACK_API kpack_error_t kpack_get_binary_count(kpack_archive_t archive,
                                               size_t* count);

/*
 * Binary name number `index`, in byte-wise sorted order (for example
 * "lib/libfoo.so#0"). The string belongs to the archive.
 */
KPACK_API kpack_error_t kpack_get_binary(kpack_archive_t archive, size_t index,
                                         const char** binary);

/*
 * Fetches (and decompresses) the kernel stored for `binary_name` and `arch`,
 * matched exactly. On success *kernel_data is a new malloc'd buffer of
 * *kernel_size bytes owned by the caller. Safe to call from many threads on
 * one handle.
 */
KPACK_API kpack_error_t kpack_get_kernel(kpack_archive_t archive,
                                         const char* binary_name,
                                         const char* arch, void** kernel_data,
                                         size_t* kernel_size);

/* Frees a buffer returned by kpack_get_kernel. NULL is ignored. */
KPACK_API void kpack_free_kernel(void* kernel_data);

/* ---- Loader API -------------------------------------------------------- */

/*
 * Called once per architecture by kpack_enumerate_architectures. Return true
 * to receive the next one, false to stop.
 */
typedef bool (*kpack_arch_callback_t)(const char* arch, void* user_data);

/*
 * Creates a loader cache. The ROCM_KPACK_PATH, ROCM_KPACK_PATH_PREFIX,
 * ROCM_KPACK_DISABLE and ROCM_KPACK_DEBUG environment variables are read here
 * and only here. Release with kpack_cache_destroy.
 */
KPACK_API kpack_error_t kpack_cache_create(kpack_cache_t* cache);

/* Destroys a cache and closes the archives it opened. NULL is ignored. */
KPACK_API void kpack_cache_destroy(kpack_cache_t cache);

/*
 * Finds the file mapped at `address_in_binary` (any address inside a loaded
 * executable or shared object) and copies its NUL-terminated path into
 * `path_out`. If `offset_out` is not NULL it receives the file offset that
 * corresponds to the address. A path that does not fit, NUL included, is
 * KPACK_ERROR_INVALID_ARGUMENT.
 */
KPACK_API kpack_error_t kpack_discover_binary_path(const void* address_in_binary,
                                                   char* path_out,
                                                   size_t path_out_size,
                                                   size_t* offset_out);

/*
 * Loads code object number `co_index` of the host binary at `binary_path`,
 * whose HIPK metadata (a msgpack map, no length) starts at `hipk_metadata`.
 * `arch_list` holds `arch_count` target ISAs in priority order; NULL entries
 * are skipped. On success *code_object_out is a new malloc'd buffer of
 * *code_object_size_out bytes owned by the caller. Safe to call from many
 * threads on one cache.
 */
KPACK_API kpack_error_t kpack_load_code_object(kpack_cache_t cache,
                                               const void* hipk_metadata,
                                               const char* binary_path,
                                               uint32_t co_index,
                                               const char* const* arch_list,
                                               size_t arch_count,
                                               void** code_object_out,
                                               size_t* code_object_size_out);

/* Frees a buffer returned by kpack_load_code_object. NULL is ignored. */
KPACK_API void kpack_free_code_object(void* code_object);

/*
 * Opens the archive at `archive_path` and calls `callback` with each of its
 * architectures in order until the callback returns false. Stopping early is
 * still KPACK_SUCCESS.
 */
KPACK_API kpack_error_t kpack_enumerate_architectures(const char* archive_path,
                                                      kpack_arch_callback_t callback,
                                                      void* user_data);

#ifdef __cplusplus
}
#endif

#endif /* ROCM_KPACK_KPACK_H */
