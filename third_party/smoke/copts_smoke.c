/* Compiled with TS_COPTS as C11: each function reports one build setting. */
#include "third_party/smoke/copts_smoke.h"

#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

long ts_smoke_c_std_version(void) { return (long)__STDC_VERSION__; }

int ts_smoke_c_omp_threads(void) {
  int n = 0;
#pragma omp parallel reduction(+ : n)
  n += 1;
  return n;
}

int ts_smoke_c_openmp_enabled(void) {
#ifdef _OPENMP
  return 1;
#else
  return 0;
#endif
}

/* volatile inputs keep the compiler from folding the expression at compile
 * time, which would hide whether it emits an FMA. Baseline x86-64 has no FMA
 * instruction, so this can only fail when FMA code generation is on (an
 * -march with FMA, or -mfma) and contraction is allowed (e.g. -std=gnu11
 * without -ffp-contract=off): checked by hand, it then returns 0. */
int ts_smoke_c_fp_contract_off(void) {
  volatile double a = 1.0 + 0x1p-30, b = 1.0 - 0x1p-30, c = -1.0;
  double r = a * b + c; /* exact: -2^-60; unfused: a*b rounds to 1, r = 0 */
  return r == 0.0;
}

double ts_smoke_c_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
