/*
 * loader.c - the loader half of the C API: the reference's LoaderAPITest
 * suite and every row of the loader matrix (binary D/lib/libfoo.so, embedded
 * pattern ../.kpack/foo_@GFXARCH@.kpack).
 *
 * usage: loader ASSETS_DIR SCENARIO_DIR
 *   ASSETS_DIR: test_noop.kpack, test_zstd.kpack, test_fallthrough_xnack.kpack,
 *               test_fallthrough_generic.kpack
 *   SCENARIO_DIR: one directory per matrix scenario (bare, multi, toc, corrupt,
 *                 links, two), laid out by tests/it/c_api.rs
 *
 * The environment is read when a cache is created, so each test sets the
 * variables it needs, creates its cache, and clears them again.
 */
#define _POSIX_C_SOURCE 200809L
#include <rocm_kpack/kpack.h>

#include <unistd.h>

#include "test.h"

static const char* assets;
static const char* scen;

static void clear_env(void) {
  unsetenv("ROCM_KPACK_PATH");
  unsetenv("ROCM_KPACK_PATH_PREFIX");
  unsetenv("ROCM_KPACK_DISABLE");
  unsetenv("ROCM_KPACK_DEBUG");
}

/* A cache created with the given variables set (NULL: unset). */
static kpack_cache_t cache_with(const char* path, const char* prefix, const char* disable) {
  kpack_cache_t c = NULL;
  clear_env();
  if (path) setenv("ROCM_KPACK_PATH", path, 1);
  if (prefix) setenv("ROCM_KPACK_PATH_PREFIX", prefix, 1);
  if (disable) setenv("ROCM_KPACK_DISABLE", disable, 1);
  CHECK_EQ(kpack_cache_create(&c), KPACK_SUCCESS);
  CHECK(c != NULL);
  clear_env();
  return c;
}

static kpack_cache_t plain_cache(void) { return cache_with(NULL, NULL, NULL); }

/* The reference loader tests' setup: binary ASSETS/fake_binary.so whose
 * metadata names `archive` (relative to the binary's directory). */
static mp_buf meta_for(const char* kernel_name, const char* archive) {
  mp_buf b;
  const char* paths[1];
  paths[0] = archive;
  mp_hipk(&b, kernel_name, paths, 1);
  return b;
}

static const char* fake_binary(void) { return kt_join(assets, "fake_binary.so"); }

/* Loads and checks the result code; on success also the bytes. Failure must
 * leave both outputs untouched. */
static void expect_load(kpack_cache_t c, const void* meta, const char* binary, unsigned co,
                        const char* const* arches, size_t n, int code, const char* prefix,
                        int fill, size_t size) {
  void* out = NULL;
  size_t out_size = 4242;
  int rc = kpack_load_code_object(c, meta, binary, co, arches, n, &out, &out_size);
  if (rc != code) {
    fprintf(stderr, "load co %u (first arch %s): got %d, expected %d\n", co,
            n && arches[0] ? arches[0] : "(null)", rc, code);
    kt_failures++;
  } else if (rc == KPACK_SUCCESS) {
    if (!kt_bytes_are(out, out_size, prefix, fill, size)) {
      fprintf(stderr, "load co %u: wrong bytes (size %zu, expected prefix %s)\n", co, out_size,
              prefix);
      kt_failures++;
    }
  } else {
    CHECK(out == NULL);
    CHECK_EQ(out_size, 4242);
  }
  kpack_free_code_object(out);
}

static const char* const GFX900[] = {"gfx900"};

/* ---- DiscoverBinaryPath ------------------------------------------------- */

static void LoaderAPITest_DiscoverBinaryPath_NullAddress(void) {
  char buf[256];
  CHECK_EQ(kpack_discover_binary_path(NULL, buf, sizeof buf, NULL), KPACK_ERROR_INVALID_ARGUMENT);
}

static void LoaderAPITest_DiscoverBinaryPath_NullPathOut(void) {
  CHECK_EQ(kpack_discover_binary_path((const void*)&clear_env, NULL, 256, NULL),
           KPACK_ERROR_INVALID_ARGUMENT);
}

static void LoaderAPITest_DiscoverBinaryPath_ZeroSize(void) {
  char buf[4];
  CHECK_EQ(kpack_discover_binary_path((const void*)&clear_env, buf, 0, NULL),
           KPACK_ERROR_INVALID_ARGUMENT);
}

static char program_name[256];

static void LoaderAPITest_DiscoverBinaryPath_ValidAddress(void) {
  char buf[4096];
  size_t offset = 0;
  memset(buf, 'x', sizeof buf);
  CHECK_EQ(kpack_discover_binary_path((const void*)&clear_env, buf, sizeof buf, &offset),
           KPACK_SUCCESS);
  CHECK(strstr(buf, program_name) != NULL);
  CHECK(offset > 0);
  /* Without an offset pointer too. */
  CHECK_EQ(kpack_discover_binary_path((const void*)&clear_env, buf, sizeof buf, NULL),
           KPACK_SUCCESS);
}

