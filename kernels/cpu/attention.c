/*
 * attention.c — the CPU body of scaled dot-product attention (Vaswani et
 * al. 2017 eq. 1), forward and backward, in two masks through one code
 * path: causal grouped-query attention (GQA: Ainslie et al. 2023;
 * ts_k_attention_*) and bidirectional multi-head attention with a key
 * padding mask (Hugging Face BertSelfAttention; ts_k_attention_bidir_*).
 *
 * Per batch row b and query head h (kv head g = h / (NH / NKV)), with
 * s = 1/sqrt(HS):
 *   S = s Q K^T, P = softmax_rows(S + mask), O = P V
 * where the mask lets query t see keys 0..t (causal) or every key whose id
 * is not the pad id (bidirectional); a key it does not see gets P = 0
 * exactly. The bidirectional products span all T keys; the causal ones
 * stop at the diagonal block.
 * Backward (softmax Jacobian, row t):
 *   dV_g += P^T dO;  dP = dO V^T;  dS = s P * (dP - rowsum(P * dP))
 *   dQ = dS K;  dK_g += dS^T Q
 *
 * Invariants:
 * - Work is split into items of a fixed size, whatever the thread count:
 *   the forward's items are (batch row, head) pairs, the backward's (batch
 *   row, kv head) pairs, whose query heads run in head order inside the
 *   item. One OpenMP loop hands the items to threads; inside it every
 *   cblas_sgemm runs on its calling thread alone (the OpenMP build of
 *   OpenBLAS in an active region; with one thread, OpenBLAS's own count is
 *   one). So each item is the same single-threaded sequence of operations
 *   at any thread count. Rows are blocked by RB so products skip key blocks
 *   above the diagonal.
 * - The backward's dP scratch is one (T, T) buffer per slot, SLOTS of them
 *   at most (fewer when there are fewer items): slot s takes items s,
 *   s + SLOTS, ... in order, so at most SLOTS threads work on a backward.
 * - The causal path performs exactly the operations it did before the
 *   bidirectional mask joined it (a mask that keeps every key adds no
 *   operation), so its results are bitwise those of earlier builds.
 * - Each output element is produced by one fixed sequence of operations
 *   (heads of a GQA group accumulate into dK/dV in head order), so results
 *   do not depend on the OpenMP thread count.
 * - Scratch comes only from ctx->workspace: fp32 backward needs dP (T, T)
 *   per slot;
 *   bf16/fp16 widen one batch row at a time into fp32 buffers, run the fp32
 *   path and round the outputs once. ts_cpu_attention_workspace_bytes is the
 *   larger of the forward and backward needs, exactly.
 */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_common.h"

enum { RB = 128 };  /* query rows per block of the blocked-causal products */
enum { SLOTS = 8 }; /* the backward's dP scratch buffers, at most */

/* The backward's slots for `items` (batch row, kv head) pairs. */
static size_t slots_for(size_t items) { return items < SLOTS ? items : SLOTS; }

/* ---- workspace layout ------------------------------------------------------ */

/* Byte offsets of the fp32 buffers one call carves from the workspace. */
typedef struct {
  size_t dp;              /* (T, T) backward scratch */
  size_t q, k, v, dout;   /* widened inputs of one batch row (half only) */
  size_t probs;           /* (NH, T, T) widened/produced probs (half only) */
  size_t out, dq, dk, dv; /* fp32 outputs of one batch row (half only) */
  size_t total;           /* bytes */
} ws_layout;

/* Appends a buffer of `bytes` at *end (64-byte aligned); returns its offset. */
static size_t carve(size_t *end, size_t bytes) {
  size_t o = *end;
  *end += ts_align64(bytes);
  return o;
}

/* The layout of a call over B batch rows (fp32 runs them in one pass; half
 * dtypes one row at a time). */
