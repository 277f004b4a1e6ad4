/*
 * op_times.c — where the time goes (kernels.h ts_k_op_times_enable): each
 * op that runs adds its wall time, from its backend call to its return, to
 * its kind's total (kernels_front.h's K_RUN calls ts_k_op_time_add when
 * on). Totals are nanoseconds added atomically, so any thread may run ops.
 */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"
#include "kernels/kernels_front.h"

static int op_timing;                        /* read and written atomically */
static int64_t op_nanos[TS_K_OPS_KINDS];     /* added atomically */

const char *ts_k_op_kind_name(ts_k_op_kind k) {
  static const char *const names[TS_K_OPS_KINDS] = {"products", "attention", "elementwise",
                                                    "optimizer", "copies"};
  return (unsigned)k < TS_K_OPS_KINDS ? names[k] : NULL;
}

void ts_k_op_times_enable(int on) { __atomic_store_n(&op_timing, on, __ATOMIC_RELEASE); }
int ts_k_op_timing(void) { return __atomic_load_n(&op_timing, __ATOMIC_ACQUIRE); }

double ts_k_op_clock(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The kind of the op of public name `name` ("ts_k_linear_forward"). */
static ts_k_op_kind op_kind(const char *name) {
  if (strstr(name, "linear")) return TS_K_OPS_PRODUCTS;
  if (strstr(name, "attention")) return TS_K_OPS_ATTENTION;
  if (strstr(name, "adamw")) return TS_K_OPS_OPTIMIZER;
  if (!strcmp(name, "ts_k_cast") || !strcmp(name, "ts_k_zero") || !strcmp(name, "ts_k_sum_ranks"))
    return TS_K_OPS_COPIES;
  return TS_K_OPS_ELEMENTWISE;
}

void ts_k_op_time_add(const char *name, double t0) {
  int64_t ns = (int64_t)((ts_k_op_clock() - t0) * 1e9);
  __atomic_fetch_add(&op_nanos[op_kind(name)], ns, __ATOMIC_RELAXED);
}

void ts_k_op_times(double *seconds) {
  for (int k = 0; k < TS_K_OPS_KINDS; k++)
    seconds[k] = 1e-9 * (double)__atomic_load_n(&op_nanos[k], __ATOMIC_RELAXED);
}

void ts_k_op_times_reset(void) {
  for (int k = 0; k < TS_K_OPS_KINDS; k++) __atomic_store_n(&op_nanos[k], 0, __ATOMIC_RELAXED);
}