static void LoaderAPITest_DiscoverBinaryPath_BufferTooSmall(void) {
  char buf[4];
  size_t offset = 77;
  memcpy(buf, "abc", 4);
  CHECK_EQ(kpack_discover_binary_path((const void*)&clear_env, buf, sizeof buf, &offset),
           KPACK_ERROR_INVALID_ARGUMENT);
  CHECK_EQ(offset, 77);
}

static void CApi_DiscoverBinaryPath_Unmapped(void) {
  char buf[256];
  CHECK_EQ(kpack_discover_binary_path((const void*)(size_t)16, buf, sizeof buf, NULL),
           KPACK_ERROR_PATH_DISCOVERY_FAILED);
}

/* ---- Cache ------------------------------------------------------------- */

static void LoaderAPITest_CacheCreate_Success(void) {
  kpack_cache_t c = plain_cache();
  kpack_cache_destroy(c);
}

static void LoaderAPITest_CacheCreate_NullPointer(void) {
  CHECK_EQ(kpack_cache_create(NULL), KPACK_ERROR_INVALID_ARGUMENT);
}

static void LoaderAPITest_CacheDestroy_Null(void) { kpack_cache_destroy(NULL); }

/* The counts are checked by the Rust driver in the debug line this prints
 * ("cache created: ... override_paths=2, prefix_paths=1"); the behaviour here. */
static void LoaderAPITest_CacheCreate_ResolvesEnvVars(void) {
  kpack_cache_t c;
  mp_buf m = meta_for("lib/libtest.so", "test_noop.kpack");
  clear_env();
  setenv("ROCM_KPACK_PATH", "/test/path1:/test/path2", 1);
  setenv("ROCM_KPACK_PATH_PREFIX", "/test/prefix", 1);
  setenv("ROCM_KPACK_DEBUG", "1", 1);
  CHECK_EQ(kpack_cache_create(&c), KPACK_SUCCESS);
  clear_env();
  /* The override is exclusive: the embedded (valid) path is not tried. */
  expect_load(c, m.data, fake_binary(), 0, GFX900, 1, KPACK_ERROR_ARCHIVE_NOT_FOUND, NULL, 0, 0);
  kpack_cache_destroy(c);
  fprintf(stderr, "== end of ResolvesEnvVars ==\n");
}

/* ---- Argument checks ---------------------------------------------------- */

static void null_args(int which) {
  kpack_cache_t c = plain_cache();
  mp_buf m = meta_for("lib/libtest.so", "test_noop.kpack");
  void* out = NULL;
  size_t size = 0;
  int rc = kpack_load_code_object(which == 0 ? NULL : c, which == 1 ? NULL : m.data,
                                  which == 2 ? NULL : fake_binary(), 0,
                                  which == 3 ? NULL : GFX900, which == 4 ? 0 : 1,
                                  which == 5 ? NULL : &out, which == 6 ? NULL : &size);
  CHECK_EQ(rc, KPACK_ERROR_INVALID_ARGUMENT);
  CHECK(out == NULL);
  kpack_cache_destroy(c);
}

static void LoaderAPITest_LoadCodeObject_NullCache(void) { null_args(0); }
static void LoaderAPITest_LoadCodeObject_NullMetadata(void) { null_args(1); }
static void LoaderAPITest_LoadCodeObject_NullBinaryPath(void) { null_args(2); }
static void LoaderAPITest_LoadCodeObject_NullArchList(void) { null_args(3); }
static void LoaderAPITest_LoadCodeObject_ZeroArchCount(void) { null_args(4); }
static void LoaderAPITest_LoadCodeObject_NullCodeObjectOut(void) { null_args(5); }
static void LoaderAPITest_LoadCodeObject_NullSizeOut(void) { null_args(6); }

static void LoaderAPITest_LoadCodeObject_InvalidMetadata(void) {
  kpack_cache_t c = plain_cache();
  expect_load(c, "this is not valid msgpack data!", fake_binary(), 0, GFX900, 1,
              KPACK_ERROR_INVALID_METADATA, NULL, 0, 0);
  kpack_cache_destroy(c);
}

static void LoaderAPITest_FreeCodeObject_Null(void) { kpack_free_code_object(NULL); }

static bool never_cb(const char* arch, void* user) {
  (void)arch;
  (void)user;
  return true;
}

static void LoaderAPITest_EnumerateArchitectures_NullPath(void) {
  CHECK_EQ(kpack_enumerate_architectures(NULL, never_cb, NULL), KPACK_ERROR_INVALID_ARGUMENT);
}

static void LoaderAPITest_EnumerateArchitectures_NullCallback(void) {
  CHECK_EQ(kpack_enumerate_architectures(kt_join(assets, "test_noop.kpack"), NULL, NULL),
           KPACK_ERROR_INVALID_ARGUMENT);
}

static void LoaderAPITest_LoadCodeObject_DisabledViaEnv(void) {
  kpack_cache_t c = cache_with(NULL, NULL, "1");
  expect_load(c, "this is not valid msgpack data!", fake_binary(), 0, GFX900, 1,
              KPACK_ERROR_NOT_IMPLEMENTED, NULL, 0, 0);
  kpack_cache_destroy(c);
}

