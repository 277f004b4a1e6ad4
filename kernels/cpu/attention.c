/*
 * attention.c — the CPU body of scaled dot-product attention (Vaswani et
 * al. 2017 eq. 1), forward and backward, fused: the probabilities are
 * never stored. Two masks share one code path: causal grouped-query
 * attention (GQA: Ainslie et al. 2023; ts_k_attention_*) and
 * bidirectional multi-head attention with a key padding mask (Hugging Face
 * BertSelfAttention; ts_k_attention_bidir_*).
 *
 * Per batch row b and query head h (kv head g = h / (NH / NKV)), with
 * s = 1/sqrt(HS): S = s Q K^T, P = softmax_rows(S + mask), O = P V, where
 * the mask lets query t see keys 0..t (causal) or every key whose id is
 * not the pad id (bidirectional); a key it does not see gets P = 0 exactly.
 *
 * Forward (FlashAttention-2, Dao 2023, Algorithm 1, with BLAS products):
 * per (batch row, head, block of QB query rows), over the blocks of KB
 * keys the rows see (causal: up to the last row's diagonal), in order,
 * with the running row max m and sum l (online softmax, Milakov &
 * Gimelshein 2018):
 *   S = s Q_r K_c^T;  m' = max(m, rowmax S);  P~ = exp(S - m');
 *   l = e^(m - m') l + rowsum P~;  O_r = diag(e^(m - m')) O_r + P~ V_c
 * then O_r = diag(1/l) O_r and the state keeps L = m + log l per row.
 * Backward (Algorithm 2): per (batch row, kv head), its query heads in
 * head order, their query blocks and the key blocks in order:
 *   S = s Q_r K_c^T;  P = exp(S - L) (0 where not seen);  dV_c += P^T dO_r
 *   dP = dO_r V_c^T;  dS = s P * (dP - D);  dQ_r += dS K_c;  dK_c += dS^T Q_r
 * with D = rowsum(P * dP) where the rows' keys fit one key block (T <= KB,
 * or a causal first block: P and dP are at hand, and D is then the sum of
 * the very terms dS subtracts it from, so each row of dS sums to 0 within
 * one rounding, as the unfused backward had it), else D = rowsum(dO * O)
 * (FlashAttention-2's, computed once per row before the key blocks). A
 * row of dS that does not sum to 0 biases dQ along the mean key: with D
 * from O for every block, BERT's hf_parity AdamW run ended its layer-0
 * attention weights 9.2e-5 (relative RMS) from transformers', 4.9e-5 with
 * D from P and dP, and 6.6e-5 before the fused kernel.
 *
 * Invariants:
 * - State (ts_cpu_attention_state_bytes, every dtype; the layout of the
 *   CUDA backend's log-sum-exp state): L (B, NH, T) fp32, then (B, T)
 *   uint8 key flags, 1 where the key is seen, written and read by the
 *   bidirectional op only (the causal op leaves them untouched).
 * - Work is split into items of a fixed size, whatever the thread count:
 *   the forward's items are (batch row, head, query block) triples, the
 *   backward's (batch row, kv head) pairs, whose query heads run in head
 *   order inside the item (heads of a GQA group accumulate into dK/dV in
 *   that order). One OpenMP loop hands the items to threads; inside it
 *   every cblas_sgemm runs on its calling thread alone (the OpenMP build of
 *   OpenBLAS in an active region; with one thread, OpenBLAS's own count is
 *   one). So each output element comes from one fixed sequence of
 *   operations at any thread count, and results do not depend on it.
 * - Scratch: one block's S/P and dP (QB x KB fp32 each) on the item's
 *   stack. ctx->workspace holds only what bf16/fp16 need: a chunk of batch
 *   rows' operands widened to fp32 and their fp32 outputs (half dtypes run
 *   the fp32 path a chunk at a time and round the outputs once). A chunk is
 *   as many rows as fit CHUNK_BYTES (at least one, at most B): one OpenMP
 *   loop per chunk instead of per row (llama-small bf16, 16 rows: 4 chunks
 *   in the backward, 2 in the forward). Each row's items are the same in
 *   any chunk, so the bits do not depend on it.
 *   ts_cpu_attention_workspace_bytes is the larger of the forward and
 *   backward needs, exactly; fp32 needs none.
 */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/cpu_common.h"

