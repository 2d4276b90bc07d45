/*
 * hipk_host.c - a stand-in for a HIP host binary whose device code was moved
 * into .kpack archives: its HIPK metadata lives in a .rocm_kpack_ref section
 * and two HIPK wrappers in .hipFatBinSegment point at it, as the kpack
 * transform leaves them. Like the HIP runtime, it finds its own file with
 * kpack_discover_binary_path (from the metadata's address) and loads code
 * objects from ../.kpack/hostapp_@GFXARCH@.kpack relative to that file.
 *
 * Installed by tests/it/c_api.rs as PREFIX/bin/hostapp next to
 * PREFIX/.kpack/hostapp_{gfx90a:xnack+,gfx90a:xnack-,gfx90a,gfx9-generic}.kpack.
 */
#define _POSIX_C_SOURCE 200809L
#include <rocm_kpack/kpack.h>

#include <fcntl.h>
#include <unistd.h>

#include "test.h"

/* {"kpack_search_paths": ["../.kpack/hostapp_@GFXARCH@.kpack"],
 *  "kernel_name": "bin/hostapp"} as the kpack transform writes it. */
__attribute__((section(".rocm_kpack_ref"), used))
static const char kpack_ref[] =
    "\x82"
    "\xb2" "kpack_search_paths"
    "\x91" "\xd9\x21" "../.kpack/hostapp_@GFXARCH@.kpack"
    "\xab" "kernel_name"
    "\xab" "bin/hostapp";

/* The 24-byte __CudaFatBinaryWrapper layout with the HIPK magic; reserved1
 * holds the code-object index. */
typedef struct {
  uint32_t magic;
  uint32_t version;
  const void* binary;
  uint64_t reserved1;
} hip_wrapper;

__attribute__((section(".hipFatBinSegment"), used))
static hip_wrapper wrappers[2] = {
    {0x4B504948u, 1, kpack_ref, 0},
    {0x4B504948u, 1, kpack_ref, 1},
};

static char self_path[4096];

static void HipkHost_DiscoversOwnPath(void) {
  size_t offset = 0;
  char buf[sizeof kpack_ref];
  int fd;
  const char* tail = "/bin/hostapp";
  size_t n;
  CHECK_EQ(kpack_discover_binary_path(kpack_ref, self_path, sizeof self_path, &offset), KPACK_SUCCESS);
  n = strlen(self_path);
  CHECK(n > strlen(tail) && strcmp(self_path + n - strlen(tail), tail) == 0);
  /* The offset names the metadata's bytes in the file. */
  fd = open(self_path, O_RDONLY);
  CHECK(fd >= 0);
  CHECK_EQ(pread(fd, buf, sizeof kpack_ref - 1, (off_t)offset), (long long)(sizeof kpack_ref - 1));
  CHECK(memcmp(buf, kpack_ref, sizeof kpack_ref - 1) == 0);
  close(fd);
  CHECK_EQ(wrappers[1].reserved1, 1);
}

static void load_case(const char* const* arches, size_t n, unsigned co, int code, const char* prefix) {
  kpack_cache_t cache = NULL;
  void* out = NULL;
  size_t size = 0;
  int rc;
  CHECK_EQ(kpack_cache_create(&cache), KPACK_SUCCESS);
  rc = kpack_load_code_object(cache, wrappers[co < 2 ? co : 0].binary, self_path, co, arches, n,
                              &out, &size);
  if (rc != code) {
    fprintf(stderr, "co %u on %s: got %d, expected %d\n", co, arches[0], rc, code);
    kt_failures++;
  } else if (rc == KPACK_SUCCESS && !kt_bytes_are(out, size, prefix, '.', 32)) {
    fprintf(stderr, "co %u on %s: wrong bytes\n", co, arches[0]);
    kt_failures++;
  }
  kpack_free_code_object(out);
  kpack_cache_destroy(cache);
}

static const char* const XNACK_ON[] = {"amdgcn-amd-amdhsa--gfx90a:xnack+"};
static const char* const XNACK_OFF[] = {"amdgcn-amd-amdhsa--gfx90a:xnack-"};

static void HipkHost_XnackArchiveFirst(void) {
  load_case(XNACK_ON, 1, 0, KPACK_SUCCESS, "HOST_CO0_XNACKP");
  load_case(XNACK_OFF, 1, 1, KPACK_SUCCESS, "HOST_CO1_XNACKM");
}

static void HipkHost_FallsBackToBareArchive(void) {
  load_case(XNACK_OFF, 1, 0, KPACK_SUCCESS, "HOST_CO0_GFX90A");
  load_case(XNACK_ON, 1, 1, KPACK_SUCCESS, "HOST_CO1_GFX90A");
}

static void HipkHost_GenericArchive(void) {
  const char* const gfx906[] = {"amdgcn-amd-amdhsa--gfx906:xnack-",
                                "amdgcn-amd-amdhsa--gfx9-generic:xnack-"};
  load_case(gfx906, 2, 0, KPACK_SUCCESS, "HOST_CO0_GFX9GEN");
}

static void HipkHost_Misses(void) {
  const char* const gfx1100[] = {"amdgcn-amd-amdhsa--gfx1100"};
  load_case(gfx1100, 1, 0, KPACK_ERROR_ARCHIVE_NOT_FOUND, NULL);
  load_case(XNACK_ON, 1, 5, KPACK_ERROR_KERNEL_NOT_FOUND, NULL);
}

int main(void) {
  RUN(HipkHost, DiscoversOwnPath);
  RUN(HipkHost, XnackArchiveFirst);
  RUN(HipkHost, FallsBackToBareArchive);
  RUN(HipkHost, GenericArchive);
  RUN(HipkHost, Misses);
  return TEST_RESULT();
}