/* ---- Integration -------------------------------------------------------- */

static void LoaderAPITest_LoadCodeObject_FromNoopArchive(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m = meta_for("lib/libtest.so", "test_noop.kpack");
  expect_load(c, m.data, fake_binary(), 0, GFX900, 1, KPACK_SUCCESS, "KERNEL1_GFX900_DATA", 0, 119);
  kpack_cache_destroy(c);
}

static void LoaderAPITest_LoadCodeObject_FromZstdArchive(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m = meta_for("lib/libhip.so", "test_zstd.kpack");
  const char* const arches[] = {"gfx1100"};
  expect_load(c, m.data, fake_binary(), 0, arches, 1, KPACK_SUCCESS, "HIP_KERNEL_GFX1100_", -1, 1019);
  kpack_cache_destroy(c);
}

static void LoaderAPITest_LoadCodeObject_ArchitecturePriority(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m = meta_for("lib/libtest.so", "test_noop.kpack");
  const char* const arches[] = {"gfx906", "gfx900"};
  expect_load(c, m.data, fake_binary(), 0, arches, 2, KPACK_SUCCESS, "KERNEL2_GFX906_DATA", 0, 219);
  kpack_cache_destroy(c);
}

static void LoaderAPITest_LoadCodeObject_ArchNotFound(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m = meta_for("lib/libtest.so", "test_noop.kpack");
  const char* const arches[] = {"gfx9999"};
  expect_load(c, m.data, fake_binary(), 0, arches, 1, KPACK_ERROR_ARCH_NOT_FOUND, NULL, 0, 0);
  kpack_cache_destroy(c);
}

static void LoaderAPITest_LoadCodeObject_ArchiveNotFound(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m = meta_for("lib/libtest.so", "nonexistent.kpack");
  expect_load(c, m.data, fake_binary(), 0, GFX900, 1, KPACK_ERROR_ARCHIVE_NOT_FOUND, NULL, 0, 0);
  kpack_cache_destroy(c);
}

static void LoaderAPITest_LoadCodeObject_EnvPathOverride(void) {
  kpack_cache_t c = cache_with(kt_join(assets, "test_noop.kpack"), NULL, NULL);
  mp_buf m = meta_for("lib/libtest.so", "wrong_path.kpack");
  expect_load(c, m.data, "/some/other/path/binary.so", 0, GFX900, 1, KPACK_SUCCESS,
              "KERNEL1_GFX900_DATA", 0, 119);
  kpack_cache_destroy(c);
}

static void LoaderAPITest_LoadCodeObject_TargetTripleStripping(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m = meta_for("lib/libtest.so", "test_noop.kpack");
  const char* const arches[] = {"amdgcn-amd-amdhsa--gfx900"};
  expect_load(c, m.data, fake_binary(), 0, arches, 1, KPACK_SUCCESS, "KERNEL1_GFX900_DATA", 0, 119);
  kpack_cache_destroy(c);
}

static void LoaderAPITest_LoadCodeObject_ArchNotInArchive(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m = meta_for("lib/libhip.so", "test_zstd.kpack");
  expect_load(c, m.data, fake_binary(), 0, GFX900, 1, KPACK_ERROR_ARCH_NOT_FOUND, NULL, 0, 0);
  kpack_cache_destroy(c);
}

static void LoaderAPITest_LoadCodeObject_KernelNotFound(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m = meta_for("lib/libtest.so", "test_noop.kpack");
  expect_load(c, m.data, fake_binary(), 999, GFX900, 1, KPACK_ERROR_KERNEL_NOT_FOUND, NULL, 0, 0);
  kpack_cache_destroy(c);
}

static void LoaderAPITest_LoadCodeObject_FallsThroughToNextArchiveOnKernelNotFound(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m;
  const char* const paths[] = {"test_fallthrough_xnack.kpack", "test_fallthrough_generic.kpack"};
  const char* const arches[] = {"gfx90a:xnack-"};
  mp_hipk(&m, "lib/libtest.so", paths, 2);
  expect_load(c, m.data, fake_binary(), 0, arches, 1, KPACK_SUCCESS, "GENERIC_GFX90A_KERNEL_DATA",
              0, 76);
  kpack_cache_destroy(c);
}

/* A binary path ending in '/' names a directory: relative search paths start at that directory
 * itself (the parent of its empty last component), as in the reference, so "../x.kpack" from
 * "<dir>/sub/" is "<dir>/x.kpack". */
static void CApi_BinaryPathEndingInSlash(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m = meta_for("lib/libtest.so", "test_noop.kpack");
  mp_buf up = meta_for("lib/libtest.so", "../test_noop.kpack");
  expect_load(c, m.data, kt_join(assets, ""), 0, GFX900, 1, KPACK_SUCCESS, "KERNEL1_GFX900_DATA",
              0, 119);
  expect_load(c, up.data, kt_join(assets, "sub/"), 0, GFX900, 1, KPACK_SUCCESS,
              "KERNEL1_GFX900_DATA", 0, 119);
  /* Without the slash the last component is the binary's name, as before. */
  expect_load(c, up.data, kt_join(assets, "sub"), 0, GFX900, 1, KPACK_ERROR_ARCHIVE_NOT_FOUND,
              NULL, 0, 0);
  kpack_cache_destroy(c);
}