enum { QB = 128 }; /* query rows per block */
enum { KB = 128 }; /* keys per block of the online softmax */
/* Most workspace bytes a chunk of batch rows takes (half dtypes) */
#define CHUNK_BYTES ((size_t)8 << 20)

/* ---- state and workspace layout ------------------------------------------- */

/* Byte offset of the key flags (B, T) in a state of B batch rows. */
static size_t keep_offset(size_t B, size_t T, size_t NH) { return B * NH * T * sizeof(float); }

size_t ts_cpu_attention_state_bytes(size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                                    ts_dtype dt) {
  (void)NKV;
  (void)HS;
  (void)dt;
  return keep_offset(B, T, NH) + B * T;
}

/* Byte offsets of the fp32 buffers a half-dtype call carves from the
 * workspace: `rows` batch rows each. */
typedef struct {
  size_t q, k, v, out, dout; /* widened operands (out, dout: backward) */
  size_t o, dq, dk, dv;      /* fp32 results (o: forward) */
  size_t total;              /* bytes */
} ws_layout;

/* Appends a buffer of `bytes` at *end (64-byte aligned); returns its offset. */
static size_t carve(size_t *end, size_t bytes) {
  size_t o = *end;
  *end += ts_align64(bytes);
  return o;
}

static ws_layout layout(size_t rows, size_t T, size_t NH, size_t NKV, size_t HS, ts_dtype dt,
                        int backward) {
  ws_layout w;
  memset(&w, 0, sizeof w);
  size_t end = 0, nq = rows * T * NH * HS * sizeof(float), nk = rows * T * NKV * HS * sizeof(float);
  if (dt != TS_FP32) {
    w.q = carve(&end, nq);
    w.k = carve(&end, nk);
    w.v = carve(&end, nk);
    if (backward) {
      w.out = carve(&end, nq);
      w.dout = carve(&end, nq);
      w.dq = carve(&end, nq);
      w.dk = carve(&end, nk);
      w.dv = carve(&end, nk);
    } else {
      w.o = carve(&end, nq);
    }
  }
  w.total = end;
  return w;
}

/* Batch rows per chunk of a half-dtype call over B rows (backward or not). */
static size_t chunk_rows(size_t B, size_t T, size_t NH, size_t NKV, size_t HS, ts_dtype dt,
                         int backward) {
  size_t per_row = layout(1, T, NH, NKV, HS, dt, backward).total, rows = 1;
  if (per_row > 0 && CHUNK_BYTES / per_row > rows) rows = CHUNK_BYTES / per_row;
  return rows < B ? rows : B;
}

size_t ts_cpu_attention_workspace_bytes(size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                                        ts_dtype dt) {
  size_t f = layout(chunk_rows(B, T, NH, NKV, HS, dt, 0), T, NH, NKV, HS, dt, 0).total;
  size_t b = layout(chunk_rows(B, T, NH, NKV, HS, dt, 1), T, NH, NKV, HS, dt, 1).total;
  return f > b ? f : b;
}

/* ---- fp32 core ------------------------------------------------------------- */

/* Which keys each query row of one batch row sees: 0..t (causal), or all T
 * keys but those whose flag is 0 (bidirectional; keep NULL: every key). */
typedef struct {
  int causal;          /* 1: causal; 0: bidirectional */
  const uint8_t *keep; /* (T) flags of the batch row, or NULL */
} att_mask;

/* Keys [0, n) that the products of a block ending at row t span. */
static size_t key_end(const att_mask *mk, size_t t, size_t T) { return mk->causal ? t + 1 : T; }

/* Of the kn keys of the block starting at key k0, those before the
 * returned count may be seen by query row t (causal: the keys up to t). */
static size_t row_keys(const att_mask *mk, size_t t, size_t k0, size_t kn) {
  if (!mk->causal) return kn;
  if (t < k0) return 0;
  return t + 1 - k0 < kn ? t + 1 - k0 : kn;
}

/* Row i of a block's probabilities over its kn keys, in place: p[j] =
 * e^(p[j] - x0) for the first e keys when seen (keep NULL, or keep[j] !=
 * 0), else 0. Vectorised; ts_cpu_exp gives the same bits at every width. */
