/*
 * threads.c - concurrency through the C API: many threads loading through one
 * cache, and many threads fetching from one archive handle.
 *
 * usage: threads ASSETS_DIR SCENARIO_DIR
 *
 * Run with ROCM_KPACK_DEBUG=1: the Rust driver counts the "opened and cached
 * archive" lines between the "== phase NAME ==" markers this program prints,
 * which is how "each archive is opened exactly once per cache" is checked from
 * outside the library.
 */
#define _POSIX_C_SOURCE 200809L
#include <rocm_kpack/kpack.h>

#include <pthread.h>

#include "test.h"

static const char* assets;
static const char* scen;
static kpack_cache_t shared_cache;
static kpack_archive_t shared_archive;
static mp_buf noop_meta;
static mp_buf foo_meta;
static char fake_binary[4096];
static char foo_binary[4096];
static int thread_failures;
static pthread_mutex_t failures_lock = PTHREAD_MUTEX_INITIALIZER;

static void phase(const char* name) { fprintf(stderr, "== phase %s ==\n", name); }

static void fail(const char* what, int rc) {
  pthread_mutex_lock(&failures_lock);
  thread_failures++;
  fprintf(stderr, "thread failure: %s (rc %d)\n", what, rc);
  pthread_mutex_unlock(&failures_lock);
}

static void run_threads(int n, void* (*fn)(void*)) {
  pthread_t t[16];
  long i;
  thread_failures = 0;
  for (i = 0; i < n; i++) CHECK_EQ(pthread_create(&t[i], NULL, fn, (void*)i), 0);
  for (i = 0; i < n; i++) CHECK_EQ(pthread_join(t[i], NULL), 0);
  CHECK_EQ(thread_failures, 0);
}

static void load_noop(const char* arch, const char* prefix, size_t size) {
  const char* arches[1];
  void* out = NULL;
  size_t n = 0;
  int rc;
  arches[0] = arch;
  rc = kpack_load_code_object(shared_cache, noop_meta.data, fake_binary, 0, arches, 1, &out, &n);
  if (rc != KPACK_SUCCESS) fail("load", rc);
  else if (!kt_bytes_are(out, n, prefix, 0, size)) fail("load bytes", rc);
  kpack_free_code_object(out);
}

static void LoaderAPITest_CacheReusesArchives(void) {
  phase("fresh");
  CHECK_EQ(kpack_cache_create(&shared_cache), KPACK_SUCCESS);
  kpack_cache_destroy(shared_cache);
}

static void LoaderAPITest_LoadCodeObject_CacheReusesArchive(void) {
  phase("two_loads");
  CHECK_EQ(kpack_cache_create(&shared_cache), KPACK_SUCCESS);
  load_noop("gfx900", "KERNEL1_GFX900_DATA", 119);
  load_noop("gfx900", "KERNEL1_GFX900_DATA", 119);
  CHECK_EQ(thread_failures, 0);
  kpack_cache_destroy(shared_cache);
}

static void* alternating_loads(void* arg) {
  long id = (long)arg;
  int i;
  for (i = 0; i < 50; i++) {
    if ((i + id) % 2 == 0) load_noop("gfx900", "KERNEL1_GFX900_DATA", 119);
    else load_noop("gfx906", "KERNEL2_GFX906_DATA", 219);
  }
  return NULL;
}

static void LoaderAPITest_ThreadSafety_ConcurrentLoadCodeObject(void) {
  phase("concurrent_loads");
  CHECK_EQ(kpack_cache_create(&shared_cache), KPACK_SUCCESS);
  run_threads(8, alternating_loads);
  kpack_cache_destroy(shared_cache);
}

static void* one_load(void* arg) {
  (void)arg;
  load_noop("gfx900", "KERNEL1_GFX900_DATA", 119);
  return NULL;
}

static void LoaderAPITest_ThreadSafety_ConcurrentArchiveCaching(void) {
  phase("concurrent_caching");
  CHECK_EQ(kpack_cache_create(&shared_cache), KPACK_SUCCESS);
  run_threads(10, one_load);
  kpack_cache_destroy(shared_cache);
}

/* Three archives on one search path (xnack+, bare, generic): 8 threads x 50
 * loads of different code objects; each archive must be opened once. */