/* A key given twice in HIPK metadata counts once: its first occurrence, as the reference's
 * parser reads it. */
static void CApi_MetadataRepeatedKeysFirstWins(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m;
  int order;
  for (order = 0; order < 2; order++) {
    m.len = 0;
    mp_map(&m, 3);
    mp_str(&m, "kernel_name");
    mp_str(&m, order == 0 ? "lib/libtest.so" : "lib/nothere.so");
    mp_str(&m, "kpack_search_paths");
    mp_array(&m, 1);
    mp_str(&m, "test_noop.kpack");
    mp_str(&m, "kernel_name");
    mp_str(&m, order == 0 ? "lib/nothere.so" : "lib/libtest.so");
    if (order == 0)
      expect_load(c, m.data, fake_binary(), 0, GFX900, 1, KPACK_SUCCESS, "KERNEL1_GFX900_DATA", 0,
                  119);
    else
      expect_load(c, m.data, fake_binary(), 0, GFX900, 1, KPACK_ERROR_KERNEL_NOT_FOUND, NULL, 0, 0);
  }
  kpack_cache_destroy(c);
}

/* HIPK metadata with pins (`kpack_toc_pins`, written by our split): an archive whose TOC digest
 * is not pinned is not used; a malformed pins value is invalid metadata. */
static void CApi_PinsRefuseUnpinnedArchive(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m;
  unsigned char digest[32];
  int size;
  memset(digest, 0xab, sizeof digest);
  for (size = 32; size >= 31; size--) {
    m.len = 0;
    mp_map(&m, 3);
    mp_str(&m, "kpack_search_paths");
    mp_array(&m, 1);
    mp_str(&m, "test_noop.kpack");
    mp_str(&m, "kernel_name");
    mp_str(&m, "lib/libtest.so");
    mp_str(&m, "kpack_toc_pins");
    mp_array(&m, 1);
    mp_byte(&m, 0xc4);
    mp_byte(&m, (unsigned)size);
    mp_raw(&m, digest, (size_t)size);
    expect_load(c, m.data, fake_binary(), 0, GFX900, 1,
                size == 32 ? KPACK_ERROR_ARCHIVE_NOT_FOUND : KPACK_ERROR_INVALID_METADATA, NULL,
                0, 0);
  }
  kpack_cache_destroy(c);
}

static void LoaderAPITest_LoadCodeObject_ArchiveFileNotFound(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m = meta_for("lib/libtest.so", "/nonexistent/dir/archive.kpack");
  expect_load(c, m.data, fake_binary(), 0, GFX900, 1, KPACK_ERROR_ARCHIVE_NOT_FOUND, NULL, 0, 0);
  kpack_cache_destroy(c);
}

/* ---- HIPK metadata edge cases ------------------------------------------- */

static void expect_bad_metadata(const mp_buf* m) {
  kpack_cache_t c = plain_cache();
  expect_load(c, m->data, fake_binary(), 0, GFX900, 1, KPACK_ERROR_INVALID_METADATA, NULL, 0, 0);
  kpack_cache_destroy(c);
}

static void LoaderAPITest_LoadCodeObject_MissingKernelName(void) {
  mp_buf m;
  m.len = 0;
  mp_map(&m, 1);
  mp_str(&m, "kpack_search_paths");
  mp_array(&m, 1);
  mp_str(&m, "test_noop.kpack");
  expect_bad_metadata(&m);
}

static void LoaderAPITest_LoadCodeObject_MissingSearchPaths(void) {
  mp_buf m;
  m.len = 0;
  mp_map(&m, 1);
  mp_str(&m, "kernel_name");
  mp_str(&m, "lib/libtest.so");
  expect_bad_metadata(&m);
}

static void LoaderAPITest_LoadCodeObject_EmptySearchPaths(void) {
  mp_buf m;
  mp_hipk(&m, "lib/libtest.so", NULL, 0);
  expect_bad_metadata(&m);
}

static void LoaderAPITest_LoadCodeObject_WrongTypeKernelName(void) {
  mp_buf m;
  m.len = 0;
  mp_map(&m, 2);
  mp_str(&m, "kernel_name");
  mp_uint(&m, 12345);
  mp_str(&m, "kpack_search_paths");
  mp_array(&m, 1);
  mp_str(&m, "test_noop.kpack");
  expect_bad_metadata(&m);
}

static void LoaderAPITest_LoadCodeObject_WrongTypeSearchPaths(void) {
  mp_buf m;
  m.len = 0;
  mp_map(&m, 2);
  mp_str(&m, "kernel_name");
  mp_str(&m, "lib/libtest.so");
  mp_str(&m, "kpack_search_paths");
  mp_str(&m, "test_noop.kpack");
  expect_bad_metadata(&m);
}

