/* Includes nothing but kpack_types.h and uses the standard types it must bring along (size_t,
 * uint32_t, uint64_t) with its own names. Built as C and as C++. */
#include <rocm_kpack/kpack_types.h>

static size_t magic_size(void) { return (size_t)KPACK_MAGIC_SIZE; }

int main(void) {
  uint32_t code = (uint32_t)KPACK_ERROR_ARCH_NOT_FOUND;
  uint64_t wide = (uint64_t)code * 2u;
  kpack_error_t ok = KPACK_SUCCESS;
  /* Exit status 0 only if every value is what the header promises. */
  return (magic_size() == 4 && code == 14u && wide == 28u && ok == 0) ? 0 : 1;
}
