/*
 * linear.cu — CUDA bodies of the linear layer (ts_k_linear_forward and
 * _backward, kernels/kernels.h: y = x W^T, Hugging Face nn.Linear layout;
 * ts_k_linear_bias_forward: y = x W^T + b) through cuBLASLt, and the
 * cuBLASLt handle of a context.
 *
 * Row-major (M, K) x (N, K)^T is the column-major product
 * out^T (N, M) = W^T(N, K) x^T (K, M), so each pass is one cublasLtMatmul
 * on the row-major buffers as they are:
 *   forward:  D (N x M, ld N)  = op_T(W: K x N, ld K) * inp (K x M, ld K)
 *   dinp:     D (K x M, ld K)  = W (K x N, ld K) * dout (N x M, ld N)
 *   dweight:  D (K x N, ld K) += inp (K x M, ld K) * op_T(dout: N x M, ld N)
 * (beta = 1 with C = D = dweight: the fp32 accumulator plus the old value,
 * rounded once to dt — the CPU's rule.) The forward with bias is the
 * forward with CUBLASLT_EPILOGUE_BIAS: the bias (N, D's type) is one entry
 * per row of D, added to the fp32 accumulator before D's one rounding.
 *
 * Precision: bf16/fp16 operands run on tensor cores with fp32 accumulation
 * (CUBLAS_COMPUTE_32F); fp32 uses CUBLAS_COMPUTE_32F, i.e. no TF32, so fp32
 * matches the CPU within fp32 bounds, unless ctx->flags has
 * TS_K_ALLOW_TF32 (CUBLAS_COMPUTE_32F_FAST_TF32).
 * Determinism: the algorithm is the heuristic's first choice for the shape
 * with a fixed workspace (TS_CUDA_LT_WORKSPACE), so the same shapes give the
 * same algorithm and the same bits on the same GPU and library.
 *
 * Loading: libcublasLt.so.13 is opened with dlopen when the first CUDA
 * context is made, not linked: it is 540 MB, and mapping it at start cost
 * every process, CPU-only runs and tests included, 0.1 s and ~210 MB of
 * resident memory (measured: `tessera estimate` 9 MB -> 219 MB peak RSS).
 * It is searched like any library: LD_LIBRARY_PATH, then the binary's
 * rpath (/usr/local/cuda/lib64), then ld.so.cache.
 */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernels_cuda.h"

/* cuBLASLt's workspace: 32 MiB, NVIDIA's recommendation for Hopper. */
static const size_t TS_CUDA_LT_WORKSPACE = (size_t)32 << 20;

/* cuBLASLt's workspace plus room to start it on a 256-byte boundary (the
 * caller's share of a workspace is only 64-byte aligned). */
extern "C" size_t ts_cuda_linear_workspace_bytes(size_t M, size_t N, size_t K, ts_dtype dt) {
  (void)M;
  (void)N;
  (void)K;
  (void)dt;
  return TS_CUDA_LT_WORKSPACE + 256;
}

/* The bias alignment below which ts_cuda_linear_bias_forward copies the
 * bias first: cuBLASLt's alignment preferences cover A, B, C and D but not
 * the bias, and its heuristic may pick a kernel that reads the bias 16
 * bytes at a time (PyTorch falls back to its unfused addmm there). */
static const uint32_t LT_BIAS_ALIGN = 16;

/* Those bytes, then N elements of dt for a bias under LT_BIAS_ALIGN: its
 * copy starts right after cuBLASLt's share (256-byte aligned, as that
 * share's size is a multiple of 256). */
extern "C" size_t ts_cuda_linear_bias_workspace_bytes(size_t M, size_t N, size_t K, ts_dtype dt) {
  return ts_cuda_linear_workspace_bytes(M, N, K, dt) + N * ts_dtype_size(dt);
}

/* cuBLASLt's share of ctx's workspace: its start rounded up to 256 bytes. */
static void *lt_workspace(const ts_kctx *ctx) {
  return (void *)(((uintptr_t)ctx->workspace + 255) & ~(uintptr_t)255);
}

/* The cuBLASLt functions this file calls, resolved from the library. */
#define TS_LT_FUNCTIONS(X)                                                                \
  X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetStatusString) X(cublasLtMatmul)      \
  X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute) \
  X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)                            \
  X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy)                    \
  X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulAlgoGetHeuristic)

