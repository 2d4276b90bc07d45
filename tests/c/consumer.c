/*
 * consumer.c - a program built against an installed librocm_kpack (through
 * pkg-config or the CMake package) to show the install is usable.
 *
 * usage: consumer ARCHIVE KEY ARCH
 * prints "arches: A B ...", then "kernel: SIZE bytes, starts with PREFIX".
 */
#include <rocm_kpack/kpack.h>

#include <stdio.h>

int main(int argc, char** argv) {
  kpack_archive_t archive = NULL;
  size_t count = 0, i, size = 0;
  void* data = NULL;
  kpack_error_t rc;
  if (argc != 4) {
    fprintf(stderr, "usage: %s ARCHIVE KEY ARCH\n", argv[0]);
    return 2;
  }
  rc = kpack_open(argv[1], &archive);
  if (rc != KPACK_SUCCESS) {
    fprintf(stderr, "kpack_open: error %d\n", (int)rc);
    return 1;
  }
  kpack_get_architecture_count(archive, &count);
  printf("arches:");
  for (i = 0; i < count; i++) {
    const char* arch = NULL;
    kpack_get_architecture(archive, i, &arch);
    printf(" %s", arch);
  }
  printf("\n");
  rc = kpack_get_kernel(archive, argv[2], argv[3], &data, &size);
  if (rc != KPACK_SUCCESS) {
    fprintf(stderr, "kpack_get_kernel: error %d\n", (int)rc);
    kpack_close(archive);
    return 1;
  }
  printf("kernel: %zu bytes, starts with %.8s\n", size, (const char*)data);
  kpack_free_kernel(data);
  kpack_close(archive);
  return 0;
}