static ws_layout layout(size_t B, size_t T, size_t NH, size_t NKV, size_t HS, ts_dtype dt,
                        int backward) {
  ws_layout w;
  memset(&w, 0, sizeof w);
  size_t end = 0, f = sizeof(float);
  if (backward) w.dp = carve(&end, slots_for((dt == TS_FP32 ? B : 1) * NKV) * T * T * f);
  if (dt != TS_FP32) {
    w.q = carve(&end, T * NH * HS * f);
    w.k = carve(&end, T * NKV * HS * f);
    w.v = carve(&end, T * NKV * HS * f);
    w.probs = carve(&end, NH * T * T * f);
    if (backward) {
      w.dout = carve(&end, T * NH * HS * f);
      w.dq = carve(&end, T * NH * HS * f);
      w.dk = carve(&end, T * NKV * HS * f);
      w.dv = carve(&end, T * NKV * HS * f);
    } else {
      w.out = carve(&end, T * NH * HS * f);
    }
  }
  w.total = end;
  return w;
}

size_t ts_cpu_attention_workspace_bytes(size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                                        ts_dtype dt) {
  size_t f = layout(B, T, NH, NKV, HS, dt, 0).total, b = layout(B, T, NH, NKV, HS, dt, 1).total;
  return f > b ? f : b;
}

/* ---- fp32 core ------------------------------------------------------------- */

/* Which keys each query row sees: 0..t (causal), or all T keys but those
 * whose id is pad_id (bidirectional; ids NULL: every key). */
typedef struct {
  int causal;         /* 1: causal; 0: bidirectional */
  const int32_t *ids; /* (B, T) ids of the call's batch rows, or NULL */
  int32_t pad_id;     /* masked id when ids is not NULL */
} att_mask;

/* Keys [0, n) that query row t's products and softmax span. */
static size_t key_end(const att_mask *mk, size_t t, size_t T) { return mk->causal ? t + 1 : T; }

/* Row t of P: softmax over the keys j < n with keep == NULL or keep[j] !=
 * pad of the scores in p[0..n), zeros elsewhere in p[0..T). */
static void softmax_row(float *p, size_t n, size_t T, const int32_t *keep, int32_t pad) {
  float m = -INFINITY;
  for (size_t j = 0; j < n; j++)
    if (keep == NULL || keep[j] != pad) m = p[j] > m ? p[j] : m;
  float sum = 0.0f;
  for (size_t j = 0; j < n; j++) {
    if (keep != NULL && keep[j] == pad) {
      p[j] = 0.0f;
      continue;
    }
    float e = expf(p[j] - m);
    p[j] = e;
    sum += e;
  }
  float inv = 1.0f / sum;
  for (size_t j = 0; j < n; j++) p[j] *= inv;
  for (size_t j = n; j < T; j++) p[j] = 0.0f;
}

/* Row t of dS = scale * P * (dP - rowsum(P * dP)), in place over dp[0..n). */
static void softmax_row_bwd(float *dp, const float *p, size_t n, float scale) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (size_t j = 0; j < n; j++) dot += p[j] * dp[j];
  for (size_t j = 0; j < n; j++) dp[j] = scale * (p[j] * (dp[j] - dot));
}