static struct {
#define TS_LT_FIELD(f) decltype(&::f) f;
  TS_LT_FUNCTIONS(TS_LT_FIELD)
#undef TS_LT_FIELD
} lt;

static const char LT_LIBRARY[] = "libcublasLt.so.13";
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static char lt_error[512]; /* empty once loaded */

static void lt_load(void) {
  void *lib = dlopen(LT_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(lt_error, sizeof lt_error, "cannot load %s (%s)", LT_LIBRARY, dlerror());
    return;
  }
#define TS_LT_RESOLVE(f)                                                          \
  if (!(lt.f = (decltype(lt.f))dlsym(lib, #f))) {                                 \
    snprintf(lt_error, sizeof lt_error, "%s has no %s", LT_LIBRARY, #f);          \
    return;                                                                       \
  }
  TS_LT_FUNCTIONS(TS_LT_RESOLVE)
#undef TS_LT_RESOLVE
}

/* Loads cuBLASLt once per process; TS_ERR_CUDA saying why it could not. */
static ts_status lt_loaded(const char *op) {
  pthread_once(&lt_once, lt_load);
  if (!lt_error[0]) return TS_OK;
  return ts_set_error(TS_ERR_CUDA,
                      "%s (cuda): %s: the CUDA toolkit's cuBLAS (or PyTorch's nvidia-cublas "
                      "wheel) must be on LD_LIBRARY_PATH",
                      op, lt_error);
}

static ts_status lt_status(cublasStatus_t st, const char *op, const char *what) {
  if (st == CUBLAS_STATUS_SUCCESS) return TS_OK;
  return ts_set_error(TS_ERR_CUDA, "%s (cuda): %s: %s (%d)", op, what,
                      lt.cublasLtGetStatusString(st), (int)st);
}

extern "C" ts_status ts_cuda_blas_create(void **handle) {
  TS_CHECK(lt_loaded("ts_k_context_init"));
  cublasLtHandle_t h = nullptr;
  TS_CHECK(lt_status(lt.cublasLtCreate(&h), "ts_k_context_init", "cublasLtCreate"));
  *handle = h;
  return TS_OK;
}

extern "C" void ts_cuda_blas_destroy(void *handle) {
  if (handle) lt.cublasLtDestroy((cublasLtHandle_t)handle);
}

/* The alignment cuBLASLt may assume of p: the largest power of two up to
 * 256 dividing its address. Device buffers come from cudaMalloc (256-byte
 * aligned) and tensors sit at fixed offsets inside them, so this depends on
 * the tensor's offset alone: the same in every run and whether a unit's
 * parameters are resident or gathered (ZeRO-3), so the chosen algorithm,
 * and the bits, are too. */
static uint32_t alignment_of(const void *p) {
  uintptr_t a = (uintptr_t)p;
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al >>= 1;
  return al;
}

static cudaDataType_t data_type(ts_dtype dt) {
  return dt == TS_FP32 ? CUDA_R_32F : dt == TS_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

/* A matmul's cuBLASLt set-up: descriptors and the heuristic's algorithm
 * for one (device, shape, transposes, leading dimensions, dtype, TF32,
 * fp8 formats and scaling, epilogue, operand and bias alignments): a plan
 * with the bias epilogue is never one without it, nor the reverse.
 * Building it costs tens of microseconds of host time
 * (the heuristic query above all), ~20 times per block per micro-step, so
 * each is built once and kept for the process (host memory only, a few
 * hundred bytes each); the algorithm for a key never changes, so neither do
 * the bits. */
typedef struct lt_plan {
  int used, device, tf32;
  int fp8;                /* 1: fp8 operands (ts_cuda_matmul_fp8), scalar scales, D and C of dt */
  cudaDataType_t a8, b8;  /* their formats */
  int8_t fast_accum;
  int32_t epilogue;  /* cublasLtEpilogue_t: CUBLASLT_EPILOGUE_DEFAULT, or _BIAS (bias of D's
                        type, its pointer set at each call) */
  bool ta, tb;
  uint64_t m, n, k;
  int64_t lda, ldb, ldd;
  ts_dtype dt;
  uint32_t align[4]; /* A, B, C = D, the bias (0 without) */
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulAlgo_t algo;
} lt_plan;

enum { LT_PLANS = 512 };
static lt_plan lt_plans[LT_PLANS];
static pthread_mutex_t lt_plans_lock = PTHREAD_MUTEX_INITIALIZER;
/* Held from setting a kept plan's per-call pointers (fp8 scales, the
 * bias) until the product that reads them is queued: two threads sharing
 * a plan (ranks of one process on one GPU) each queue their own. */
static pthread_mutex_t lt_call_lock = PTHREAD_MUTEX_INITIALIZER;

static bool same_key(const lt_plan *a, const lt_plan *b) {
  return a->device == b->device && a->tf32 == b->tf32 && a->fp8 == b->fp8 && a->a8 == b->a8 &&
         a->b8 == b->b8 && a->fast_accum == b->fast_accum &&
         a->epilogue == b->epilogue && a->ta == b->ta && a->tb == b->tb &&
         a->m == b->m && a->n == b->n && a->k == b->k && a->lda == b->lda && a->ldb == b->ldb &&
         a->ldd == b->ldd && a->dt == b->dt && a->align[0] == b->align[0] &&
         a->align[1] == b->align[1] && a->align[2] == b->align[2] && a->align[3] == b->align[3];
}

static void plan_release(lt_plan *p) {
  if (p->ld) lt.cublasLtMatrixLayoutDestroy(p->ld);
  if (p->lb) lt.cublasLtMatrixLayoutDestroy(p->lb);
  if (p->la) lt.cublasLtMatrixLayoutDestroy(p->la);
  if (p->desc) lt.cublasLtMatmulDescDestroy(p->desc);
  p->desc = nullptr;
  p->la = p->lb = p->ld = nullptr;
}

/* Fills p's descriptors and algorithm from its key; bias: the epilogue's
 * (its address tells the heuristic its alignment), NULL without. */
static ts_status plan_build(cublasLtHandle_t h, lt_plan *p, const char *op, const void *bias) {
  cudaDataType_t ty = data_type(p->dt);
  cublasComputeType_t ct = p->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasOperation_t opa = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  size_t ws = TS_CUDA_LT_WORKSPACE;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  uint64_t m = p->m, n = p->n, k = p->k;
  ts_status st =
      lt_status(lt.cublasLtMatmulDescCreate(&p->desc, ct, CUDA_R_32F), op, "MatmulDescCreate");
  if (st == TS_OK)
    st = lt_status(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa,
                                                     sizeof opa),
                   op, "TRANSA");
  if (st == TS_OK)
    st = lt_status(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb,
                                                     sizeof opb),
                   op, "TRANSB");
  if (st == TS_OK && p->fp8) /* the scale modes stay cuBLASLt's default, scalar */
    st = lt_status(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                     &p->fast_accum, sizeof p->fast_accum),
                   op, "FAST_ACCUM");
  if (st == TS_OK && p->epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    const int32_t bias_type = ty; /* D's, as cuBLASLt requires for bf16/fp16/fp32 D */
    const cublasLtMatmulDescAttributes_t attr[3] = {CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                    CUBLASLT_MATMUL_DESC_BIAS_POINTER};
    const void *val[3] = {&p->epilogue, &bias_type, &bias};
    const size_t len[3] = {sizeof p->epilogue, sizeof bias_type, sizeof bias};
    for (int i = 0; i < 3 && st == TS_OK; i++)
      st = lt_status(lt.cublasLtMatmulDescSetAttribute(p->desc, attr[i], val[i], len[i]), op,
                     "epilogue attribute");
  }
  if (st == TS_OK)
    st = lt_status(lt.cublasLtMatrixLayoutCreate(&p->la, p->fp8 ? p->a8 : ty, p->ta ? k : m,
                                                 p->ta ? m : k, p->lda),
                   op, "layout A");
  if (st == TS_OK)
    st = lt_status(lt.cublasLtMatrixLayoutCreate(&p->lb, p->fp8 ? p->b8 : ty, p->tb ? n : k,
                                                 p->tb ? k : n, p->ldb),
                   op, "layout B");
  if (st == TS_OK)
    st = lt_status(lt.cublasLtMatrixLayoutCreate(&p->ld, ty, m, n, p->ldd), op, "layout D");
  if (st == TS_OK) st = lt_status(lt.cublasLtMatmulPreferenceCreate(&pref), op, "PreferenceCreate");
  if (st == TS_OK)
    st = lt_status(lt.cublasLtMatmulPreferenceSetAttribute(
                       pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                   op, "MAX_WORKSPACE_BYTES");
  /* Without these the heuristic assumes 256-byte aligned operands, which
   * a weight inside a flat buffer need not be. */
  const uint32_t align[4] = {p->align[0], p->align[1], p->align[2], p->align[2]};
  const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4 && st == TS_OK; i++)
    st = lt_status(lt.cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i],
                                                           sizeof align[i]),
                   op, "MIN_ALIGNMENT");
  if (st == TS_OK)
    st = lt_status(lt.cublasLtMatmulAlgoGetHeuristic(h, p->desc, p->la, p->lb, p->ld, p->ld, pref,
                                                     1, &heur, &found),
                   op, "AlgoGetHeuristic");
  if (st == TS_OK && found == 0)
    st = ts_set_error(TS_ERR_UNSUPPORTED,
                      "%s (cuda): cuBLASLt has no algorithm for %llu x %llu x %llu in %s%s", op,
                      (unsigned long long)m, (unsigned long long)n, (unsigned long long)k,
                      p->fp8 ? "fp8 to " : "", ts_dtype_name(p->dt));
  if (pref) lt.cublasLtMatmulPreferenceDestroy(pref);
  if (st == TS_OK) p->algo = heur.algo;
  else plan_release(p);
  return st;
}