static void LoaderAPITest_LoadCodeObject_NotAMap(void) {
  mp_buf m;
  m.len = 0;
  mp_array(&m, 2);
  mp_str(&m, "lib/libtest.so");
  mp_str(&m, "test_noop.kpack");
  expect_bad_metadata(&m);
}

/* ---- Environment edge cases --------------------------------------------- */

static void env_path_case(const char* fmt) {
  char value[4096];
  const char* p = kt_join(assets, "test_noop.kpack");
  kpack_cache_t c;
  mp_buf m = meta_for("lib/libtest.so", "wrong_path.kpack");
  snprintf(value, sizeof value, fmt, p, p);
  c = cache_with(value, NULL, NULL);
  expect_load(c, m.data, "/some/other/path/binary.so", 0, GFX900, 1, KPACK_SUCCESS,
              "KERNEL1_GFX900_DATA", 0, 119);
  kpack_cache_destroy(c);
}

static void LoaderAPITest_EnvPath_EmptyComponents(void) { env_path_case("%s::%s"); }
static void LoaderAPITest_EnvPath_TrailingColon(void) { env_path_case("%s:"); }

static void LoaderAPITest_EnvDisable_WithZero(void) {
  kpack_cache_t c = cache_with(NULL, NULL, "0");
  mp_buf m = meta_for("lib/libtest.so", "test_noop.kpack");
  expect_load(c, m.data, fake_binary(), 0, GFX900, 1, KPACK_SUCCESS, "KERNEL1_GFX900_DATA", 0, 119);
  kpack_cache_destroy(c);
}

static void LoaderAPITest_EnvDisable_WithEmpty(void) {
  kpack_cache_t c = cache_with(NULL, NULL, "");
  mp_buf m = meta_for("lib/libtest.so", "test_noop.kpack");
  expect_load(c, m.data, fake_binary(), 0, GFX900, 1, KPACK_SUCCESS, "KERNEL1_GFX900_DATA", 0, 119);
  kpack_cache_destroy(c);
}

static void LoaderAPITest_EnvPathPrefix_WithOverride(void) {
  /* Prefix names the zstd archive, override the NoOp one: only the override is used. */
  kpack_cache_t c = cache_with(kt_join(assets, "test_noop.kpack"), kt_join(assets, "test_zstd.kpack"),
                               NULL);
  mp_buf m = meta_for("lib/libhip.so", "test_zstd.kpack");
  const char* const arches[] = {"gfx1100"};
  expect_load(c, m.data, fake_binary(), 0, arches, 1, KPACK_ERROR_ARCH_NOT_FOUND, NULL, 0, 0);
  kpack_cache_destroy(c);
  /* Without the override the prefix is used, ahead of the embedded path. */
  c = cache_with(NULL, kt_join(assets, "test_zstd.kpack"), NULL);
  m = meta_for("lib/libhip.so", "nonexistent.kpack");
  expect_load(c, m.data, fake_binary(), 0, arches, 1, KPACK_SUCCESS, "HIP_KERNEL_GFX1100_", -1, 1019);
  kpack_cache_destroy(c);
}

/* ---- The loader matrix -------------------------------------------------- */

static const char* const FOO_PATTERN = "../.kpack/foo_@GFXARCH@.kpack";

static const char* foo_binary(const char* scenario) {
  static char buf[4096];
  snprintf(buf, sizeof buf, "%s/%s/lib/libfoo.so", scen, scenario);
  return buf;
}

static void matrix_case(const char* scenario, const char* const* arches, size_t n, unsigned co,
                        int code, const char* prefix) {
  kpack_cache_t c = plain_cache();
  mp_buf m = meta_for("lib/libfoo.so", FOO_PATTERN);
  expect_load(c, m.data, foo_binary(scenario), co, arches, n, code, prefix ? prefix : "", '.', 32);
  kpack_cache_destroy(c);
}

static void LoaderMatrix_BareArchive(void) {
  const char* const plain[] = {"gfx942"};
  const char* const full[] = {"amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-"};
  matrix_case("bare", plain, 1, 0, KPACK_SUCCESS, "BARE_CO0");
  matrix_case("bare", full, 1, 0, KPACK_SUCCESS, "BARE_CO0");
}

static void LoaderMatrix_XnackArchiveWins(void) {
  const char* const a[] = {"amdgcn-amd-amdhsa--gfx942:sramecc+:xnack+"};
  matrix_case("multi", a, 1, 0, KPACK_SUCCESS, "XNACKP_CO0");
}

static void LoaderMatrix_FallsThroughToBareArchive(void) {
  const char* const a[] = {"amdgcn-amd-amdhsa--gfx942:sramecc+:xnack+"};
  matrix_case("multi", a, 1, 1, KPACK_SUCCESS, "BARE_CO1");
}

static void LoaderMatrix_FallsThroughToGenericArch(void) {
  const char* const a[] = {"amdgcn-amd-amdhsa--gfx942:sramecc+:xnack+",
                           "amdgcn-amd-amdhsa--gfx9-4-generic:sramecc+:xnack+"};
  matrix_case("multi", a, 2, 2, KPACK_SUCCESS, "GENERIC_CO2");
}

