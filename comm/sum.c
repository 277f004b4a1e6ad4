/*
 * sum.c — comm's rank-order reductions (the contract is sum.h).
 *
 * Invariants: each output element is acc = x_0; acc += x_1; ...; in rank
 * order, in fp32 with one IEEE rounding per addition (ts_fadd, so no
 * contraction or reassociation), and for half dtypes rounded once to the
 * storage dtype at the end. The summation works on tiles of SUM_TILE
 * elements; tiles are independent, so splitting them over OpenMP threads
 * changes no element's order or bits.
 */
#include "comm/sum.h"

#include <stdint.h>
#include <string.h>

#include "base/floats.h"

/* Element tile of the summation and the size below which it stays on one thread. */
#define SUM_TILE 1024
#define SUM_PARALLEL_MIN ((size_t)1 << 16)

/* acc[0..m) = element lo.. of x (widened to fp32). */
static void load_tile(float *acc, const void *x, size_t lo, size_t m, ts_dtype dt) {
  if (dt == TS_FP32) {
    memcpy(acc, (const float *)x + lo, m * sizeof(float));
  } else if (dt == TS_BF16) {
    const uint16_t *h = (const uint16_t *)x + lo;
    for (size_t i = 0; i < m; i++) acc[i] = ts_bf16_to_f32(h[i]);
  } else {
    const uint16_t *h = (const uint16_t *)x + lo;
    for (size_t i = 0; i < m; i++) acc[i] = ts_f16_to_f32(h[i]);
  }
}

/* acc[0..m) += element lo.. of x, one fp32 addition per element. */
static void add_tile(float *acc, const void *x, size_t lo, size_t m, ts_dtype dt) {
  if (dt == TS_FP32) {
    const float *f = (const float *)x + lo;
    for (size_t i = 0; i < m; i++) acc[i] = ts_fadd(acc[i], f[i]);
  } else if (dt == TS_BF16) {
    const uint16_t *h = (const uint16_t *)x + lo;
    for (size_t i = 0; i < m; i++) acc[i] = ts_fadd(acc[i], ts_bf16_to_f32(h[i]));
  } else {
    const uint16_t *h = (const uint16_t *)x + lo;
    for (size_t i = 0; i < m; i++) acc[i] = ts_fadd(acc[i], ts_f16_to_f32(h[i]));
  }
}

/* element lo.. of y = acc[0..m), rounded once to dt (nearest even). */
static void store_tile(void *y, const float *acc, size_t lo, size_t m, ts_dtype dt) {
  if (dt == TS_FP32) {
    memcpy((float *)y + lo, acc, m * sizeof(float));
  } else if (dt == TS_BF16) {
    uint16_t *h = (uint16_t *)y + lo;
    for (size_t i = 0; i < m; i++) h[i] = ts_f32_to_bf16(acc[i]);
  } else {
    uint16_t *h = (uint16_t *)y + lo;
    for (size_t i = 0; i < m; i++) h[i] = ts_f32_to_f16(acc[i]);
  }
}

/* Each tile is read in full before it is written, so dst may equal a src. */
void ts_comm_sum_rank_order(void *dst, const void *const *src, int n, size_t count, ts_dtype dt,
                            int accumulate) {
  size_t ntiles = (count + SUM_TILE - 1) / SUM_TILE;
#pragma omp parallel for schedule(static) if (count >= SUM_PARALLEL_MIN)
  for (size_t t = 0; t < ntiles; t++) {
    float acc[SUM_TILE];
    size_t lo = t * SUM_TILE;
    size_t m = count - lo < SUM_TILE ? count - lo : SUM_TILE;
    load_tile(acc, src[0], lo, m, dt);
    for (int j = 1; j < n; j++) add_tile(acc, src[j], lo, m, dt);
    if (accumulate) add_tile(acc, dst, lo, m, dt);
    store_tile(dst, acc, lo, m, dt);
  }
}

/* acc combined with x under op; NaN propagates through max and min. */
static double combine(double acc, double x, ts_comm_op op) {
  if (op == TS_COMM_SUM) return acc + x;
  if (acc != acc) return acc;
  if (x != x) return x;
  if (op == TS_COMM_MAX) return x > acc ? x : acc;
  return x < acc ? x : acc;
}

void ts_comm_reduce_f64_rank_order(double *buf, const double *all, size_t n, size_t count,
                                   ts_comm_op op) {
  for (size_t i = 0; i < count; i++) {
    double acc = all[i];
    for (size_t j = 1; j < n; j++) acc = combine(acc, all[j * count + i], op);
    buf[i] = acc;
  }
}