TS_AI void exp_row(float *p, size_t e, size_t kn, float x0, const uint8_t *keep) {
  if (keep == NULL) {
#pragma omp simd
    for (size_t j = 0; j < e; j++) p[j] = ts_cpu_exp(p[j] - x0);
  } else {
#pragma omp simd
    for (size_t j = 0; j < e; j++) p[j] = keep[j] ? ts_cpu_exp(p[j] - x0) : 0.0f;
  }
  for (size_t j = e; j < kn; j++) p[j] = 0.0f;
}

/* One forward block: rows [r0, r1) of one (batch row, head). q, o: the
 * head's column (leading dimension ldq), k, v: its kv head's (ldk); lse:
 * the head's T row log-sum-exps. */
TS_AI void fwd_block_body(float *o, float *lse, const float *q, const float *k, const float *v,
                          int ldq, int ldk, size_t r0, size_t r1, size_t T, size_t HS, float scale,
                          const att_mask *mk) {
  float s[QB * KB], m[QB], l[QB];
  size_t rows = r1 - r0, n = key_end(mk, r1 - 1, T);
  for (size_t i = 0; i < rows; i++) m[i] = -INFINITY, l[i] = 0.0f;
  for (size_t k0 = 0; k0 < n; k0 += KB) {
    size_t kn = n - k0 < KB ? n - k0 : KB;
    /* S = s Q[r0:r1] K[k0:k0+kn]^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)kn, (int)HS, scale,
                q + r0 * ldq, ldq, k + k0 * ldk, ldk, 0.0f, s, KB);
    const uint8_t *keep = mk->keep ? mk->keep + k0 : NULL;
    for (size_t i = 0; i < rows; i++) {
      float *si = s + i * KB, mx = m[i], sum = 0.0f;
      size_t e = row_keys(mk, r0 + i, k0, kn);
      for (size_t j = 0; j < e; j++)
        if ((keep == NULL || keep[j]) && si[j] > mx) mx = si[j];
      if (mx == -INFINITY) { /* nothing seen yet: P~ = 0, O stays 0 */
        memset(si, 0, kn * sizeof(float));
        continue;
      }
      exp_row(si, e, kn, mx, keep);
      for (size_t j = 0; j < e; j++) sum += si[j]; /* in key order */
      if (k0 > 0 && mx != m[i]) {                  /* rescale what earlier blocks added */
        float a = ts_cpu_exp(m[i] - mx), *oi = o + (r0 + i) * ldq;
        l[i] *= a;
        for (size_t c = 0; c < HS; c++) oi[c] *= a;
      }
      l[i] += sum;
      m[i] = mx;
    }
    /* O[r0:r1] (+)= P~ V[k0:k0+kn] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)HS, (int)kn, 1.0f, s, KB,
                v + k0 * ldk, ldk, k0 == 0 ? 0.0f : 1.0f, o + r0 * ldq, ldq);
  }
  for (size_t i = 0; i < rows; i++) {
    float inv = 1.0f / l[i], *oi = o + (r0 + i) * ldq;
    for (size_t c = 0; c < HS; c++) oi[c] *= inv;
    lse[r0 + i] = m[i] + logf(l[i]);
  }
}

TS_CPU_CLONES(fwd_block,
              (float *o, float *lse, const float *q, const float *k, const float *v, int ldq,
               int ldk, size_t r0, size_t r1, size_t T, size_t HS, float scale,
               const att_mask *mk),
              (o, lse, q, k, v, ldq, ldk, r0, r1, T, HS, scale, mk))

/* fp32 forward over B batch rows (layouts as in kernels.h); lse (B, NH, T);
 * keep: (B, T) flags or NULL. */
static void attn_fwd_f32(float *out, float *lse, const float *q, const float *k, const float *v,
                         size_t B, size_t T, size_t NH, size_t NKV, size_t HS, int causal,
                         const uint8_t *keep) {
  const float scale = 1.0f / sqrtf((float)HS);
  const size_t rep = NH / NKV, nqb = (T + QB - 1) / QB;
  const int ldq = (int)(NH * HS), ldk = (int)(NKV * HS);
  ptrdiff_t items = (ptrdiff_t)(B * NH * nqb);
#pragma omp parallel for schedule(dynamic)
  for (ptrdiff_t it = 0; it < items; it++) { /* one (batch row, head, query block) */
    size_t b = (size_t)it / (NH * nqb), h = (size_t)it / nqb % NH, r0 = (size_t)it % nqb * QB;
    size_t r1 = r0 + QB < T ? r0 + QB : T;
    att_mask mk = {causal, keep ? keep + b * T : NULL};
    fwd_block(out + b * T * NH * HS + h * HS, lse + (b * NH + h) * T, q + b * T * NH * HS + h * HS,
              k + b * T * NKV * HS + h / rep * HS, v + b * T * NKV * HS + h / rep * HS, ldq, ldk,
              r0, r1, T, HS, scale, &mk);
  }
}

