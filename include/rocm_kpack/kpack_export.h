/*
 * kpack_export.h - symbol visibility for librocm_kpack.
 *
 * Every public function of the library is declared with KPACK_API. On ELF
 * platforms the library is built with hidden visibility by default, so only
 * the functions marked here are exported. On Windows the macro selects
 * dllexport while the library itself is being built (ROCM_KPACK_EXPORTS),
 * dllimport for consumers of the DLL, and nothing for static linking
 * (ROCM_KPACK_STATIC).
 */
#ifndef ROCM_KPACK_KPACK_EXPORT_H
#define ROCM_KPACK_KPACK_EXPORT_H

#if defined(_WIN32) || defined(__CYGWIN__)
#  if defined(ROCM_KPACK_STATIC)
#    define KPACK_API
#  elif defined(ROCM_KPACK_EXPORTS)
#    define KPACK_API __declspec(dllexport)
#  else
#    define KPACK_API __declspec(dllimport)
#  endif
#else
#  define KPACK_API __attribute__((visibility("default")))
#endif

#endif /* ROCM_KPACK_KPACK_EXPORT_H */