static void LoaderMatrix_CodeObjectNowhere(void) {
  const char* const a[] = {"amdgcn-amd-amdhsa--gfx942:sramecc+:xnack+",
                           "amdgcn-amd-amdhsa--gfx9-4-generic:sramecc+:xnack+"};
  matrix_case("multi", a, 2, 9, KPACK_ERROR_KERNEL_NOT_FOUND, NULL);
}

static void LoaderMatrix_NoFileForArch(void) {
  const char* const a[] = {"gfx90a"};
  matrix_case("multi", a, 1, 0, KPACK_ERROR_ARCHIVE_NOT_FOUND, NULL);
}

static void LoaderMatrix_XnackMinusUsesBare(void) {
  const char* const a[] = {"gfx942:xnack-"};
  matrix_case("multi", a, 1, 0, KPACK_SUCCESS, "BARE_CO0");
}

static void LoaderMatrix_ArchOnlyInToc(void) {
  const char* const a[] = {"gfx906"};
  matrix_case("toc", a, 1, 0, KPACK_ERROR_ARCH_NOT_FOUND, NULL);
}

static void LoaderMatrix_KeyMissingForListedArch(void) {
  const char* const a[] = {"gfx900"};
  matrix_case("toc", a, 1, 1, KPACK_ERROR_KERNEL_NOT_FOUND, NULL);
  matrix_case("toc", a, 1, 0, KPACK_SUCCESS, "TOC_GFX900_CO0");
}

static void LoaderMatrix_CorruptArchiveSkipped(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m;
  const char* const both[] = {"../.kpack/corrupt.kpack", "../.kpack/good.kpack"};
  const char* const only[] = {"../.kpack/corrupt.kpack"};
  const char* const a[] = {"gfx942"};
  mp_hipk(&m, "lib/libfoo.so", both, 2);
  expect_load(c, m.data, foo_binary("corrupt"), 0, a, 1, KPACK_SUCCESS, "GOOD_CO0", '.', 32);
  mp_hipk(&m, "lib/libfoo.so", only, 1);
  expect_load(c, m.data, foo_binary("corrupt"), 0, a, 1, KPACK_ERROR_ARCHIVE_NOT_FOUND, NULL, 0, 0);
  kpack_cache_destroy(c);
}

static void LoaderMatrix_ArchListOrder(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m;
  const char* const paths[] = {kt_join(assets, "test_zstd.kpack")};
  const char* const a[] = {"gfx1101", "gfx1100"};
  mp_hipk(&m, "lib/libhip.so", paths, 1);
  expect_load(c, m.data, foo_binary("bare"), 0, a, 2, KPACK_SUCCESS, "HIP_KERNEL_GFX1101_", -1, 619);
  kpack_cache_destroy(c);
}

static void LoaderMatrix_NullArchEntries(void) {
  const char* const only_null[] = {NULL};
  const char* const null_first[] = {NULL, "gfx942"};
  matrix_case("bare", only_null, 1, 0, KPACK_ERROR_ARCHIVE_NOT_FOUND, NULL);
  matrix_case("bare", null_first, 2, 0, KPACK_SUCCESS, "BARE_CO0");
}

static void LoaderMatrix_AbsoluteAndSymlinkedPaths(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m;
  const char* const abs_path[] = {kt_join(assets, "test_noop.kpack")};
  const char* const link[] = {"../.kpack/link.kpack"};
  mp_hipk(&m, "lib/libtest.so", abs_path, 1);
  expect_load(c, m.data, foo_binary("links"), 0, GFX900, 1, KPACK_SUCCESS, "KERNEL1_GFX900_DATA", 0, 119);
  mp_hipk(&m, "lib/libtest.so", link, 1);
  expect_load(c, m.data, foo_binary("links"), 0, GFX900, 1, KPACK_SUCCESS, "KERNEL1_GFX900_DATA", 0, 119);
  kpack_cache_destroy(c);
}

static void LoaderMatrix_EnvPathVariants(void) {
  char cwd[4096];
  kpack_cache_t c;
  char pattern[4096];
  mp_buf m = meta_for("lib/libtest.so", "wrong_path.kpack");
  /* @GFXARCH@ is not expanded in ROCM_KPACK_PATH. */
  snprintf(pattern, sizeof pattern, "%s/test_@GFXARCH@.kpack", assets);
  c = cache_with(pattern, NULL, NULL);
  expect_load(c, m.data, "/x/b.so", 0, GFX900, 1, KPACK_ERROR_ARCHIVE_NOT_FOUND, NULL, 0, 0);
  kpack_cache_destroy(c);
  /* A directory is not an archive. */
  c = cache_with(assets, NULL, NULL);
  expect_load(c, m.data, "/x/b.so", 0, GFX900, 1, KPACK_ERROR_ARCHIVE_NOT_FOUND, NULL, 0, 0);
  kpack_cache_destroy(c);
  /* A relative entry is relative to the current directory. */
  CHECK(getcwd(cwd, sizeof cwd) != NULL);
  CHECK_EQ(chdir(assets), 0);
  c = cache_with("test_noop.kpack", NULL, NULL);
  expect_load(c, m.data, "/x/b.so", 0, GFX900, 1, KPACK_SUCCESS, "KERNEL1_GFX900_DATA", 0, 119);
  kpack_cache_destroy(c);
  CHECK_EQ(chdir(cwd), 0);
}