/* One backward block: query rows [r0, r1) of one (batch row, head) against
 * all the keys they see. Pointers as in fwd_block (dq, dout, out: the
 * head's columns; dk, dv: its kv head's); writes dQ of the rows, adds into
 * dK and dV. */
TS_AI void bwd_block_body(float *dq, float *dk, float *dv, const float *dout, const float *out,
                          const float *q, const float *k, const float *v, const float *lse,
                          int ldq, int ldk, size_t r0, size_t r1, size_t T, size_t HS,
                          float scale, const att_mask *mk) {
  float p[QB * KB], dp[QB * KB], d[QB];
  size_t rows = r1 - r0, n = key_end(mk, r1 - 1, T);
  const int one_block = n <= KB;                    /* D from this block's P and dP */
  for (size_t i = 0; !one_block && i < rows; i++) { /* D = rowsum(dO * O) */
    const float *doi = dout + (r0 + i) * ldq, *oi = out + (r0 + i) * ldq;
    float acc = 0.0f;
    for (size_t c = 0; c < HS; c++) acc += doi[c] * oi[c];
    d[i] = acc;
  }
  for (size_t k0 = 0; k0 < n; k0 += KB) {
    size_t kn = n - k0 < KB ? n - k0 : KB;
    /* P = exp(s Q[r0:r1] K[k0:k0+kn]^T - L), 0 where not seen */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)kn, (int)HS, scale,
                q + r0 * ldq, ldq, k + k0 * ldk, ldk, 0.0f, p, KB);
    for (size_t i = 0; i < rows; i++)
      exp_row(p + i * KB, row_keys(mk, r0 + i, k0, kn), kn, lse[r0 + i],
              mk->keep ? mk->keep + k0 : NULL);
    /* dV[k0:k0+kn] += P^T dO[r0:r1] */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)kn, (int)HS, (int)rows, 1.0f, p, KB,
                dout + r0 * ldq, ldq, 1.0f, dv + k0 * ldk, ldk);
    /* dP = dO[r0:r1] V[k0:k0+kn]^T, then dS = s P * (dP - D) in place */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)kn, (int)HS, 1.0f,
                dout + r0 * ldq, ldq, v + k0 * ldk, ldk, 0.0f, dp, KB);
    for (size_t i = 0; i < rows; i++) {
      float *dpi = dp + i * KB;
      const float *pi = p + i * KB;
      if (one_block) { /* D = rowsum(P * dP), in key order */
        float acc = 0.0f;
        for (size_t j = 0; j < kn; j++) acc += pi[j] * dpi[j];
        d[i] = acc;
      }
      float di = d[i];
#pragma omp simd
      for (size_t j = 0; j < kn; j++) dpi[j] = scale * (pi[j] * (dpi[j] - di));
    }
    /* dQ[r0:r1] (+)= dS K[k0:k0+kn];  dK[k0:k0+kn] += dS^T Q[r0:r1] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)HS, (int)kn, 1.0f, dp,
                KB, k + k0 * ldk, ldk, k0 == 0 ? 0.0f : 1.0f, dq + r0 * ldq, ldq);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)kn, (int)HS, (int)rows, 1.0f, dp, KB,
                q + r0 * ldq, ldq, 1.0f, dk + k0 * ldk, ldk);
  }
}

TS_CPU_CLONES(bwd_block,
              (float *dq, float *dk, float *dv, const float *dout, const float *out,
               const float *q, const float *k, const float *v, const float *lse, int ldq, int ldk,
               size_t r0, size_t r1, size_t T, size_t HS, float scale, const att_mask *mk),
              (dq, dk, dv, dout, out, q, k, v, lse, ldq, ldk, r0, r1, T, HS, scale, mk))

/* fp32 backward over B batch rows; lse (B, NH, T); keep: (B, T) or NULL. */
static void attn_bwd_f32(float *dq, float *dk, float *dv, const float *dout, const float *out,
                         const float *q, const float *k, const float *v, const float *lse, size_t B,
                         size_t T, size_t NH, size_t NKV, size_t HS, int causal,
                         const uint8_t *keep) {
  const float scale = 1.0f / sqrtf((float)HS);
  const size_t rep = NH / NKV;
  const int ldq = (int)(NH * HS), ldk = (int)(NKV * HS);
  ptrdiff_t items = (ptrdiff_t)(B * NKV);
#pragma omp parallel for schedule(dynamic)
  for (ptrdiff_t it = 0; it < items; it++) { /* one (batch row, kv head) */
    size_t b = (size_t)it / NKV, g = (size_t)it % NKV;
    size_t ko = b * T * NKV * HS + g * HS;
    att_mask mk = {causal, keep ? keep + b * T : NULL};
    for (size_t t = 0; t < T; t++) {
      memset(dk + ko + t * ldk, 0, HS * sizeof(float));
      memset(dv + ko + t * ldk, 0, HS * sizeof(float));
    }
    for (size_t h = g * rep; h < (g + 1) * rep; h++) {
      size_t qo = b * T * NH * HS + h * HS;
      for (size_t r0 = 0; r0 < T; r0 += QB)
        bwd_block(dq + qo, dk + ko, dv + ko, dout + qo, out + qo, q + qo, k + ko, v + ko,
                  lse + (b * NH + h) * T, ldq, ldk, r0, r0 + QB < T ? r0 + QB : T, T, HS, scale,
                  &mk);
    }
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

/* Forward of either mask; keep: the state's (B, T) flags, already written,
 * or NULL. */
static ts_status attn_forward(const ts_kctx *ctx, void *out, void *state, const void *q,
                              const void *k, const void *v, size_t B, size_t T, size_t NH,
                              size_t NKV, size_t HS, ts_dtype dt, int causal, const uint8_t *keep,
                              const char *op) {
  TS_CHECK(check_blas_dims(T, NH, HS, op));
  float *lse = (float *)state;
  if (dt == TS_FP32) {
    attn_fwd_f32(out, lse, q, k, v, B, T, NH, NKV, HS, causal, keep);
    return TS_OK;
  }
  size_t R = chunk_rows(B, T, NH, NKV, HS, dt, 0);
  ws_layout w = layout(R, T, NH, NKV, HS, dt, 0);
  char *ws = (char *)ctx->workspace;
  float *fq = (float *)(ws + w.q), *fk = (float *)(ws + w.k), *fv = (float *)(ws + w.v);
  float *fo = (float *)(ws + w.o);
  size_t es = ts_dtype_size(dt), nq = T * NH * HS, nk = T * NKV * HS;
  for (size_t b = 0; b < B; b += R) { /* rows [b, b + r) */
    size_t r = B - b < R ? B - b : R;
    ts_cpu_widen(fq, (const char *)q + b * nq * es, r * nq, dt);
    ts_cpu_widen(fk, (const char *)k + b * nk * es, r * nk, dt);
    ts_cpu_widen(fv, (const char *)v + b * nk * es, r * nk, dt);
    attn_fwd_f32(fo, lse + b * NH * T, fq, fk, fv, r, T, NH, NKV, HS, causal,
                 keep ? keep + b * T : NULL);
    ts_cpu_narrow((char *)out + b * nq * es, fo, r * nq, dt);
  }
  return TS_OK;
}

/* Backward of either mask; keep as in attn_forward. */
static ts_status attn_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv, const void *dout,
                               const void *out, const void *q, const void *k, const void *v,
                               const void *state, size_t B, size_t T, size_t NH, size_t NKV,
                               size_t HS, ts_dtype dt, int causal, const uint8_t *keep,
                               const char *op) {
  TS_CHECK(check_blas_dims(T, NH, HS, op));
  const float *lse = (const float *)state;
  if (dt == TS_FP32) {
    attn_bwd_f32(dq, dk, dv, dout, out, q, k, v, lse, B, T, NH, NKV, HS, causal, keep);
    return TS_OK;
  }
  size_t R = chunk_rows(B, T, NH, NKV, HS, dt, 1);
  ws_layout w = layout(R, T, NH, NKV, HS, dt, 1);
  char *ws = (char *)ctx->workspace;
  float *fq = (float *)(ws + w.q), *fk = (float *)(ws + w.k), *fv = (float *)(ws + w.v);
  float *fout = (float *)(ws + w.out), *fdo = (float *)(ws + w.dout);
  float *fdq = (float *)(ws + w.dq), *fdk = (float *)(ws + w.dk), *fdv = (float *)(ws + w.dv);
  size_t es = ts_dtype_size(dt), nq = T * NH * HS, nk = T * NKV * HS;
  for (size_t b = 0; b < B; b += R) { /* rows [b, b + r) */
    size_t r = B - b < R ? B - b : R;
    ts_cpu_widen(fdo, (const char *)dout + b * nq * es, r * nq, dt);
    ts_cpu_widen(fout, (const char *)out + b * nq * es, r * nq, dt);
    ts_cpu_widen(fq, (const char *)q + b * nq * es, r * nq, dt);
    ts_cpu_widen(fk, (const char *)k + b * nk * es, r * nk, dt);
    ts_cpu_widen(fv, (const char *)v + b * nk * es, r * nk, dt);
    attn_bwd_f32(fdq, fdk, fdv, fdo, fout, fq, fk, fv, lse + b * NH * T, r, T, NH, NKV, HS, causal,
                 keep ? keep + b * T : NULL);
    ts_cpu_narrow((char *)dq + b * nq * es, fdq, r * nq, dt);
    ts_cpu_narrow((char *)dk + b * nk * es, fdk, r * nk, dt);
    ts_cpu_narrow((char *)dv + b * nk * es, fdv, r * nk, dt);
  }
  return TS_OK;
}

ts_status ts_cpu_attention_forward(const ts_kctx *ctx, void *out, void *state, const void *q,
                                   const void *k, const void *v, size_t B, size_t T, size_t NH,
                                   size_t NKV, size_t HS, ts_dtype dt) {
  return attn_forward(ctx, out, state, q, k, v, B, T, NH, NKV, HS, dt, 1, NULL,
                      "ts_k_attention_forward");
}

ts_status ts_cpu_attention_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                    const void *dout, const void *out, const void *q, const void *k,
                                    const void *v, const void *state, size_t B, size_t T, size_t NH,
                                    size_t NKV, size_t HS, ts_dtype dt) {
  return attn_backward(ctx, dq, dk, dv, dout, out, q, k, v, state, B, T, NH, NKV, HS, dt, 1, NULL,
                       "ts_k_attention_backward");
}