/* fp32 forward over B batch rows (layouts as in kernels.h), mask mk. */
static void attn_fwd_f32(float *out, float *probs, const float *q, const float *k, const float *v,
                         size_t B, size_t T, size_t NH, size_t NKV, size_t HS, const att_mask *mk) {
  const float scale = 1.0f / sqrtf((float)HS);
  const size_t rep = NH / NKV;
  const int ldq = (int)(NH * HS), ldk = (int)(NKV * HS), ldp = (int)T;
  ptrdiff_t items = (ptrdiff_t)(B * NH);
#pragma omp parallel for schedule(static)
  for (ptrdiff_t it = 0; it < items; it++) { /* one (batch row, head) */
    size_t b = (size_t)it / NH, h = (size_t)it % NH;
    const float *qb = q + b * T * NH * HS + h * HS;
    const float *kb = k + b * T * NKV * HS + (h / rep) * HS;
    const float *vb = v + b * T * NKV * HS + (h / rep) * HS;
    float *pb = probs + (b * NH + h) * T * T;
    float *ob = out + b * T * NH * HS + h * HS;
    for (size_t r0 = 0; r0 < T; r0 += RB) { /* S[r0:r1, 0:n] = s Q[r0:r1] K[0:n]^T */
      size_t r1 = r0 + RB < T ? r0 + RB : T, n = key_end(mk, r1 - 1, T);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(r1 - r0), (int)n, (int)HS, scale,
                  qb + r0 * ldq, ldq, kb, ldk, 0.0f, pb + r0 * T, ldp);
    }
    for (size_t t = 0; t < T; t++)
      softmax_row(pb + t * T, key_end(mk, t, T), T, mk->ids ? mk->ids + b * T : NULL, mk->pad_id);
    for (size_t r0 = 0; r0 < T; r0 += RB) { /* O[r0:r1] = P[r0:r1, 0:n] V[0:n] */
      size_t r1 = r0 + RB < T ? r0 + RB : T, n = key_end(mk, r1 - 1, T);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(r1 - r0), (int)HS, (int)n, 1.0f,
                  pb + r0 * T, ldp, vb, ldk, 0.0f, ob + r0 * ldq, ldq);
    }
  }
}

/* The backward of batch row b, query head h (kv head h / (NH / NKV)):
 * adds into dK and dV of its kv head, writes dQ of its head; dp is (T, T)
 * scratch. */
static void bwd_head(float *dq, float *dk, float *dv, float *dp, const float *dout, const float *q,
                     const float *k, const float *v, const float *probs, size_t b, size_t h,
                     size_t T, size_t NH, size_t NKV, size_t HS, const att_mask *mk) {
  const float scale = 1.0f / sqrtf((float)HS);
  const size_t rep = NH / NKV;
  const int ldq = (int)(NH * HS), ldk = (int)(NKV * HS), ldp = (int)T;
  size_t qo = b * T * NH * HS + h * HS, ko = b * T * NKV * HS + (h / rep) * HS;
  const float *pb = probs + (b * NH + h) * T * T;
  for (size_t r0 = 0; r0 < T; r0 += RB) {
    size_t r1 = r0 + RB < T ? r0 + RB : T, n = key_end(mk, r1 - 1, T);
    int m = (int)(r1 - r0);
    /* dV[0:n] += P[r0:r1, 0:n]^T dO[r0:r1] */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)n, (int)HS, m, 1.0f, pb + r0 * T, ldp,
                dout + qo + r0 * ldq, ldq, 1.0f, dv + ko, ldk);
    /* dP[r0:r1, 0:n] = dO[r0:r1] V[0:n]^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, (int)n, (int)HS, 1.0f,
                dout + qo + r0 * ldq, ldq, v + ko, ldk, 0.0f, dp + r0 * T, ldp);
  }
  for (size_t t = 0; t < T; t++) softmax_row_bwd(dp + t * T, pb + t * T, key_end(mk, t, T), scale);
  for (size_t r0 = 0; r0 < T; r0 += RB) {
    size_t r1 = r0 + RB < T ? r0 + RB : T, n = key_end(mk, r1 - 1, T);
    int m = (int)(r1 - r0);
    /* causal: dS is zero above the diagonal inside the block: clear what dP left there */
    for (size_t t = r0; mk->causal && t + 1 < r1; t++)
      memset(dp + t * T + t + 1, 0, (r1 - t - 1) * sizeof(float));
    /* dQ[r0:r1] = dS[r0:r1, 0:n] K[0:n] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, (int)HS, (int)n, 1.0f, dp + r0 * T,
                ldp, k + ko, ldk, 0.0f, dq + qo + r0 * ldq, ldq);
    /* dK[0:n] += dS[r0:r1, 0:n]^T Q[r0:r1] */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)n, (int)HS, m, 1.0f, dp + r0 * T, ldp,
                q + qo + r0 * ldq, ldq, 1.0f, dk + ko, ldk);
  }
}