static void LoaderMatrix_DisableValues(void) {
  mp_buf m = meta_for("lib/libtest.so", "test_noop.kpack");
  kpack_cache_t c = cache_with(NULL, NULL, "false");
  expect_load(c, m.data, fake_binary(), 0, GFX900, 1, KPACK_ERROR_NOT_IMPLEMENTED, NULL, 0, 0);
  kpack_cache_destroy(c);
  c = cache_with(NULL, NULL, "00");
  expect_load(c, m.data, fake_binary(), 0, GFX900, 1, KPACK_SUCCESS, "KERNEL1_GFX900_DATA", 0, 119);
  kpack_cache_destroy(c);
}

static void LoaderMatrix_MetadataVariants(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m;
  /* Non-str entries mixed in are skipped. */
  m.len = 0;
  mp_map(&m, 2);
  mp_str(&m, "kpack_search_paths");
  mp_array(&m, 3);
  mp_uint(&m, 7);
  mp_bin(&m, "nope.kpack");
  mp_str(&m, "test_noop.kpack");
  mp_str(&m, "kernel_name");
  mp_str(&m, "lib/libtest.so");
  expect_load(c, m.data, fake_binary(), 0, GFX900, 1, KPACK_SUCCESS, "KERNEL1_GFX900_DATA", 0, 119);
  /* All non-str. */
  m.len = 0;
  mp_map(&m, 2);
  mp_str(&m, "kpack_search_paths");
  mp_array(&m, 2);
  mp_uint(&m, 7);
  mp_bin(&m, "test_noop.kpack");
  mp_str(&m, "kernel_name");
  mp_str(&m, "lib/libtest.so");
  expect_load(c, m.data, fake_binary(), 0, GFX900, 1, KPACK_ERROR_INVALID_METADATA, NULL, 0, 0);
  /* kernel_name as bin. */
  m.len = 0;
  mp_map(&m, 2);
  mp_str(&m, "kpack_search_paths");
  mp_array(&m, 1);
  mp_str(&m, "test_noop.kpack");
  mp_str(&m, "kernel_name");
  mp_bin(&m, "lib/libtest.so");
  expect_load(c, m.data, fake_binary(), 0, GFX900, 1, KPACK_ERROR_INVALID_METADATA, NULL, 0, 0);
  /* Keys as bin. */
  m.len = 0;
  mp_map(&m, 2);
  mp_bin(&m, "kpack_search_paths");
  mp_array(&m, 1);
  mp_str(&m, "test_noop.kpack");
  mp_bin(&m, "kernel_name");
  mp_str(&m, "lib/libtest.so");
  expect_load(c, m.data, fake_binary(), 0, GFX900, 1, KPACK_ERROR_INVALID_METADATA, NULL, 0, 0);
  /* Extra keys and trailing junk. */
  m.len = 0;
  mp_map(&m, 3);
  mp_str(&m, "kernel_name");
  mp_str(&m, "lib/libtest.so");
  mp_str(&m, "something_else");
  mp_array(&m, 2);
  mp_uint(&m, 1);
  mp_uint(&m, 2);
  mp_str(&m, "kpack_search_paths");
  mp_array(&m, 1);
  mp_str(&m, "test_noop.kpack");
  mp_raw(&m, "\xc1\xc1 trailing junk", 15);
  expect_load(c, m.data, fake_binary(), 0, GFX900, 1, KPACK_SUCCESS, "KERNEL1_GFX900_DATA", 0, 119);
  kpack_cache_destroy(c);
}

static void LoaderMatrix_OnlyFirstTokenReplaced(void) {
  kpack_cache_t c = plain_cache();
  mp_buf m = meta_for("lib/libfoo.so", "../.kpack/foo_@GFXARCH@_@GFXARCH@.kpack");
  const char* const a[] = {"gfx942"};
  /* two/.kpack holds foo_gfx942_gfx942.kpack, which only a replace-all would find. */
  expect_load(c, m.data, foo_binary("two"), 0, a, 1, KPACK_ERROR_ARCHIVE_NOT_FOUND, NULL, 0, 0);
  kpack_cache_destroy(c);
}

static void LoaderMatrix_EmptyAndBarePrefixArch(void) {
  const char* const empty[] = {""};
  const char* const bare[] = {"amdgcn-amd-amdhsa--"};
  matrix_case("bare", empty, 1, 0, KPACK_ERROR_ARCHIVE_NOT_FOUND, NULL);
  matrix_case("bare", bare, 1, 0, KPACK_ERROR_ARCHIVE_NOT_FOUND, NULL);
}