ts_status ts_cpu_attention_bidir_forward(const ts_kctx *ctx, void *out, void *state, const void *q,
                                         const void *k, const void *v, const int32_t *ids,
                                         int32_t pad_id, size_t B, size_t T, size_t NH, size_t HS,
                                         ts_dtype dt) {
  static const char op[] = "ts_k_attention_bidir_forward";
  /* the front passes ids NULL when pad_id < 0 */
  for (size_t b = 0; ids && b < B; b++) { /* every batch row needs a key to attend to */
    size_t j = 0;
    while (j < T && ids[b * T + j] == pad_id) j++;
    if (j == T)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "%s: batch row %zu: all %zu keys are padding (ids == pad_id = %d): "
                          "no key to attend to",
                          op, b, T, (int)pad_id);
  }
  uint8_t *keep = (uint8_t *)state + keep_offset(B, T, NH);
  for (size_t i = 0; i < B * T; i++) keep[i] = ids == NULL || ids[i] != pad_id;
  return attn_forward(ctx, out, state, q, k, v, B, T, NH, NH, HS, dt, 0, keep, op);
}

ts_status ts_cpu_attention_bidir_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                          const void *dout, const void *out, const void *q,
                                          const void *k, const void *v, const void *state, size_t B,
                                          size_t T, size_t NH, size_t HS, ts_dtype dt) {
  const uint8_t *keep = (const uint8_t *)state + keep_offset(B, T, NH);
  return attn_backward(ctx, dq, dk, dv, dout, out, q, k, v, state, B, T, NH, NH, HS, dt, 0, keep,
                       "ts_k_attention_bidir_backward");
}
