/*
 * rng.h — tessera's one seeded generator: splitmix64 (Steele, Lea, Flood
 * 2014, "Fast splittable pseudorandom number generators"; Vigna's reference
 * code), its output function as a 64-bit mixer, and FNV-1a for seeding a
 * stream from a name. Header-only, host code.
 *
 * Every random choice tessera makes (parameter initialisation, the data
 * loader's permutations, test inputs) draws from these, so a seed means the
 * same stream on every host, compiler and world size.
 */
#ifndef TS_BASE_RNG_H
#define TS_BASE_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* splitmix64's output function alone: a bijection on 64-bit values. */
static inline uint64_t ts_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Advances *state by the golden-ratio increment and returns the next
 * output of the stream. */
static inline uint64_t ts_splitmix64(uint64_t *state) {
  return ts_mix64(*state += 0x9e3779b97f4a7c15ull);
}

/* FNV-1a (64-bit) of a NUL-terminated string: seeds a stream from a name. */
static inline uint64_t ts_fnv1a64(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

#ifdef __cplusplus
}
#endif

#endif /* TS_BASE_RNG_H */