int main(int argc, char** argv) {
  const char* slash;
  if (argc != 3) {
    fprintf(stderr, "usage: %s ASSETS_DIR SCENARIO_DIR\n", argv[0]);
    return 2;
  }
  assets = argv[1];
  scen = argv[2];
  slash = strrchr(argv[0], '/');
  snprintf(program_name, sizeof program_name, "%s", slash ? slash + 1 : argv[0]);
  RUN(LoaderAPITest, DiscoverBinaryPath_NullAddress);
  RUN(LoaderAPITest, DiscoverBinaryPath_NullPathOut);
  RUN(LoaderAPITest, DiscoverBinaryPath_ZeroSize);
  RUN(LoaderAPITest, DiscoverBinaryPath_ValidAddress);
  RUN(LoaderAPITest, DiscoverBinaryPath_BufferTooSmall);
  RUN(CApi, DiscoverBinaryPath_Unmapped);
  RUN(LoaderAPITest, CacheCreate_Success);
  RUN(LoaderAPITest, CacheCreate_NullPointer);
  RUN(LoaderAPITest, CacheDestroy_Null);
  RUN(LoaderAPITest, CacheCreate_ResolvesEnvVars);
  RUN(LoaderAPITest, LoadCodeObject_NullCache);
  RUN(LoaderAPITest, LoadCodeObject_NullMetadata);
  RUN(LoaderAPITest, LoadCodeObject_NullBinaryPath);
  RUN(LoaderAPITest, LoadCodeObject_NullArchList);
  RUN(LoaderAPITest, LoadCodeObject_ZeroArchCount);
  RUN(LoaderAPITest, LoadCodeObject_NullCodeObjectOut);
  RUN(LoaderAPITest, LoadCodeObject_NullSizeOut);
  RUN(LoaderAPITest, LoadCodeObject_InvalidMetadata);
  RUN(LoaderAPITest, FreeCodeObject_Null);
  RUN(LoaderAPITest, EnumerateArchitectures_NullPath);
  RUN(LoaderAPITest, EnumerateArchitectures_NullCallback);
  RUN(LoaderAPITest, LoadCodeObject_DisabledViaEnv);
  RUN(LoaderAPITest, LoadCodeObject_FromNoopArchive);
  RUN(LoaderAPITest, LoadCodeObject_FromZstdArchive);
  RUN(LoaderAPITest, LoadCodeObject_ArchitecturePriority);
  RUN(LoaderAPITest, LoadCodeObject_ArchNotFound);
  RUN(LoaderAPITest, LoadCodeObject_ArchiveNotFound);
  RUN(LoaderAPITest, LoadCodeObject_EnvPathOverride);
  RUN(LoaderAPITest, LoadCodeObject_TargetTripleStripping);
  RUN(LoaderAPITest, LoadCodeObject_ArchNotInArchive);
  RUN(LoaderAPITest, LoadCodeObject_KernelNotFound);
  RUN(LoaderAPITest, LoadCodeObject_FallsThroughToNextArchiveOnKernelNotFound);
  RUN(CApi, BinaryPathEndingInSlash);
  RUN(CApi, MetadataRepeatedKeysFirstWins);
  RUN(CApi, PinsRefuseUnpinnedArchive);
  RUN(LoaderAPITest, LoadCodeObject_ArchiveFileNotFound);
  RUN(LoaderAPITest, LoadCodeObject_MissingKernelName);
  RUN(LoaderAPITest, LoadCodeObject_MissingSearchPaths);
  RUN(LoaderAPITest, LoadCodeObject_EmptySearchPaths);
  RUN(LoaderAPITest, LoadCodeObject_WrongTypeKernelName);
  RUN(LoaderAPITest, LoadCodeObject_WrongTypeSearchPaths);
  RUN(LoaderAPITest, LoadCodeObject_NotAMap);
  RUN(LoaderAPITest, EnvPath_EmptyComponents);
  RUN(LoaderAPITest, EnvPath_TrailingColon);
  RUN(LoaderAPITest, EnvDisable_WithZero);
  RUN(LoaderAPITest, EnvDisable_WithEmpty);
  RUN(LoaderAPITest, EnvPathPrefix_WithOverride);
  RUN(LoaderMatrix, BareArchive);
  RUN(LoaderMatrix, XnackArchiveWins);
  RUN(LoaderMatrix, FallsThroughToBareArchive);
  RUN(LoaderMatrix, FallsThroughToGenericArch);
  RUN(LoaderMatrix, CodeObjectNowhere);
  RUN(LoaderMatrix, NoFileForArch);
  RUN(LoaderMatrix, XnackMinusUsesBare);
  RUN(LoaderMatrix, ArchOnlyInToc);
  RUN(LoaderMatrix, KeyMissingForListedArch);
  RUN(LoaderMatrix, CorruptArchiveSkipped);
  RUN(LoaderMatrix, ArchListOrder);
  RUN(LoaderMatrix, NullArchEntries);
  RUN(LoaderMatrix, AbsoluteAndSymlinkedPaths);
  RUN(LoaderMatrix, EnvPathVariants);
  RUN(LoaderMatrix, DisableValues);
  RUN(LoaderMatrix, MetadataVariants);
  RUN(LoaderMatrix, OnlyFirstTokenReplaced);
  RUN(LoaderMatrix, EmptyAndBarePrefixArch);
  return TEST_RESULT();
}