/* One column-major matmul D (m x n, ld ldd) = op(A) op(B) [+ bias (m),
 * one entry per row of D] + beta D, A stored (ta ? k x m : m x k) with ld
 * lda, B stored (tb ? n x k : k x n) with ld ldb, through the kept plan of
 * its key (built on first use; a full table builds a temporary one). The
 * bias (NULL: none) must be LT_BIAS_ALIGN-aligned. */
static ts_status matmul_key(const ts_kctx *ctx, const char *op, lt_plan *key, const void *A,
                            const void *B, void *D, float beta, const float *sa, const float *sb,
                            const void *bias);

static ts_status matmul(const ts_kctx *ctx, const char *op, bool ta, bool tb, uint64_t m,
                        uint64_t n, uint64_t k, const void *A, int64_t lda, const void *B,
                        int64_t ldb, void *D, int64_t ldd, float beta, ts_dtype dt,
                        const void *bias = nullptr) {
  lt_plan key = {};
  key.tf32 = dt == TS_FP32 && (ctx->flags & TS_K_ALLOW_TF32);
  key.ta = ta;
  key.tb = tb;
  key.m = m;
  key.n = n;
  key.k = k;
  key.lda = lda;
  key.ldb = ldb;
  key.ldd = ldd;
  key.dt = dt;
  key.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  return matmul_key(ctx, op, &key, A, B, D, beta, nullptr, nullptr, bias);
}