/* fp32 backward over B batch rows; dp is (T, T) scratch per slot
 * (slots_for(B * NKV)). Only mk->causal matters: the probabilities are
 * already 0 at the keys a row does not see, which makes their dS 0 too. */
static void attn_bwd_f32(float *dq, float *dk, float *dv, float *dp, const float *dout,
                         const float *q, const float *k, const float *v, const float *probs,
                         size_t B, size_t T, size_t NH, size_t NKV, size_t HS, const att_mask *mk) {
  const size_t rep = NH / NKV;
  memset(dk, 0, B * T * NKV * HS * sizeof(float));
  memset(dv, 0, B * T * NKV * HS * sizeof(float));
  size_t items = B * NKV, slots = slots_for(items);
#pragma omp parallel for schedule(static)
  for (ptrdiff_t s = 0; s < (ptrdiff_t)slots; s++) {
    float *dps = dp + (size_t)s * T * T;
    for (size_t it = (size_t)s; it < items; it += slots) /* one (batch row, kv head) */
      for (size_t h = it % NKV * rep; h < (it % NKV + 1) * rep; h++)
        bwd_head(dq, dk, dv, dps, dout, q, k, v, probs, it / NKV, h, T, NH, NKV, HS, mk);
  }
}

/* ---- public entry points ------------------------------------------------------ */

/* Checks that the dimensions fit BLAS's int (the front checked the rest). */
static ts_status check_blas_dims(size_t T, size_t NH, size_t HS, const char *op) {
  if (T > INT_MAX || NH * HS > INT_MAX)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: T = %zu, NH*HS = %zu: each must be at most %d (BLAS int)", op, T,
                        NH * HS, INT_MAX);
  return TS_OK;
}

/* Forward of either mask (mk->ids: the call's batch row 0). */
static ts_status attn_forward(const ts_kctx *ctx, void *out, void *probs, const void *q,
                              const void *k, const void *v, size_t B, size_t T, size_t NH,
                              size_t NKV, size_t HS, ts_dtype dt, const att_mask *mk,
                              const char *op) {
  TS_CHECK(check_blas_dims(T, NH, HS, op));
  ws_layout w = layout(B, T, NH, NKV, HS, dt, 0);
  if (dt == TS_FP32) {
    attn_fwd_f32(out, probs, q, k, v, B, T, NH, NKV, HS, mk);
    return TS_OK;
  }
  char *ws = (char *)ctx->workspace;
  float *fq = (float *)(ws + w.q), *fk = (float *)(ws + w.k), *fv = (float *)(ws + w.v);
  float *fp = (float *)(ws + w.probs), *fo = (float *)(ws + w.out);
  size_t es = ts_dtype_size(dt), nq = T * NH * HS, nk = T * NKV * HS, np = NH * T * T;
  for (size_t b = 0; b < B; b++) {
    att_mask row = *mk; /* this batch row's ids */
    if (row.ids) row.ids += b * T;
    ts_cpu_widen(fq, (const char *)q + b * nq * es, nq, dt);
    ts_cpu_widen(fk, (const char *)k + b * nk * es, nk, dt);
    ts_cpu_widen(fv, (const char *)v + b * nk * es, nk, dt);
    attn_fwd_f32(fo, fp, fq, fk, fv, 1, T, NH, NKV, HS, &row);
    ts_cpu_narrow((char *)out + b * nq * es, fo, nq, dt);
    ts_cpu_narrow((char *)probs + b * np * es, fp, np, dt);
  }
  return TS_OK;
}

