/*
 * test.h - a tiny test harness shared by the C programs in tests/c.
 *
 * Each test is a function named Suite_Name; RUN(Suite, Name) calls it and
 * prints "[ RUN      ] Suite.Name" and then "[       OK ] Suite.Name" or
 * "[  FAILED  ] Suite.Name", the way the reference gtest binary does, so the
 * Rust driver can check that every ported reference test ran and passed.
 * The file also has a small msgpack writer for building HIPK metadata.
 * Compiles as C99 and as C++.
 */
#ifndef KPACK_TEST_H
#define KPACK_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int kt_failures = 0;

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__,       \
              #cond);                                                        \
      kt_failures++;                                                         \
    }                                                                        \
  } while (0)

#define CHECK_EQ(a, b)                                                       \
  do {                                                                       \
    long long kt_a = (long long)(a), kt_b = (long long)(b);                  \
    if (kt_a != kt_b) {                                                      \
      fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__,    \
              __LINE__, #a, #b, kt_a, kt_b);                                 \
      kt_failures++;                                                         \
    }                                                                        \
  } while (0)

#define CHECK_STR(a, b)                                                      \
  do {                                                                       \
    const char* kt_a = (a);                                                  \
    const char* kt_b = (b);                                                  \
    if (kt_a == NULL || strcmp(kt_a, kt_b) != 0) {                           \
      fprintf(stderr, "%s:%d: %s == \"%s\" failed: got \"%s\"\n", __FILE__,  \
              __LINE__, #a, kt_b, kt_a ? kt_a : "(null)");                   \
      kt_failures++;                                                         \
    }                                                                        \
  } while (0)

#define RUN(suite, name)                                                     \
  do {                                                                       \
    int kt_before = kt_failures;                                             \
    printf("[ RUN      ] %s.%s\n", #suite, #name);                           \
    fflush(stdout);                                                          \
    suite##_##name();                                                        \
    printf("%s %s.%s\n",                                                     \
           kt_failures == kt_before ? "[       OK ]" : "[  FAILED  ]",       \
           #suite, #name);                                                   \
    fflush(stdout);                                                          \
  } while (0)

#define TEST_RESULT()                                                        \
  (printf("%d failures\n", kt_failures), kt_failures == 0 ? 0 : 1)

/* Joins a directory and a file name into a static buffer (one of four,
 * rotating, so a few results can be used together). */
static inline const char* kt_join(const char* dir, const char* name) {
  static char bufs[4][4096];
  static int next = 0;
  char* out = bufs[next];
  next = (next + 1) % 4;
  snprintf(out, sizeof bufs[0], "%s/%s", dir, name);
  return out;
}

/* Checks `size` bytes of `data`: they start with `prefix`, and every byte after
 * it equals `fill` (pass fill < 0 to check only the prefix). */
static inline int kt_bytes_are(const void* data, size_t size, const char* prefix,
                        int fill, size_t expected_size) {
  const unsigned char* p = (const unsigned char*)data;
  size_t n = strlen(prefix);
  size_t i;
  if (data == NULL || size != expected_size || size < n) return 0;
  if (memcmp(p, prefix, n) != 0) return 0;
  if (fill >= 0)
    for (i = n; i < size; i++)
      if (p[i] != (unsigned char)fill) return 0;
  return 1;
}

/* ---- msgpack writer ---------------------------------------------------- */

typedef struct {
  unsigned char data[8192];
  size_t len;
} mp_buf;

static inline void mp_byte(mp_buf* b, unsigned v) { b->data[b->len++] = (unsigned char)v; }

static inline void mp_be(mp_buf* b, unsigned long long v, int bytes) {
  int i;
  for (i = bytes - 1; i >= 0; i--) mp_byte(b, (unsigned)((v >> (8 * i)) & 0xff));
}

static inline void mp_map(mp_buf* b, unsigned n) {
  if (n < 16) mp_byte(b, 0x80 | n); else { mp_byte(b, 0xde); mp_be(b, n, 2); }
}

static inline void mp_array(mp_buf* b, unsigned n) {
  if (n < 16) mp_byte(b, 0x90 | n); else { mp_byte(b, 0xdc); mp_be(b, n, 2); }
}

static inline void mp_raw(mp_buf* b, const void* s, size_t n) {
  memcpy(b->data + b->len, s, n);
  b->len += n;
}

static inline void mp_str(mp_buf* b, const char* s) {
  size_t n = strlen(s);
  if (n < 32) mp_byte(b, 0xa0 | (unsigned)n); else { mp_byte(b, 0xd9); mp_byte(b, (unsigned)n); }
  mp_raw(b, s, n);
}

static inline void mp_bin(mp_buf* b, const char* s) {
  size_t n = strlen(s);
  mp_byte(b, 0xc4);
  mp_byte(b, (unsigned)n);
  mp_raw(b, s, n);
}

static inline void mp_uint(mp_buf* b, unsigned v) {
  if (v < 128) mp_byte(b, v); else { mp_byte(b, 0xce); mp_be(b, v, 4); }
}

/* The usual HIPK metadata: {"kpack_search_paths": [paths...], "kernel_name": name}
 * (the key order the reference writer uses). */
static inline void mp_hipk(mp_buf* b, const char* kernel_name, const char* const* paths,
                    unsigned npaths) {
  unsigned i;
  b->len = 0;
  mp_map(b, 2);
  mp_str(b, "kpack_search_paths");
  mp_array(b, npaths);
  for (i = 0; i < npaths; i++) mp_str(b, paths[i]);
  mp_str(b, "kernel_name");
  mp_str(b, kernel_name);
}

#endif /* KPACK_TEST_H */
