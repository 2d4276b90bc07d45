/*
 * split_load.c - a host binary rewritten by `kpack-fuse split`, loaded the way
 * the HIP runtime loads one: each .hipFatBinSegment wrapper's `binary` pointer
 * is the HIPK metadata, kpack_discover_binary_path on it names the binary's
 * file, and kpack_load_code_object(cache, wrapper->binary, path,
 * (uint32_t)wrapper->reserved1, isa_list, ...) returns the code object.
 *
 * usage: split_load dlopen LIB EXPECT_DIR ARCH...
 *        split_load file   BIN EXPECT_DIR ARCH...
 *   dlopen: LIB (a canonical path) is dlopened; the wrappers are read in memory
 *           through the exported symbol `hip_wrappers`, and their pointers are
 *           given to the loader as the runtime gives them.
 *   file:   nothing is loaded (for binaries whose dependencies are absent);
 *           the wrappers and the marker are read from BIN's section table,
 *           and the marker's bytes are handed to the loader in a buffer of
 *           exactly their size (so AddressSanitizer sees any over-read).
 *   EXPECT_DIR/<i>_<arch>.bin holds the original code object of wrapper i for
 *   ARCH (a bare target such as gfx90a:xnack-); the program asks the loader
 *   for "amdgcn-amd-amdhsa--<ARCH>", the ISA name the runtime uses.
 */
#define _POSIX_C_SOURCE 200809L
#include <rocm_kpack/kpack.h>

#include <dlfcn.h>
#include <elf.h>
#include <stdint.h>

#include "test.h"

#define HIPK_MAGIC 0x4B504948u

typedef struct {
  uint32_t magic;
  uint32_t version;
  const void* binary;
  uint64_t reserved1;
} hip_wrapper;

static const char* bin_path;
static const char* expect_dir;
static char** arches;
static int arch_count;

static unsigned char* file_bytes;
static size_t file_size;
static const Elf64_Shdr* marker;  /* .rocm_kpack_ref */
static const Elf64_Shdr* segment; /* .hipFatBinSegment */
static size_t wrapper_count;
static const hip_wrapper* live_wrappers; /* dlopen mode: the wrappers in memory */

/* Reads a whole file into a malloc'd buffer of exactly its size (NULL on error). */
static unsigned char* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  unsigned char* data;
  long n;
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return NULL;
  }
  data = (unsigned char*)malloc(n ? (size_t)n : 1);
  if (data && fread(data, 1, (size_t)n, f) != (size_t)n) {
    free(data);
    data = NULL;
  }
  fclose(f);
  *size = (size_t)n;
  return data;
}

/* A section header by name, bounds-checked against the file. Headers are copied out, not
 * pointed at: the reference rewriter appends the table at whatever offset the file ended, so in
 * memory it may be misaligned. Up to four results stay valid at once. */
static const Elf64_Shdr* find_section(const char* name) {
  static Elf64_Shdr found[4];
  static size_t next;
  Elf64_Ehdr eh;
  Elf64_Shdr names, sh;
  size_t i;
  if (file_size < sizeof eh) return NULL;
  memcpy(&eh, file_bytes, sizeof eh);
  if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) return NULL;
  if (eh.e_shoff > file_size || eh.e_shnum > (file_size - eh.e_shoff) / sizeof sh) return NULL;
  if (eh.e_shstrndx >= eh.e_shnum) return NULL;
  memcpy(&names, file_bytes + eh.e_shoff + eh.e_shstrndx * sizeof sh, sizeof names);
  for (i = 0; i < eh.e_shnum; i++) {
    size_t at;
    memcpy(&sh, file_bytes + eh.e_shoff + i * sizeof sh, sizeof sh);
    at = names.sh_offset + sh.sh_name;
    if (at < file_size && strncmp((const char*)file_bytes + at, name, file_size - at) == 0 &&
        sh.sh_offset <= file_size && sh.sh_size <= file_size - sh.sh_offset) {
      found[next % 4] = sh;
      return &found[next++ % 4];
    }
  }
  return NULL;
}

/* The wrapper as stored in the file. */
static const hip_wrapper* file_wrapper(size_t i) {
  return (const hip_wrapper*)(file_bytes + segment->sh_offset + i * sizeof(hip_wrapper));
}