static void* multi_loads(void* arg) {
  long id = (long)arg;
  const char* const arches[] = {"amdgcn-amd-amdhsa--gfx942:sramecc+:xnack+",
                                "amdgcn-amd-amdhsa--gfx9-4-generic:sramecc+:xnack+"};
  static const char* const expect[] = {"XNACKP_CO0", "BARE_CO1", "GENERIC_CO2"};
  int i;
  for (i = 0; i < 50; i++) {
    unsigned co = (unsigned)((i + id) % 3);
    void* out = NULL;
    size_t n = 0;
    int rc = kpack_load_code_object(shared_cache, foo_meta.data, foo_binary, co, arches, 2, &out, &n);
    if (rc != KPACK_SUCCESS) fail("multi load", rc);
    else if (!kt_bytes_are(out, n, expect[co], '.', 32)) fail("multi load bytes", rc);
    kpack_free_code_object(out);
  }
  return NULL;
}

static void ThreadSafety_ConcurrentLoadsAcrossArchives(void) {
  phase("concurrent_multi");
  CHECK_EQ(kpack_cache_create(&shared_cache), KPACK_SUCCESS);
  run_threads(8, multi_loads);
  kpack_cache_destroy(shared_cache);
}

static void* alternating_gets(void* arg) {
  long id = (long)arg;
  int i;
  for (i = 0; i < 50; i++) {
    void* out = NULL;
    size_t n = 0;
    int rc;
    if ((i + id) % 2 == 0) {
      rc = kpack_get_kernel(shared_archive, "lib/libhip.so#0", "gfx1100", &out, &n);
      if (rc != KPACK_SUCCESS || !kt_bytes_are(out, n, "HIP_KERNEL_GFX1100_", -1, 1019))
        fail("get libhip", rc);
    } else {
      rc = kpack_get_kernel(shared_archive, "bin/hiptest#0", "gfx1100", &out, &n);
      if (rc != KPACK_SUCCESS || !kt_bytes_are(out, n, "TEST_APP_KERNEL___", 0x42, 1018))
        fail("get hiptest", rc);
    }
    kpack_free_kernel(out);
  }
  return NULL;
}

static void* alternating_gets_noop(void* arg) {
  long id = (long)arg;
  int i;
  for (i = 0; i < 50; i++) {
    void* out = NULL;
    size_t n = 0;
    int rc;
    if ((i + id) % 2 == 0) {
      rc = kpack_get_kernel(shared_archive, "lib/libtest.so#0", "gfx900", &out, &n);
      if (rc != KPACK_SUCCESS || !kt_bytes_are(out, n, "KERNEL1_GFX900_DATA", 0, 119))
        fail("get libtest", rc);
    } else {
      rc = kpack_get_kernel(shared_archive, "bin/testapp#0", "gfx900", &out, &n);
      if (rc != KPACK_SUCCESS || !kt_bytes_are(out, n, "KERNEL3_APP_GFX900", 0xff, 168))
        fail("get testapp", rc);
    }
    kpack_free_kernel(out);
  }
  return NULL;
}

static void ArchiveIntegrationTest_ThreadSafety_ConcurrentGetKernel(void) {
  phase("concurrent_gets");
  CHECK_EQ(kpack_open(kt_join(assets, "test_noop.kpack"), &shared_archive), KPACK_SUCCESS);
  run_threads(8, alternating_gets_noop);
  kpack_close(shared_archive);
  CHECK_EQ(kpack_open(kt_join(assets, "test_zstd.kpack"), &shared_archive), KPACK_SUCCESS);
  run_threads(8, alternating_gets);
  kpack_close(shared_archive);
}

int main(int argc, char** argv) {
  const char* noop_paths[1];
  const char* foo_paths[1];
  if (argc != 3) {
    fprintf(stderr, "usage: %s ASSETS_DIR SCENARIO_DIR\n", argv[0]);
    return 2;
  }
  assets = argv[1];
  scen = argv[2];
  snprintf(fake_binary, sizeof fake_binary, "%s/fake_binary.so", assets);
  snprintf(foo_binary, sizeof foo_binary, "%s/multi/lib/libfoo.so", scen);
  noop_paths[0] = "test_noop.kpack";
  mp_hipk(&noop_meta, "lib/libtest.so", noop_paths, 1);
  foo_paths[0] = "../.kpack/foo_@GFXARCH@.kpack";
  mp_hipk(&foo_meta, "lib/libfoo.so", foo_paths, 1);
  RUN(LoaderAPITest, CacheReusesArchives);
  RUN(LoaderAPITest, LoadCodeObject_CacheReusesArchive);
  RUN(LoaderAPITest, ThreadSafety_ConcurrentLoadCodeObject);
  RUN(LoaderAPITest, ThreadSafety_ConcurrentArchiveCaching);
  RUN(ThreadSafety, ConcurrentLoadsAcrossArchives);
  RUN(ArchiveIntegrationTest, ThreadSafety_ConcurrentGetKernel);
  phase("end");
  return TEST_RESULT();
}