extern "C" ts_status ts_cuda_matmul_fp8(const ts_kctx *ctx, const char *op, size_t P, size_t S,
                                        size_t Q, const uint8_t *A, ts_fp8_format fa,
                                        const float *sa, const uint8_t *B, ts_fp8_format fb,
                                        const float *sb, void *D, ts_dtype d_dt, int accumulate,
                                        int fast_accum) {
  /* column-major D^T (S x P, ld S) = op_T(B stored Q x S) * A (Q x P): cuBLASLt's A is our B */
  lt_plan key = {};
  key.fp8 = 1;
  key.a8 = fb == TS_FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
  key.b8 = fa == TS_FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
  key.fast_accum = (int8_t)(fast_accum != 0);
  key.ta = true;
  key.tb = false;
  key.m = S;
  key.n = P;
  key.k = Q;
  key.lda = (int64_t)Q;
  key.ldb = (int64_t)Q;
  key.ldd = (int64_t)S;
  key.dt = d_dt;
  key.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  return matmul_key(ctx, op, &key, B, A, D, accumulate ? 1.0f : 0.0f, sb, sa, nullptr);
}

/* The matmul of key (its shape, types and attributes filled; the rest set
 * here) on A, B and D; fp8: sa and sb the scale vectors of cuBLASLt's A
 * and B; the bias epilogue: its bias. */
