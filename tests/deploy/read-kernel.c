/* Writes one kernel of a kernel pack to standard output, through the installed librocm_kpack:
 * read-kernel ARCHIVE BINARY ARCH. Built by tests/deploy/debs.sh with pkg-config. */
#include <stdio.h>
#include <rocm_kpack/kpack.h>

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: read-kernel ARCHIVE BINARY ARCH\n");
    return 2;
  }
  kpack_archive_t archive = NULL;
  kpack_error_t err = kpack_open(argv[1], &archive);
  if (err != KPACK_SUCCESS) {
    fprintf(stderr, "kpack_open: error %d\n", (int)err);
    return 1;
  }
  void* data = NULL;
  size_t size = 0;
  err = kpack_get_kernel(archive, argv[2], argv[3], &data, &size);
  if (err != KPACK_SUCCESS) {
    fprintf(stderr, "kpack_get_kernel: error %d\n", (int)err);
    kpack_close(archive);
    return 1;
  }
  int status = fwrite(data, 1, size, stdout) == size && fflush(stdout) == 0 ? 0 : 1;
  kpack_free_kernel(data);
  kpack_close(archive);
  return status;
}
