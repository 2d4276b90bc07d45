/*
 * api.c - the archive half of the C API: the reference's KpackAPITest and
 * ArchiveIntegrationTest suites, null arguments for every function, and every
 * row of the open/get error matrix.
 *
 * usage: api ASSETS_DIR MATRIX_DIR
 *   ASSETS_DIR holds test_noop.kpack and test_zstd.kpack (the golden archives);
 *   MATRIX_DIR holds the crafted archives named in the matrix table below
 *   (written by tests/it/c_api.rs).
 */
#include <rocm_kpack/kpack.h>

#include "test.h"

static const char* assets;
static const char* matrix;

/* ---- KpackAPITest ------------------------------------------------------ */

static void KpackAPITest_NullArguments(void) {
  kpack_archive_t a = NULL;
  size_t count = 0;
  void* data = NULL;
  size_t size = 0;
  CHECK_EQ(kpack_open(NULL, &a), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(kpack_open(kt_join(assets, "test_noop.kpack"), NULL), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(kpack_get_architecture_count(NULL, &count), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(kpack_get_kernel(NULL, "lib/libtest.so#0", "gfx900", &data, &size),
           KPACK_ERROR_INVALID_ARGUMENT);
  CHECK(a == NULL);
  CHECK(data == NULL);
}

static void KpackAPITest_FileNotFound(void) {
  kpack_archive_t a = NULL;
  CHECK_EQ(kpack_open("/nonexistent/test.kpack", &a), KPACK_ERROR_FILE_NOT_FOUND);
  CHECK(a == NULL);
}

static void KpackAPITest_CloseNull(void) { kpack_close(NULL); }

static void KpackAPITest_FreeKernel_Null(void) { kpack_free_kernel(NULL); }

static kpack_archive_t open_ok(const char* dir, const char* name) {
  kpack_archive_t a = NULL;
  CHECK_EQ(kpack_open(kt_join(dir, name), &a), KPACK_SUCCESS);
  CHECK(a != NULL);
  return a;
}

static void KpackAPITest_GetBinary_NullArchive(void) {
  const char* s = NULL;
  CHECK_EQ(kpack_get_binary(NULL, 0, &s), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK(s == NULL);
}

static void KpackAPITest_GetBinary_NullBinaryOut(void) {
  kpack_archive_t a = open_ok(assets, "test_noop.kpack");
  CHECK_EQ(kpack_get_binary(a, 0, NULL), KPACK_ERROR_INVALID_ARGUMENT);
  kpack_close(a);
}

static void KpackAPITest_GetBinaryCount_NullCount(void) {
  kpack_archive_t a = open_ok(assets, "test_noop.kpack");
  CHECK_EQ(kpack_get_binary_count(a, NULL), KPACK_ERROR_INVALID_ARGUMENT);
  kpack_close(a);
}

static void KpackAPITest_GetArchitectureCount_NullCount(void) {
  kpack_archive_t a = open_ok(assets, "test_noop.kpack");
  CHECK_EQ(kpack_get_architecture_count(a, NULL), KPACK_ERROR_INVALID_ARGUMENT);
  kpack_close(a);
}

static void KpackAPITest_GetBinary_IndexOutOfRange(void) {
  kpack_archive_t a = open_ok(assets, "test_noop.kpack");
  size_t count = 0;
  const char* s = "untouched";
  CHECK_EQ(kpack_get_binary_count(a, &count), KPACK_SUCCESS);
  CHECK_EQ(count, 2);
  CHECK_EQ(kpack_get_binary(a, count, &s), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(kpack_get_binary(a, 99999, &s), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(kpack_get_binary(a, (size_t)-1, &s), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_STR(s, "untouched");
  kpack_close(a);
}

static void KpackAPITest_GetArchitecture_IndexOutOfRange(void) {
  kpack_archive_t a = open_ok(assets, "test_noop.kpack");
  const char* s = "untouched";
  CHECK_EQ(kpack_get_architecture(a, 2, &s), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(kpack_get_architecture(a, 99999, &s), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_STR(s, "untouched");
  kpack_close(a);
}

static int open_code(const char* dir, const char* name) {
  kpack_archive_t a = NULL;
  int rc = kpack_open(kt_join(dir, name), &a);
  if (rc == KPACK_SUCCESS) kpack_close(a);
  else CHECK(a == NULL);
  return rc;
}

static void KpackAPITest_InvalidArchive_EmptyFile(void) {
  CHECK_EQ(open_code(matrix, "empty.kpack"), KPACK_ERROR_IO_ERROR);
}

static void KpackAPITest_InvalidArchive_WrongMagic(void) {
  CHECK_EQ(open_code(matrix, "ref_wrong_magic.kpack"), KPACK_ERROR_INVALID_FORMAT);
}

static void KpackAPITest_InvalidArchive_UnsupportedVersion(void) {
  CHECK_EQ(open_code(matrix, "ref_version_999.kpack"), KPACK_ERROR_UNSUPPORTED_VERSION);
}

static void KpackAPITest_InvalidArchive_TruncatedHeader(void) {
  CHECK_EQ(open_code(matrix, "short_8.kpack"), KPACK_ERROR_INVALID_FORMAT);
}

static void KpackAPITest_InvalidArchive_TOCOffsetBeyondFile(void) {
  CHECK_EQ(open_code(matrix, "ref_toc_beyond.kpack"), KPACK_ERROR_INVALID_FORMAT);
}

static void InvalidNumericTocFieldTest_ReturnsParseError(void) {
  static const char* const fields[] = {"offset", "size", "zstd_offset", "zstd_size",
                                       "ordinal", "original_size"};
  size_t i;
  for (i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    char name[64];
    snprintf(name, sizeof name, "numeric_str_%s.kpack", fields[i]);
    if (open_code(matrix, name) != KPACK_ERROR_MSGPACK_PARSE_FAILED) {
      fprintf(stderr, "field %s\n", fields[i]);
      CHECK(0);
    }
  }
}

static void OversizedTocDeclarationTest_ReturnsParseError(void) {
  static const char* const tags[] = {"dd", "df", "db", "c6", "c9"};
  size_t i;
  for (i = 0; i < 5; i++) {
    char name[64];
    snprintf(name, sizeof name, "oversized_%s.kpack", tags[i]);
    if (open_code(matrix, name) != KPACK_ERROR_MSGPACK_PARSE_FAILED) {
      fprintf(stderr, "tag 0x%s\n", tags[i]);
      CHECK(0);
    }
  }
}

/* ---- ArchiveIntegrationTest -------------------------------------------- */

static void expect_kernel(kpack_archive_t a, const char* key, const char* arch,
                          const char* prefix, int fill, size_t size) {
  void* data = NULL;
  size_t got = 0;
  CHECK_EQ(kpack_get_kernel(a, key, arch, &data, &got), KPACK_SUCCESS);
  if (!kt_bytes_are(data, got, prefix, fill, size)) {
    fprintf(stderr, "kernel %s [%s]: wrong bytes (size %zu, want %zu)\n", key, arch, got, size);
    CHECK(0);
  }
  kpack_free_kernel(data);
}

static void expect_missing(kpack_archive_t a, const char* key, const char* arch, int code) {
  void* data = (void*)&data;
  size_t size = 12345;
  void* before = data;
  CHECK_EQ(kpack_get_kernel(a, key, arch, &data, &size), code);
  CHECK(data == before);
  CHECK_EQ(size, 12345);
}

static void ArchiveIntegrationTest_NoOpArchive(void) {
  kpack_archive_t a = open_ok(assets, "test_noop.kpack");
  size_t n = 0;
  const char* s = NULL;
  CHECK_EQ(kpack_get_architecture_count(a, &n), KPACK_SUCCESS);
  CHECK_EQ(n, 2);
  CHECK_EQ(kpack_get_architecture(a, 0, &s), KPACK_SUCCESS);
  CHECK_STR(s, "gfx900");
  CHECK_EQ(kpack_get_architecture(a, 1, &s), KPACK_SUCCESS);
  CHECK_STR(s, "gfx906");
  CHECK_EQ(kpack_get_binary_count(a, &n), KPACK_SUCCESS);
  CHECK_EQ(n, 2);
  expect_kernel(a, "lib/libtest.so#0", "gfx900", "KERNEL1_GFX900_DATA", 0, 119);
  expect_kernel(a, "lib/libtest.so#0", "gfx906", "KERNEL2_GFX906_DATA", 0, 219);
  expect_kernel(a, "bin/testapp#0", "gfx900", "KERNEL3_APP_GFX900", 0xff, 168);
  expect_missing(a, "lib/nonexistent.so#0", "gfx900", KPACK_ERROR_KERNEL_NOT_FOUND);
  expect_missing(a, "lib/libtest.so#0", "gfx908", KPACK_ERROR_KERNEL_NOT_FOUND);
  expect_missing(a, "bin/testapp#0", "gfx906", KPACK_ERROR_KERNEL_NOT_FOUND);
  kpack_close(a);
}

static void ArchiveIntegrationTest_ZstdArchive(void) {
  kpack_archive_t a = open_ok(assets, "test_zstd.kpack");
  void* data = NULL;
  size_t size = 0;
  const unsigned char* p;
  size_t i;
  int ok = 1;
  CHECK_EQ(kpack_get_kernel(a, "lib/libhip.so#0", "gfx1100", &data, &size), KPACK_SUCCESS);
  CHECK_EQ(size, 1019);
  p = (const unsigned char*)data;
  if (p == NULL || size != 1019 || memcmp(p, "HIP_KERNEL_GFX1100_", 19) != 0) ok = 0;
  for (i = 19; ok && i < 1019; i++)
    if (p[i] != (i < 519 ? 'A' : 'B')) ok = 0;
  CHECK(ok);
  kpack_free_kernel(data);
  data = NULL;
  CHECK_EQ(kpack_get_kernel(a, "lib/libhip.so#0", "gfx1101", &data, &size), KPACK_SUCCESS);
  p = (const unsigned char*)data;
  ok = size == 619 && p != NULL && memcmp(p, "HIP_KERNEL_GFX1101_", 19) == 0;
  for (i = 19; ok && i < 619; i++)
    if (p[i] != (i < 319 ? 'X' : 'Y')) ok = 0;
  CHECK(ok);
  kpack_free_kernel(data);
  expect_kernel(a, "bin/hiptest#0", "gfx1100", "TEST_APP_KERNEL___", 0x42, 1018);
  expect_missing(a, "bin/hiptest#0", "gfx1101", KPACK_ERROR_KERNEL_NOT_FOUND);
  kpack_close(a);
}

static void ArchiveIntegrationTest_GetBinaryNames(void) {
  kpack_archive_t a = open_ok(assets, "test_noop.kpack");
  const char *b0 = NULL, *b1 = NULL, *again = NULL, *arch0 = NULL, *arch0_again = NULL;
  CHECK_EQ(kpack_get_binary(a, 0, &b0), KPACK_SUCCESS);
  CHECK_EQ(kpack_get_binary(a, 1, &b1), KPACK_SUCCESS);
  CHECK_STR(b0, "bin/testapp#0");
  CHECK_STR(b1, "lib/libtest.so#0");
  /* Pointer stability: the same string object every time, until close. */
  CHECK_EQ(kpack_get_binary(a, 0, &again), KPACK_SUCCESS);
  CHECK(again == b0);
  CHECK_EQ(kpack_get_architecture(a, 0, &arch0), KPACK_SUCCESS);
  expect_kernel(a, "lib/libtest.so#0", "gfx906", "KERNEL2_GFX906_DATA", 0, 219);
  CHECK_EQ(kpack_get_architecture(a, 0, &arch0_again), KPACK_SUCCESS);
  CHECK(arch0 == arch0_again);
  CHECK_STR(b0, "bin/testapp#0");
  kpack_close(a);
}

static void ArchiveIntegrationTest_GetBinaryNames_Zstd(void) {
  kpack_archive_t a = open_ok(assets, "test_zstd.kpack");
  const char *b0 = NULL, *b1 = NULL;
  size_t n = 0;
  CHECK_EQ(kpack_get_binary_count(a, &n), KPACK_SUCCESS);
  CHECK_EQ(n, 2);
  CHECK_EQ(kpack_get_binary(a, 0, &b0), KPACK_SUCCESS);
  CHECK_EQ(kpack_get_binary(a, 1, &b1), KPACK_SUCCESS);
  CHECK_STR(b0, "bin/hiptest#0");
  CHECK_STR(b1, "lib/libhip.so#0");
  kpack_close(a);
}

static void ArchiveIntegrationTest_KernelCacheOverwrite(void) {
  kpack_archive_t a = open_ok(assets, "test_zstd.kpack");
  void *first = NULL, *second = NULL;
  size_t n1 = 0, n2 = 0;
  CHECK_EQ(kpack_get_kernel(a, "lib/libhip.so#0", "gfx1100", &first, &n1), KPACK_SUCCESS);
  CHECK_EQ(kpack_get_kernel(a, "lib/libhip.so#0", "gfx1100", &second, &n2), KPACK_SUCCESS);
  CHECK(first != NULL && second != NULL && first != second);
  /* Independent buffers: scribbling on one leaves the other intact. */
  if (first && second && n1 == 1019 && n2 == 1019) {
    memset(first, 0, n1);
    CHECK(kt_bytes_are(second, n2, "HIP_KERNEL_GFX1100_AAAA", -1, 1019));
  } else {
    CHECK(0);
  }
  kpack_free_kernel(first);
  kpack_free_code_object(second); /* the two free functions are interchangeable */
  kpack_close(a);
}

/* ---- Null arguments for every function --------------------------------- */

static bool count_cb(const char* arch, void* user) {
  (void)arch;
  ++*(int*)user;
  return true;
}

static void CApi_NullArgumentsEveryFunction(void) {
  kpack_archive_t a = open_ok(assets, "test_noop.kpack");
  kpack_cache_t cache = NULL;
  const char* s = NULL;
  size_t n = 0;
  void* data = NULL;
  char path[64];
  int calls = 0;
  CHECK_EQ(kpack_get_architecture(NULL, 0, &s), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(kpack_get_architecture(a, 0, NULL), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(kpack_get_binary_count(NULL, &n), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(kpack_get_kernel(a, NULL, "gfx900", &data, &n), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(kpack_get_kernel(a, "lib/libtest.so#0", NULL, &data, &n), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(kpack_get_kernel(a, "lib/libtest.so#0", "gfx900", NULL, &n), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(kpack_get_kernel(a, "lib/libtest.so#0", "gfx900", &data, NULL), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK(s == NULL && data == NULL);
  CHECK_EQ(kpack_cache_create(NULL), KPACK_ERROR_INVALID_ARGUMENT);
  kpack_cache_destroy(NULL);
  kpack_free_code_object(NULL);
  kpack_free_kernel(NULL);
  kpack_close(NULL);
  CHECK_EQ(kpack_discover_binary_path(NULL, path, sizeof path, NULL), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(kpack_discover_binary_path((const void*)&count_cb, NULL, sizeof path, NULL),
           KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(kpack_discover_binary_path((const void*)&count_cb, path, 0, NULL),
           KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(kpack_enumerate_architectures(NULL, count_cb, &calls), KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(kpack_enumerate_architectures(kt_join(assets, "test_noop.kpack"), NULL, &calls),
           KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(calls, 0);
  /* user_data may be NULL: it is only handed back. */
  CHECK_EQ(kpack_cache_create(&cache), KPACK_SUCCESS);
  kpack_cache_destroy(cache);
  kpack_close(a);
}

static void CApi_ZeroSizeKernel(void) {
  kpack_archive_t a = open_ok(matrix, "zstd_empty_kernel.kpack");
  void* data = NULL;
  size_t size = 99;
  if (!a) return;
  CHECK_EQ(kpack_get_kernel(a, "lib/a.so#0", "gfx1100", &data, &size), KPACK_SUCCESS);
  CHECK_EQ(size, 0);
  CHECK(data != NULL);
  kpack_free_kernel(data);
  kpack_close(a);
}

/* ---- The open/get error matrix ----------------------------------------- */

typedef struct {
  const char* file;   /* in MATRIX_DIR */
  int open;           /* expected kpack_open result */
  const char* key;    /* when open succeeds: what to fetch (NULL: nothing) */
  const char* arch;
  int get;            /* expected kpack_get_kernel result */
  const char* prefix; /* on success: expected leading bytes ... */
  int fill;           /* ... then this byte repeated (-1: unchecked) ... */
  size_t size;        /* ... for this total size */
} matrix_row;

#define NOOP_KEY "lib/a.so#0", "gfx900"
#define ZSTD_KEY "lib/a.so#0", "gfx1100"
#define NOOP_DATA "NOOP_KERNEL_", 'n', 64
#define ZSTD_DATA "ZSTD_KERNEL_", 'z', 300

static const matrix_row rows[] = {
    {"valid_noop.kpack", 0, NOOP_KEY, 0, NOOP_DATA},
    {"valid_zstd.kpack", 0, ZSTD_KEY, 0, ZSTD_DATA},
    {"empty.kpack", 9, NULL, NULL, 0, NULL, 0, 0},
    {"short_8.kpack", 3, NULL, NULL, 0, NULL, 0, 0},
    {"short_15.kpack", 3, NULL, NULL, 0, NULL, 0, 0},
    {"header_only.kpack", 3, NULL, NULL, 0, NULL, 0, 0},
    {"magic_XPAK.kpack", 3, NULL, NULL, 0, NULL, 0, 0},
    {"magic_kpak.kpack", 3, NULL, NULL, 0, NULL, 0, 0},
    {"version_0.kpack", 4, NULL, NULL, 0, NULL, 0, 0},
    {"version_2.kpack", 4, NULL, NULL, 0, NULL, 0, 0},
    {"toc_offset_eof.kpack", 3, NULL, NULL, 0, NULL, 0, 0},
    {"toc_offset_2p63.kpack", 3, NULL, NULL, 0, NULL, 0, 0},
    {"toc_offset_0.kpack", 10, NULL, NULL, 0, NULL, 0, 0},
    {"toc_array.kpack", 10, NULL, NULL, 0, NULL, 0, 0},
    {"toc_truncated.kpack", 10, NULL, NULL, 0, NULL, 0, 0},
    {"toc_trailing_garbage.kpack", 0, NOOP_KEY, 0, NOOP_DATA},
    {"scheme_missing.kpack", 0, NOOP_KEY, 0, NOOP_DATA},
    {"scheme_lz4.kpack", 0, NOOP_KEY, 0, NOOP_DATA},
    {"scheme_int.kpack", 0, NOOP_KEY, 0, NOOP_DATA},
    {"noop_no_blobs.kpack", 0, NOOP_KEY, 5, NULL, 0, 0},
    {"noop_offset_past_eof.kpack", 0, NOOP_KEY, 9, NULL, 0, 0},
    {"noop_size_past_eof.kpack", 0, NOOP_KEY, 9, NULL, 0, 0},
    {"noop_ordinal_past_blobs.kpack", 0, NOOP_KEY, 5, NULL, 0, 0},
    {"noop_wrong_original_size.kpack", 0, NOOP_KEY, 0, NOOP_DATA},
    {"ordinal_str.kpack", 10, NULL, NULL, 0, NULL, 0, 0},
    {"ordinal_negative.kpack", 10, NULL, NULL, 0, NULL, 0, 0},
    {"ordinal_2p32.kpack", 10, NULL, NULL, 0, NULL, 0, 0},
    {"original_size_float.kpack", 10, NULL, NULL, 0, NULL, 0, 0},
    {"blob_offset_str.kpack", 10, NULL, NULL, 0, NULL, 0, 0},
    {"toc_not_map.kpack", 0, NOOP_KEY, 5, NULL, 0, 0},
    {"toc_bin_key.kpack", 0, NOOP_KEY, 5, NULL, 0, 0},
    {"oversized_dd.kpack", 10, NULL, NULL, 0, NULL, 0, 0},
    {"oversized_df.kpack", 10, NULL, NULL, 0, NULL, 0, 0},
    {"oversized_db.kpack", 10, NULL, NULL, 0, NULL, 0, 0},
    {"zstd_size_past_eof.kpack", 9, NULL, NULL, 0, NULL, 0, 0},
    {"zstd_size_0.kpack", 3, NULL, NULL, 0, NULL, 0, 0},
    {"zstd_size_3.kpack", 3, NULL, NULL, 0, NULL, 0, 0},
    {"zstd_size_5gib.kpack", 3, NULL, NULL, 0, NULL, 0, 0},
    {"zstd_num_kernels_huge.kpack", 3, NULL, NULL, 0, NULL, 0, 0},
    {"zstd_num_kernels_gt_frames.kpack", 3, NULL, NULL, 0, NULL, 0, 0},
    {"zstd_frame_size_past_blob.kpack", 3, NULL, NULL, 0, NULL, 0, 0},
    {"zstd_offset_missing.kpack", 3, NULL, NULL, 0, NULL, 0, 0},
    {"zstd_size_missing.kpack", 3, NULL, NULL, 0, NULL, 0, 0},
    {"zstd_num_kernels_0.kpack", 0, ZSTD_KEY, 5, NULL, 0, 0},
    {"zstd_corrupt_frame.kpack", 0, ZSTD_KEY, 6, NULL, 0, 0},
    {"zstd_original_size_minus_1.kpack", 0, ZSTD_KEY, 6, NULL, 0, 0},
    {"zstd_original_size_plus_1.kpack", 0, ZSTD_KEY, 6, NULL, 0, 0},
    {"zstd_original_size_0.kpack", 0, ZSTD_KEY, 6, NULL, 0, 0},
    {"zstd_ordinal_past_frames.kpack", 0, ZSTD_KEY, 5, NULL, 0, 0},
    {"zstd_empty_kernel.kpack", 0, ZSTD_KEY, 0, "", -1, 0},
    {"zstd_no_content_size.kpack", 0, ZSTD_KEY, 0, ZSTD_DATA},
    {"noop_no_original_size.kpack", 0, NOOP_KEY, 0, NOOP_DATA},
    {"zstd_no_original_size.kpack", 10, NULL, NULL, 0, NULL, 0, 0},
    {"dup_key_first_good.kpack", 0, NOOP_KEY, 0, NOOP_DATA},
    {"dup_key_first_bad.kpack", 0, NOOP_KEY, 5, NULL, 0, 0},
    {"empty_arch_map.kpack", 0, NOOP_KEY, 0, NOOP_DATA},
    {"digest_zstd_ok.kpack", 0, ZSTD_KEY, 0, ZSTD_DATA},
    {"digest_zstd_flipped.kpack", 0, ZSTD_KEY, 6, NULL, 0, 0},
    {"digest_zstd_flipped.kpack", 0, "lib/b.so#0", "gfx1100", 0, ZSTD_DATA},
    {"digest_noop_flipped.kpack", 0, NOOP_KEY, 6, NULL, 0, 0},
    {"digest_zstd_frame_digest_altered.kpack", 0, ZSTD_KEY, 6, NULL, 0, 0},
    {"digest_zstd_blake3_only_flipped.kpack", 0, ZSTD_KEY, 6, NULL, 0, 0},
    {"digest_zstd_blake3_only_flipped.kpack", 0, "lib/b.so#0", "gfx1100", 0, ZSTD_DATA},
    {"a_directory.kpack", 3, NULL, NULL, 0, NULL, 0, 0},
    {"does_not_exist.kpack", 2, NULL, NULL, 0, NULL, 0, 0},
};

static void ErrorMatrix_OpenAndGet(void) {
  size_t i;
  for (i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    const matrix_row* r = &rows[i];
    kpack_archive_t a = NULL;
    int rc = kpack_open(kt_join(matrix, r->file), &a);
    if (rc != r->open) {
      fprintf(stderr, "%s: open returned %d, expected %d\n", r->file, rc, r->open);
      kt_failures++;
    }
    if (rc != KPACK_SUCCESS) {
      CHECK(a == NULL);
      continue;
    }
    if (r->key) {
      void* data = NULL;
      size_t size = 0;
      rc = kpack_get_kernel(a, r->key, r->arch, &data, &size);
      if (rc != r->get) {
        fprintf(stderr, "%s: get returned %d, expected %d\n", r->file, rc, r->get);
        kt_failures++;
      } else if (rc == KPACK_SUCCESS && !kt_bytes_are(data, size, r->prefix, r->fill, r->size)) {
        fprintf(stderr, "%s: wrong kernel bytes (size %zu)\n", r->file, size);
        kt_failures++;
      } else if (rc != KPACK_SUCCESS) {
        CHECK(data == NULL);
      }
      kpack_free_kernel(data);
    }
    kpack_close(a);
  }
}

/* A binary whose arch map is empty has no kernels: not counted, not returned. */
static void ErrorMatrix_EmptyArchMapNotABinary(void) {
  kpack_archive_t a = open_ok(matrix, "empty_arch_map.kpack");
  size_t n = 99;
  const char* s = NULL;
  if (!a) return;
  CHECK_EQ(kpack_get_binary_count(a, &n), KPACK_SUCCESS);
  CHECK_EQ(n, 1);
  CHECK_EQ(kpack_get_binary(a, 0, &s), KPACK_SUCCESS);
  CHECK_STR(s, "lib/a.so#0");
  CHECK_EQ(kpack_get_binary(a, 1, &s), KPACK_ERROR_INVALID_ARGUMENT);
  kpack_close(a);
}

static void ErrorMatrix_GfxArchesLenient(void) {
  kpack_archive_t a = NULL;
  size_t n = 99;
  const char* s = NULL;
  CHECK_EQ(kpack_open(kt_join(matrix, "gfx_arches_str.kpack"), &a), KPACK_SUCCESS);
  CHECK_EQ(kpack_get_architecture_count(a, &n), KPACK_SUCCESS);
  CHECK_EQ(n, 0);
  kpack_close(a);
  a = NULL;
  CHECK_EQ(kpack_open(kt_join(matrix, "gfx_arches_ints.kpack"), &a), KPACK_SUCCESS);
  CHECK_EQ(kpack_get_architecture_count(a, &n), KPACK_SUCCESS);
  CHECK_EQ(n, 2);
  CHECK_EQ(kpack_get_architecture(a, 1, &s), KPACK_SUCCESS);
  CHECK_STR(s, "gfx906");
  kpack_close(a);
}

/* ---- kpack_enumerate_architectures -------------------------------------- */

typedef struct {
  int seen;
  int stop_after;
  char names[4][32];
} collect_t;

static bool collect_cb(const char* arch, void* user) {
  collect_t* c = (collect_t*)user;
  if (c->seen < 4) snprintf(c->names[c->seen], sizeof c->names[0], "%s", arch);
  c->seen++;
  return c->stop_after == 0 || c->seen < c->stop_after;
}

static void LoaderAPITest_EnumerateArchitectures_ValidArchive(void) {
  collect_t c;
  memset(&c, 0, sizeof c);
  CHECK_EQ(kpack_enumerate_architectures(kt_join(assets, "test_zstd.kpack"), collect_cb, &c),
           KPACK_SUCCESS);
  CHECK_EQ(c.seen, 2);
  CHECK_STR(c.names[0], "gfx1100");
  CHECK_STR(c.names[1], "gfx1101");
}

static void LoaderAPITest_EnumerateArchitectures_EarlyTermination(void) {
  collect_t c;
  memset(&c, 0, sizeof c);
  c.stop_after = 1;
  CHECK_EQ(kpack_enumerate_architectures(kt_join(assets, "test_noop.kpack"), collect_cb, &c),
           KPACK_SUCCESS);
  CHECK_EQ(c.seen, 1);
  CHECK_STR(c.names[0], "gfx900");
}

static void LoaderAPITest_EnumerateArchitectures_FileNotFound(void) {
  int calls = 0;
  CHECK_EQ(kpack_enumerate_architectures("/nonexistent/x.kpack", count_cb, &calls),
           KPACK_ERROR_FILE_NOT_FOUND);
  CHECK_EQ(kpack_enumerate_architectures(kt_join(matrix, "magic_XPAK.kpack"), count_cb, &calls),
           KPACK_ERROR_INVALID_FORMAT);
  CHECK_EQ(calls, 0);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s ASSETS_DIR MATRIX_DIR\n", argv[0]);
    return 2;
  }
  assets = argv[1];
  matrix = argv[2];
  RUN(KpackAPITest, NullArguments);
  RUN(KpackAPITest, FileNotFound);
  RUN(KpackAPITest, CloseNull);
  RUN(KpackAPITest, FreeKernel_Null);
  RUN(KpackAPITest, GetBinary_NullArchive);
  RUN(KpackAPITest, GetBinary_NullBinaryOut);
  RUN(KpackAPITest, GetBinaryCount_NullCount);
  RUN(KpackAPITest, GetArchitectureCount_NullCount);
  RUN(KpackAPITest, GetBinary_IndexOutOfRange);
  RUN(KpackAPITest, GetArchitecture_IndexOutOfRange);
  RUN(KpackAPITest, InvalidArchive_EmptyFile);
  RUN(KpackAPITest, InvalidArchive_WrongMagic);
  RUN(KpackAPITest, InvalidArchive_UnsupportedVersion);
  RUN(KpackAPITest, InvalidArchive_TruncatedHeader);
  RUN(KpackAPITest, InvalidArchive_TOCOffsetBeyondFile);
  RUN(InvalidNumericTocFieldTest, ReturnsParseError);
  RUN(OversizedTocDeclarationTest, ReturnsParseError);
  RUN(ArchiveIntegrationTest, NoOpArchive);
  RUN(ArchiveIntegrationTest, ZstdArchive);
  RUN(ArchiveIntegrationTest, GetBinaryNames);
  RUN(ArchiveIntegrationTest, GetBinaryNames_Zstd);
  RUN(ArchiveIntegrationTest, KernelCacheOverwrite);
  RUN(CApi, NullArgumentsEveryFunction);
  RUN(CApi, ZeroSizeKernel);
  RUN(ErrorMatrix, OpenAndGet);
  RUN(ErrorMatrix, GfxArchesLenient);
  RUN(ErrorMatrix, EmptyArchMapNotABinary);
  RUN(LoaderAPITest, EnumerateArchitectures_ValidArchive);
  RUN(LoaderAPITest, EnumerateArchitectures_EarlyTermination);
  RUN(LoaderAPITest, EnumerateArchitectures_FileNotFound);
  return TEST_RESULT();
}