static ts_status matmul_key(const ts_kctx *ctx, const char *op, lt_plan *keyp, const void *A,
                            const void *B, void *D, float beta, const float *sa, const float *sb,
                            const void *bias) {
  if (!ctx->blas)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "%s (cuda): the context has no cuBLASLt handle: make it with "
                        "ts_k_context_init",
                        op);
  cublasLtHandle_t h = (cublasLtHandle_t)ctx->blas;
  lt_plan key = *keyp;
  key.used = 1;
  key.device = ctx->device_index;
  key.align[0] = alignment_of(A);
  key.align[1] = alignment_of(B);
  key.align[2] = alignment_of(D);
  key.align[3] = bias ? alignment_of(bias) : 0;
  lt_plan temp = key, *p = nullptr;
  ts_status st = TS_OK;
  pthread_mutex_lock(&lt_plans_lock);
  for (int i = 0; i < LT_PLANS && !p; i++) {
    if (lt_plans[i].used && same_key(&lt_plans[i], &key)) {
      p = &lt_plans[i];
    } else if (!lt_plans[i].used) {
      st = plan_build(h, &key, op, bias);
      if (st == TS_OK) lt_plans[i] = key;
      p = &lt_plans[i];
    }
  }
  pthread_mutex_unlock(&lt_plans_lock);
  if (!p) { /* every slot holds another key */
    st = plan_build(h, &temp, op, bias);
    p = &temp;
  }
  bool per_call = key.fp8 || key.epilogue != CUBLASLT_EPILOGUE_DEFAULT;
  if (per_call) pthread_mutex_lock(&lt_call_lock); /* until the product is queued */
  if (st == TS_OK && key.fp8)
    st = lt_status(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                     &sa, sizeof sa),
                   op, "A_SCALE_POINTER");
  if (st == TS_OK && key.fp8)
    st = lt_status(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                     &sb, sizeof sb),
                   op, "B_SCALE_POINTER");
  if (st == TS_OK && key.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    st = lt_status(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias, sizeof bias),
                   op, "BIAS_POINTER");
  float alpha = 1.0f;
  if (st == TS_OK)
    st = lt_status(lt.cublasLtMatmul(h, p->desc, &alpha, A, p->la, B, p->lb, &beta, D, p->ld, D,
                                     p->ld, &p->algo, lt_workspace(ctx), TS_CUDA_LT_WORKSPACE,
                                     (cudaStream_t)ctx->stream),
                   op, "cublasLtMatmul");
  if (per_call) pthread_mutex_unlock(&lt_call_lock);
  if (p == &temp) plan_release(&temp);
  return st;
}

extern "C" ts_status ts_cuda_linear_forward(const ts_kctx *ctx, void *out, const void *inp,
                                            const void *weight, size_t M, size_t N, size_t K,
                                            ts_dtype dt) {
  if (M == 0 || N == 0) return TS_OK;
  return matmul(ctx, "ts_k_linear_forward", true, false, N, M, K, weight, (int64_t)K, inp,
                (int64_t)K, out, (int64_t)N, 0.0f, dt);
}

/* The forward with CUBLASLT_EPILOGUE_BIAS; a bias under LT_BIAS_ALIGN is
 * copied to the workspace's slot after cuBLASLt's share first (in stream
 * order, so the product reads the copy). */
extern "C" ts_status ts_cuda_linear_bias_forward(const ts_kctx *ctx, void *out, const void *inp,
                                                 const void *weight, const void *bias, size_t M,
                                                 size_t N, size_t K, ts_dtype dt) {
  static const char op[] = "ts_k_linear_bias_forward";
  if (alignment_of(bias) < LT_BIAS_ALIGN) {
    void *slot = (char *)lt_workspace(ctx) + TS_CUDA_LT_WORKSPACE;
    TS_CHECK(ts_cuda_copy(ctx, slot, bias, N * ts_dtype_size(dt)));
    bias = slot;
  }
  return matmul(ctx, op, true, false, N, M, K, weight, (int64_t)K, inp, (int64_t)K, out,
                (int64_t)N, 0.0f, dt, bias);
}

extern "C" ts_status ts_cuda_linear_backward(const ts_kctx *ctx, void *dinp, void *dweight,
                                             const void *dout, const void *inp,
                                             const void *weight, size_t M, size_t N, size_t K,
                                             ts_dtype dt) {
  static const char op[] = "ts_k_linear_backward";
  if (dinp)
    TS_CHECK(matmul(ctx, op, false, false, K, M, N, weight, (int64_t)K, dout, (int64_t)N, dinp,
                    (int64_t)K, 0.0f, dt));
  if (dweight)
    TS_CHECK(matmul(ctx, op, false, true, K, N, M, inp, (int64_t)K, dout, (int64_t)N, dweight,
                    (int64_t)K, 1.0f, dt));
  return TS_OK;
}