/* Backward of either mask (only mk->causal is read). */
static ts_status attn_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv, const void *dout,
                               const void *q, const void *k, const void *v, const void *probs,
                               size_t B, size_t T, size_t NH, size_t NKV, size_t HS, ts_dtype dt,
                               const att_mask *mk, const char *op) {
  TS_CHECK(check_blas_dims(T, NH, HS, op));
  ws_layout w = layout(B, T, NH, NKV, HS, dt, 1);
  char *ws = (char *)ctx->workspace;
  float *dp = (float *)(ws + w.dp);
  if (dt == TS_FP32) {
    attn_bwd_f32(dq, dk, dv, dp, dout, q, k, v, probs, B, T, NH, NKV, HS, mk);
    return TS_OK;
  }
  float *fq = (float *)(ws + w.q), *fk = (float *)(ws + w.k), *fv = (float *)(ws + w.v);
  float *fp = (float *)(ws + w.probs), *fdo = (float *)(ws + w.dout);
  float *fdq = (float *)(ws + w.dq), *fdk = (float *)(ws + w.dk), *fdv = (float *)(ws + w.dv);
  size_t es = ts_dtype_size(dt), nq = T * NH * HS, nk = T * NKV * HS, np = NH * T * T;
  for (size_t b = 0; b < B; b++) {
    ts_cpu_widen(fdo, (const char *)dout + b * nq * es, nq, dt);
    ts_cpu_widen(fq, (const char *)q + b * nq * es, nq, dt);
    ts_cpu_widen(fk, (const char *)k + b * nk * es, nk, dt);
    ts_cpu_widen(fv, (const char *)v + b * nk * es, nk, dt);
    ts_cpu_widen(fp, (const char *)probs + b * np * es, np, dt);
    attn_bwd_f32(fdq, fdk, fdv, dp, fdo, fq, fk, fv, fp, 1, T, NH, NKV, HS, mk);
    ts_cpu_narrow((char *)dq + b * nq * es, fdq, nq, dt);
    ts_cpu_narrow((char *)dk + b * nk * es, fdk, nk, dt);
    ts_cpu_narrow((char *)dv + b * nk * es, fdv, nk, dt);
  }
  return TS_OK;
}

static const att_mask CAUSAL = {1, NULL, 0};

ts_status ts_cpu_attention_forward(const ts_kctx *ctx, void *out, void *probs, const void *q,
                                   const void *k, const void *v, size_t B, size_t T, size_t NH,
                                   size_t NKV, size_t HS, ts_dtype dt) {
  return attn_forward(ctx, out, probs, q, k, v, B, T, NH, NKV, HS, dt, &CAUSAL,
                      "ts_k_attention_forward");
}

ts_status ts_cpu_attention_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                    const void *dout, const void *out, const void *q, const void *k,
                                    const void *v, const void *probs, size_t B, size_t T, size_t NH,
                                    size_t NKV, size_t HS, ts_dtype dt) {
  return attn_backward(ctx, dq, dk, dv, dout, q, k, v, probs, B, T, NH, NKV, HS, dt, &CAUSAL,
                       "ts_k_attention_backward");
}

ts_status ts_cpu_attention_bidir_forward(const ts_kctx *ctx, void *out, void *probs, const void *q,
                                         const void *k, const void *v, const int32_t *ids,
                                         int32_t pad_id, size_t B, size_t T, size_t NH, size_t HS,
                                         ts_dtype dt) {
  static const char op[] = "ts_k_attention_bidir_forward";
  att_mask mk = {0, ids, pad_id};         /* the front passes ids NULL when pad_id < 0 */
  for (size_t b = 0; ids && b < B; b++) { /* every batch row needs a key to attend to */
    size_t j = 0;
    while (j < T && ids[b * T + j] == pad_id) j++;
    if (j == T)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "%s: batch row %zu: all %zu keys are padding (ids == pad_id = %d): "
                          "no key to attend to",
                          op, b, T, (int)pad_id);
  }
  return attn_forward(ctx, out, probs, q, k, v, B, T, NH, NH, HS, dt, &mk, op);
}

ts_status ts_cpu_attention_bidir_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                          const void *dout, const void *out, const void *q,
                                          const void *k, const void *v, const void *probs, size_t B,
                                          size_t T, size_t NH, size_t HS, ts_dtype dt) {
  static const att_mask bidir = {0, NULL, 0};
  return attn_backward(ctx, dq, dk, dv, dout, q, k, v, probs, B, T, NH, NH, HS, dt, &bidir,
                       "ts_k_attention_bidir_backward");
}