/* Loads wrapper i's code object for `arch` with `meta` as the metadata pointer and checks it
 * against EXPECT_DIR/<i>_<arch>.bin. `first` (or NULL) is put before the arch in the ISA
 * list, to exercise the arch-by-arch fall-through. */
static void load_and_compare(kpack_cache_t cache, const void* meta, const char* path, size_t i,
                             uint64_t reserved1, const char* arch, const char* first) {
  char isa[128];
  char name[256];
  const char* list[2];
  size_t n = 0, want_size = 0, size = 0;
  void* out = NULL;
  unsigned char* want;
  int rc;
  snprintf(isa, sizeof isa, "amdgcn-amd-amdhsa--%s", arch);
  if (first) list[n++] = first;
  list[n++] = isa;
  snprintf(name, sizeof name, "%zu_%s.bin", i, arch);
  want = read_file(kt_join(expect_dir, name), &want_size);
  CHECK(want != NULL);
  rc = kpack_load_code_object(cache, meta, path, (uint32_t)reserved1, list, n, &out, &size);
  if (rc != KPACK_SUCCESS) {
    fprintf(stderr, "wrapper %zu, %s: kpack_load_code_object returned %d\n", i, isa, rc);
    kt_failures++;
  } else if (want == NULL || size != want_size || memcmp(out, want, size) != 0) {
    fprintf(stderr, "wrapper %zu, %s: %zu bytes loaded differ from the original's %zu\n", i, isa,
            size, want_size);
    kt_failures++;
  }
  kpack_free_code_object(out);
  free(want);
}

/* ---- file mode (and the file-side checks of dlopen mode) ---------------- */

static void SplitFile_WrappersInFile(void) {
  size_t i;
  CHECK(wrapper_count > 0);
  for (i = 0; i < wrapper_count; i++) {
    const hip_wrapper* w = file_wrapper(i);
    CHECK_EQ(w->magic, HIPK_MAGIC);
    CHECK_EQ(w->version, 1);
    CHECK_EQ((uintptr_t)w->binary, marker->sh_addr);
    CHECK_EQ((uint32_t)w->reserved1, i);
  }
}

static void SplitFile_LoadCodeObjects(void) {
  kpack_cache_t cache = NULL;
  unsigned char* meta = (unsigned char*)malloc(marker->sh_size);
  size_t i;
  int a;
  CHECK(meta != NULL);
  memcpy(meta, file_bytes + marker->sh_offset, marker->sh_size);
  CHECK_EQ(kpack_cache_create(&cache), KPACK_SUCCESS);
  for (i = 0; i < wrapper_count; i++)
    for (a = 0; a < arch_count; a++)
      load_and_compare(cache, meta, bin_path, i, file_wrapper(i)->reserved1, arches[a], NULL);
  kpack_cache_destroy(cache);
  free(meta);
}

/* ---- dlopen mode -------------------------------------------------------- */

static void SplitLoad_WrappersInMemory(void) {
  size_t i;
  for (i = 0; i < wrapper_count; i++) {
    const hip_wrapper* w = &live_wrappers[i];
    CHECK_EQ(w->magic, HIPK_MAGIC);
    CHECK_EQ(w->version, 1);
    CHECK_EQ(w->reserved1, i);
    /* Relocated to the marker as loaded: its bytes are the section's. */
    CHECK(memcmp(w->binary, file_bytes + marker->sh_offset, marker->sh_size) == 0);
  }
}

static void SplitLoad_DiscoverBinaryPath(void) {
  char path[4096];
  size_t i, offset = 0;
  for (i = 0; i < wrapper_count; i++) {
    const hip_wrapper* w = &live_wrappers[i];
    path[0] = '\0';
    CHECK_EQ(kpack_discover_binary_path(w->binary, path, sizeof path, &offset), KPACK_SUCCESS);
    CHECK_STR(path, bin_path);
    CHECK_EQ(offset, marker->sh_offset);
    /* The wrapper itself lies in the same file, at its section's offset. */
    CHECK_EQ(kpack_discover_binary_path(w, path, sizeof path, &offset), KPACK_SUCCESS);
    CHECK_STR(path, bin_path);
    CHECK_EQ(offset, segment->sh_offset + i * sizeof(hip_wrapper));
  }
  /* No room for the terminating NUL. */
  CHECK_EQ(kpack_discover_binary_path(live_wrappers[0].binary, path, strlen(bin_path), &offset),
           KPACK_ERROR_INVALID_ARGUMENT);
}

