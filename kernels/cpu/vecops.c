/*
 * vecops.c — the CPU bodies of the simple vector ops: ts_k_add,
 * ts_k_sum_ranks, ts_k_sumsq and ts_k_nonfinite.
 *
 * Invariant: results are bitwise independent of the OpenMP thread count.
 * add is per element (half storage: pieces widened in bulk, added in fp32,
 * rounded once: the bits of the per-element loop); sumsq sums fixed
 * 4096-element chunks in double (eight interleaved lanes combined in a fixed
 * order), then adds the chunk sums in index order inside at most 256
 * contiguous groups whose bounds depend on n only, then adds the group sums
 * in order.
 */
#include "kernels/cpu/cpu_common.h"

enum { CHUNK = TS_CPU_CHUNK, MAX_GROUPS = 256 };

void ts_cpu_for_chunks(size_t n, ts_cpu_chunk_fn fn, void *arg) {
  ptrdiff_t nchunks = (ptrdiff_t)((n + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (ptrdiff_t c = 0; c < nchunks; c++) {
    size_t lo = (size_t)c * CHUNK;
    fn(arg, lo, lo + CHUNK < n ? lo + CHUNK : n);
  }
}

/* out[i] = a[i] + b[i] for i in [lo, hi). */
TS_AI void add_range(void *out, const void *a, const void *b, size_t lo, size_t hi, ts_dtype dt) {
#pragma omp simd
  for (size_t i = lo; i < hi; i++) st(out, i, dt, ld(a, i, dt) + ld(b, i, dt));
}

/* add_range for half storage through fp32 pieces: each piece of a and b is
 * read before out's is written, so out may still alias a or b. */
TS_AI void add_range_half(void *out, const void *a, const void *b, size_t lo, size_t hi,
                          ts_dtype dt) {
  float fa[TS_CPU_PIECE], fb[TS_CPU_PIECE];
  for (size_t i = lo; i < hi; i += TS_CPU_PIECE) {
    size_t k = hi - i < TS_CPU_PIECE ? hi - i : TS_CPU_PIECE;
    ts_cpu_widen_at(fa, a, i, k, dt);
    ts_cpu_widen_at(fb, b, i, k, dt);
    add_range(fa, fa, fb, 0, k, TS_FP32);
    ts_cpu_narrow_at(out, i, fa, k, dt);
  }
}

/* ts_k_add's arguments, and one chunk of it. */
typedef struct add_args {
  void *out;
  const void *a, *b;
  ts_dtype dt;
} add_args;

TS_AI void add_chunk_body(void *arg, size_t lo, size_t hi) {
  const add_args *x = arg;
  if (x->dt == TS_FP32)
    add_range(x->out, x->a, x->b, lo, hi, TS_FP32);
  else
    add_range_half(x->out, x->a, x->b, lo, hi, x->dt);
}
TS_CPU_CLONES(add_chunk, (void *arg, size_t lo, size_t hi), (arg, lo, hi))

ts_status ts_cpu_add(const ts_kctx *ctx, void *out, const void *a, const void *b, size_t n,
                     ts_dtype dt) {
  add_args x = {out, a, b, dt};
  ts_cpu_for_chunks(n, add_chunk, &x);
  return TS_OK;
}

/* ts_k_sum_ranks's arguments, and one chunk of it: pieces of TS_CPU_PIECE
 * elements widened to fp32, the parts added in index order with one fp32
 * rounding each (ts_fadd), then the previous out, then one narrowing. */
typedef struct sum_ranks_args {
  void *out;
  const void *const *parts;
  int n, accumulate;
  ts_dtype dt;
} sum_ranks_args;

static void sum_ranks_chunk(void *arg, size_t lo, size_t hi) {
  const sum_ranks_args *x = arg;
  float acc[TS_CPU_PIECE], y[TS_CPU_PIECE];
  for (size_t i = lo; i < hi; i += TS_CPU_PIECE) {
    size_t k = hi - i < TS_CPU_PIECE ? hi - i : TS_CPU_PIECE;
    ts_cpu_widen_at(acc, x->parts[0], i, k, x->dt);
    for (int p = 1; p <= x->n; p++) {
      if (p == x->n && !x->accumulate) break;
      ts_cpu_widen_at(y, p < x->n ? x->parts[p] : x->out, i, k, x->dt);
      for (size_t j = 0; j < k; j++) acc[j] = ts_fadd(acc[j], y[j]);
    }
    ts_cpu_narrow_at(x->out, i, acc, k, x->dt);
  }
}

ts_status ts_cpu_sum_ranks(const ts_kctx *ctx, void *out, const void *const *parts, int n,
                           size_t count, ts_dtype dt, int accumulate) {
  sum_ranks_args x = {out, parts, n, accumulate, dt};
  ts_cpu_for_chunks(count, sum_ranks_chunk, &x);
  return TS_OK;
}

/* Sum of x[i]^2 over [lo, hi) in double: eight lanes, then a fixed tree. */
TS_AI double sumsq_range(const void *x, size_t lo, size_t hi, ts_dtype dt) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = lo;
  for (; i + 8 <= hi; i += 8) {
    for (int k = 0; k < 8; k++) {
      double y = ld(x, i + (size_t)k, dt);
      acc[k] += y * y; /* exact: a float squared fits in a double */
    }
  }
  for (int k = 0; i < hi; i++, k++) {
    double y = ld(x, i, dt);
    acc[k] += y * y;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

ts_status ts_cpu_sumsq(const ts_kctx *ctx, double *out, const void *x, size_t n, ts_dtype dt) {
  if (n == 0) {
    *out = 0.0;
    return TS_OK;
  }
  size_t nchunks = (n + CHUNK - 1) / CHUNK;
  size_t ngroups = nchunks < MAX_GROUPS ? nchunks : MAX_GROUPS;
  double group_sum[MAX_GROUPS];
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (ptrdiff_t g = 0; g < (ptrdiff_t)ngroups; g++) {
    size_t c0 = (size_t)g * nchunks / ngroups, c1 = (size_t)(g + 1) * nchunks / ngroups;
    double s = 0.0;
    for (size_t c = c0; c < c1; c++) {
      size_t lo = c * CHUNK;
      size_t hi = lo + CHUNK < n ? lo + CHUNK : n;
      double part;
      if (dt == TS_FP32)
        part = sumsq_range(x, lo, hi, TS_FP32);
      else if (dt == TS_BF16)
        part = sumsq_range(x, lo, hi, TS_BF16);
      else
        part = sumsq_range(x, lo, hi, TS_FP16);
      s += part;
    }
    group_sum[g] = s;
  }
  double total = 0.0;
  for (size_t g = 0; g < ngroups; g++) total += group_sum[g];
  *out = total;
  return TS_OK;
}

/* 1 if some element of x[lo, hi) is inf or NaN: its exponent bits all set. */
static int nonfinite_range(const void *x, size_t lo, size_t hi, ts_dtype dt) {
  if (dt == TS_FP32) {
    const uint32_t *u = (const uint32_t *)x;
    for (size_t i = lo; i < hi; i++)
      if ((u[i] & 0x7f800000u) == 0x7f800000u) return 1;
    return 0;
  }
  uint16_t exp = dt == TS_BF16 ? 0x7f80u : 0x7c00u;
  const uint16_t *h = (const uint16_t *)x;
  for (size_t i = lo; i < hi; i++)
    if ((h[i] & exp) == exp) return 1;
  return 0;
}

ts_status ts_cpu_nonfinite(const ts_kctx *ctx, int32_t *flag, const void *x, size_t n,
                           ts_dtype dt) {
  ptrdiff_t nchunks = (ptrdiff_t)((n + CHUNK - 1) / CHUNK);
  int any = 0;
#pragma omp parallel for schedule(static) reduction(| : any) if (nchunks > 1)
  for (ptrdiff_t c = 0; c < nchunks; c++) {
    size_t lo = (size_t)c * CHUNK;
    any |= nonfinite_range(x, lo, lo + CHUNK < n ? lo + CHUNK : n, dt);
  }
  *flag = any;
  return TS_OK;
}
