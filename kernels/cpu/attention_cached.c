/*
 * attention_cached.c — the CPU body of ts_k_attention_cached: causal
 * grouped-query attention (Vaswani et al. 2017 eq. 1; GQA, Ainslie et al.
 * 2023) of T new queries of one sequence, at positions pos0 .. pos0+T-1,
 * over the keys and values of positions 0 .. pos0+T-1 held in a cache
 * (autoregressive decoding with a key/value cache, as transformers'
 * DynamicCache and llm.c's inference do).
 *
 * Per (query t, head h), kv head g = h / (NH / NKV), s = 1/sqrt(HS):
 *   n = pos0 + t + 1 keys;  S_j = s q_t . k_j (fp32 products, in j order);
 *   m = max_j S_j;  p_j = e^(S_j - m);  out = (sum_j p_j v_j) / (sum_j p_j)
 * with every sum in fp32, one rounding to storage at the end.
 *
 * Invariants: each (t, h) pair is one work item computed by one thread in
 * one fixed order, so results do not depend on the thread count. Scratch:
 * n + HS floats per thread, from malloc (no workspace).
 */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu_common.h"

/* Row (t, h): the scores into sc[n], then the weighted values into acc[HS]. */
TS_AI void cached_row(void *out, const void *q, const void *k, const void *v, size_t t,
                      size_t pos0, size_t h, size_t NH, size_t NKV, size_t HS, float *sc,
                      float *acc, ts_dtype dt) {
  size_t g = h / (NH / NKV), n = pos0 + t + 1, qo = (t * NH + h) * HS;
  float scale = 1.0f / sqrtf((float)HS), m = -INFINITY;
  for (size_t j = 0; j < n; j++) {
    size_t ko = (j * NKV + g) * HS;
    float s = 0.0f;
    for (size_t d = 0; d < HS; d++) s += ld(q, qo + d, dt) * ld(k, ko + d, dt);
    sc[j] = s * scale;
    if (sc[j] > m) m = sc[j];
  }
  float z = 0.0f;
  for (size_t d = 0; d < HS; d++) acc[d] = 0.0f;
  for (size_t j = 0; j < n; j++) {
    float p = expf(sc[j] - m);
    z += p;
    size_t vo = (j * NKV + g) * HS;
    for (size_t d = 0; d < HS; d++) acc[d] += p * ld(v, vo + d, dt);
  }
  for (size_t d = 0; d < HS; d++) st(out, qo + d, dt, acc[d] / z);
}

ts_status ts_cpu_attention_cached(const ts_kctx *ctx, void *out, const void *q, const void *k,
                                  const void *v, size_t T, size_t pos0, size_t NH, size_t NKV,
                                  size_t HS, ts_dtype dt) {
  size_t items = T * NH, per = pos0 + T + HS;
  int failed = 0;
#pragma omp parallel if (items * (pos0 + T) * HS > 65536)
  {
    float *buf = malloc(per * sizeof *buf);
    if (!buf) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(static)
    for (ptrdiff_t i = 0; i < (ptrdiff_t)items; i++) {
      if (!buf) continue;
      size_t t = (size_t)i / NH, h = (size_t)i % NH;
      TS_DT_CALL(dt, cached_row, out, q, k, v, t, pos0, h, NH, NKV, HS, buf, buf + pos0 + T);
    }
    free(buf);
  }
  if (failed)
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "ts_k_attention_cached: cannot allocate %zu floats",
                        per);
  return TS_OK;
}