static void SplitLoad_LoadCodeObjects(void) {
  kpack_cache_t cache = NULL;
  char path[4096];
  size_t i;
  int a;
  CHECK_EQ(kpack_cache_create(&cache), KPACK_SUCCESS);
  for (i = 0; i < wrapper_count; i++) {
    const hip_wrapper* w = &live_wrappers[i];
    CHECK_EQ(kpack_discover_binary_path(w->binary, path, sizeof path, NULL), KPACK_SUCCESS);
    for (a = 0; a < arch_count; a++) {
      load_and_compare(cache, w->binary, path, i, w->reserved1, arches[a], NULL);
      /* A device arch with no archive first: the loader falls through to the next one. */
      load_and_compare(cache, w->binary, path, i, w->reserved1, arches[a],
                       "amdgcn-amd-amdhsa--gfx1201");
    }
  }
  kpack_cache_destroy(cache);
}

static void SplitLoad_MissingArchAndIndex(void) {
  kpack_cache_t cache = NULL;
  const char* gfx1201[] = {"amdgcn-amd-amdhsa--gfx1201"};
  char isa[128];
  const char* first[1];
  void* out = NULL;
  size_t size = 4242;
  snprintf(isa, sizeof isa, "amdgcn-amd-amdhsa--%s", arches[0]);
  first[0] = isa;
  CHECK_EQ(kpack_cache_create(&cache), KPACK_SUCCESS);
  CHECK_EQ(kpack_load_code_object(cache, live_wrappers[0].binary, bin_path, 0, gfx1201, 1, &out,
                                  &size),
           KPACK_ERROR_ARCHIVE_NOT_FOUND);
  CHECK_EQ(kpack_load_code_object(cache, live_wrappers[0].binary, bin_path,
                                  (uint32_t)wrapper_count, first, 1, &out, &size),
           KPACK_ERROR_KERNEL_NOT_FOUND);
  CHECK(out == NULL);
  CHECK_EQ(size, 4242);
  kpack_cache_destroy(cache);
}

int main(int argc, char** argv) {
  void* handle = NULL;
  int dl;
  if (argc < 5 || (strcmp(argv[1], "dlopen") != 0 && strcmp(argv[1], "file") != 0)) {
    fprintf(stderr, "usage: %s dlopen|file BINARY EXPECT_DIR ARCH...\n", argv[0]);
    return 2;
  }
  dl = strcmp(argv[1], "dlopen") == 0;
  bin_path = argv[2];
  expect_dir = argv[3];
  arches = argv + 4;
  arch_count = argc - 4;
  file_bytes = read_file(bin_path, &file_size);
  if (!file_bytes) {
    fprintf(stderr, "cannot read %s\n", bin_path);
    return 2;
  }
  marker = find_section(".rocm_kpack_ref");
  segment = find_section(".hipFatBinSegment");
  if (!marker || !segment) {
    fprintf(stderr, "%s: no .rocm_kpack_ref or .hipFatBinSegment section\n", bin_path);
    return 2;
  }
  wrapper_count = segment->sh_size / sizeof(hip_wrapper);

  RUN(SplitFile, WrappersInFile);
  RUN(SplitFile, LoadCodeObjects);
  if (dl) {
    handle = dlopen(bin_path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      fprintf(stderr, "dlopen: %s\n", dlerror());
      return 2;
    }
    live_wrappers = (const hip_wrapper*)dlsym(handle, "hip_wrappers");
    if (!live_wrappers) {
      fprintf(stderr, "dlsym hip_wrappers: %s\n", dlerror());
      return 2;
    }
    RUN(SplitLoad, WrappersInMemory);
    RUN(SplitLoad, DiscoverBinaryPath);
    RUN(SplitLoad, LoadCodeObjects);
    RUN(SplitLoad, MissingArchAndIndex);
    dlclose(handle);
  }
  free(file_bytes);
  return TEST_RESULT();
}
