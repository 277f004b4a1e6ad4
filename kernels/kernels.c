/*
 * kernels.c — the kernels front: every public ts_k_* function validates its
 * arguments here, once, for every device, then calls the op of the
 * context's backend table (kernels/backend.h).
 *
 * Invariants: every check below runs before any backend is called, so a
 * rejected call writes nothing on any device; the empty cases kernels.h
 * defines (nothing to do, or zeros to write) are handled here, so backends
 * only see work; messages name the public op ("ts_k_add: out is NULL").
 * The checks themselves are kernels_front.h's, shared with
 * kernels_encoder.c (the BERT-class encoder ops' front).
 */
#include "kernels/kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "base/rng.h"
#include "kernels/cpu/dnnl_matmul.h"
#include "kernels/cpu/gemm_half.h"
#include "kernels/kernels_front.h"

/* The front's public ops (kernels.h, written out with their documentation)
 * take exactly the parameters of kernels/ops.h's list: checked here, at
 * compile time, one assertion per op. */
#define TS_K_FRONT_CHECK(name, params)                                               \
  _Static_assert(__builtin_types_compatible_p(__typeof__(&ts_k_##name), ts_status(*) params), \
                 "kernels.h's ts_k_" #name " differs from kernels/ops.h");
TS_K_OPS(TS_K_FRONT_CHECK)
#undef TS_K_FRONT_CHECK

/* ---- devices, contexts, memory ------------------------------------------------ */

int ts_k_device_count(ts_device dev) {
  const ts_k_backend *be;
  if (backend_for(dev, "ts_k_device_count", &be) != TS_OK) return 0;
  return be->device_count();
}

ts_status ts_k_context_init(ts_kctx *ctx, ts_device dev, int index) {
  static const char op[] = "ts_k_context_init";
  const ts_k_backend *be;
  CHECK_PTR(ctx);
  TS_CHECK(backend_for(dev, op, &be));
  int n = be->device_count();
  if (index < 0 || index >= n)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: %s device %d: this process sees %d", op,
                        be->name, index, n);
  *ctx = (ts_kctx){.device = dev, .device_index = index};
  return be->context_init(ctx, index);
}

const char *ts_k_matmul_impl(ts_device dev, ts_dtype dt) {
  static char names[3][96];
  if (dev == TS_DEVICE_CUDA) return "cublasLt";
  const char *impl = ts_cpu_dnnl_impl(dt);
  if (!impl && dt != TS_FP32 && ts_cpu_linear_half_packed(dt)) return ts_cpu_gemm_half_name();
  if (!impl) return dt == TS_FP32 ? "openblas sgemm" : "openblas sgemm on fp32 copies";
  char *n = names[dt == TS_FP32 ? 0 : dt == TS_BF16 ? 1 : 2];
  snprintf(n, sizeof names[0], "onednn %s", impl); /* the same text every call */
  return n;
}

ts_status ts_k_context_fork(ts_kctx *out, const ts_kctx *parent) {
  static const char op[] = "ts_k_context_fork";
  CHECK_PTR(out);
  CHECK_PTR(parent);
  unsigned flags = parent->flags;
  if (flags & TS_K_PLAN) { /* a plan context has no stream to fork */
    *out =
        (ts_kctx){.device = parent->device, .device_index = parent->device_index, .flags = flags};
    return TS_OK;
  }
  TS_CHECK(ts_k_context_init(out, parent->device, parent->device_index));
  out->flags = flags;
  return TS_OK;
}

void ts_k_context_destroy(ts_kctx *ctx) {
  const ts_k_backend *be;
  if (ctx && !(ctx->flags & TS_K_PLAN) &&
      backend_for(ctx->device, "ts_k_context_destroy", &be) == TS_OK)
    be->context_destroy(ctx);
}

ts_status ts_k_device_memory(ts_device dev, int index, size_t *free_bytes, size_t *total_bytes,
                             char *name, size_t name_len) {
  static const char op[] = "ts_k_device_memory";
  const ts_k_backend *be;
  CHECK_PTR(free_bytes);
  CHECK_PTR(total_bytes);
  TS_CHECK(backend_for(dev, op, &be));
  if (!be->memory_info)
    return ts_set_error(TS_ERR_UNSUPPORTED, "%s: the %s backend reports no memory figures", op,
                        be->name);
  int n = be->device_count();
  if (index < 0 || index >= n)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: %s device %d: this process sees %d", op,
                        be->name, index, n);
  return be->memory_info(index, free_bytes, total_bytes, name, name_len);
}

ts_status ts_k_synchronize(const ts_kctx *ctx) {
  static const char op[] = "ts_k_synchronize";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  return ctx->flags & TS_K_PLAN ? TS_OK : be->synchronize(ctx);
}

ts_status ts_k_alloc(ts_device dev, size_t nbytes, void **out) {
  static const char op[] = "ts_k_alloc";
  const ts_k_backend *be;
  CHECK_PTR(out);
  *out = NULL;
  TS_CHECK(backend_for(dev, op, &be));
  return nbytes == 0 ? TS_OK : be->alloc(nbytes, out);
}

void ts_k_free(ts_device dev, void *p) {
  const ts_k_backend *be;
  if (p && backend_for(dev, "ts_k_free", &be) == TS_OK) be->free(p);
}

/* ---- copies ------------------------------------------------------------------------ */

static const k_op OP_COPY = {"ts_k_copy", 0, 2, {"dst", "src"}};
static const k_op OP_TO_HOST = {"ts_k_to_host", 0, 2, {"h_dst", "src"}};
static const k_op OP_FROM_HOST = {"ts_k_from_host", 0, 2, {"dst", "h_src"}};
static const k_op OP_FROM_HOST_ASYNC = {"ts_k_from_host_async", 0, 2, {"dst", "h_src"}};
static const k_op OP_HOST_COPY = {"ts_k_host_copy", 0, 2, {"h_dst", "h_src"}};

ts_status ts_k_copy(const ts_kctx *ctx, void *dst, const void *src, size_t nbytes) {
  int overlap = (const char *)dst < (const char *)src + nbytes &&
                (const char *)src < (char *)dst + nbytes && dst != src;
  k_call c = {ctx, .empty = nbytes == 0 || (dst == src && dst), .ptrs = {dst, src},
              .conflict = overlap ? ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: dst and src overlap",
                                                 OP_COPY.name)
                                  : TS_OK};
  K_RUN(OP_COPY, c, copy, ctx, dst, src, nbytes);
}

ts_status ts_k_to_host(const ts_kctx *ctx, void *h_dst, const void *src, size_t nbytes) {
  k_call c = {ctx, .empty = nbytes == 0, .ptrs = {h_dst, src}};
  K_RUN(OP_TO_HOST, c, to_host, ctx, h_dst, src, nbytes);
}

ts_status ts_k_from_host(const ts_kctx *ctx, void *dst, const void *h_src, size_t nbytes) {
  k_call c = {ctx, .empty = nbytes == 0, .ptrs = {dst, h_src}};
  K_RUN(OP_FROM_HOST, c, from_host, ctx, dst, h_src, nbytes);
}

ts_status ts_k_host_copy(const ts_kctx *ctx, void *h_dst, const void *h_src, size_t nbytes) {
  k_call c = {ctx, .empty = nbytes == 0, .ptrs = {h_dst, h_src}};
  const ts_k_backend *be;
  int run;
  TS_CHECK(k_check(&OP_HOST_COPY, &c, &be, &run));
  if (run) memmove(h_dst, h_src, nbytes);
  return TS_OK;
}

/* ts_k_check_host_blocks' registry: the ranges registered while it is on
 * (a growing table; every rank's of a process that runs ranks as threads). */
typedef struct host_block {
  const char *lo, *hi;
} host_block;
static int host_blocks_on; /* read and written atomically */
static host_block *host_blocks;
static int n_host_blocks, cap_host_blocks;
static pthread_mutex_t host_blocks_mu = PTHREAD_MUTEX_INITIALIZER;

int ts_k_host_blocks_checked(void) { return __atomic_load_n(&host_blocks_on, __ATOMIC_ACQUIRE); }

void ts_k_check_host_blocks(int on) {
  pthread_mutex_lock(&host_blocks_mu);
  __atomic_store_n(&host_blocks_on, on, __ATOMIC_RELEASE);
  if (!on) {
    free(host_blocks);
    host_blocks = NULL;
    n_host_blocks = cap_host_blocks = 0;
  }
  pthread_mutex_unlock(&host_blocks_mu);
}

int ts_k_in_host_block(const void *p) {
  const char *q = p;
  int in = 0;
  pthread_mutex_lock(&host_blocks_mu);
  for (int i = 0; i < n_host_blocks && !in; i++) in = q >= host_blocks[i].lo && q < host_blocks[i].hi;
  pthread_mutex_unlock(&host_blocks_mu);
  return in;
}

static const k_op OP_HOST_REGISTER = {"ts_k_host_register", 0, 1, {"h_block"}};

ts_status ts_k_host_register(const ts_kctx *ctx, void *h, size_t nbytes) {
  k_call c = {ctx, .empty = nbytes == 0, .ptrs = {h}};
  const ts_k_backend *be;
  int run;
  TS_CHECK(k_check(&OP_HOST_REGISTER, &c, &be, &run));
  if (run && ts_k_host_blocks_checked()) {
    pthread_mutex_lock(&host_blocks_mu);
    int ok = 1;
    if (n_host_blocks == cap_host_blocks) {
      int cap = cap_host_blocks ? 2 * cap_host_blocks : 64;
      host_block *t = realloc(host_blocks, (size_t)cap * sizeof *t);
      if (t) {
        host_blocks = t;
        cap_host_blocks = cap;
      } else {
        ok = 0;
      }
    }
    if (ok) host_blocks[n_host_blocks++] = (host_block){h, (const char *)h + nbytes};
    pthread_mutex_unlock(&host_blocks_mu);
    if (!ok)
      return ts_set_error(TS_ERR_OUT_OF_MEMORY, "ts_k_host_register: a table of %d checked blocks",
                          n_host_blocks + 1);
  }
  return run && be->host_register ? be->host_register(h, nbytes) : TS_OK;
}

void ts_k_host_unregister(const ts_kctx *ctx, void *h) {
  const ts_k_backend *be;
  if (!h || !ctx || (ctx->flags & TS_K_PLAN)) return;
  pthread_mutex_lock(&host_blocks_mu);
  for (int i = 0; i < n_host_blocks; i++)
    if (host_blocks[i].lo == h) {
      host_blocks[i] = host_blocks[--n_host_blocks];
      break;
    }
  pthread_mutex_unlock(&host_blocks_mu);
  if (backend_for(ctx->device, "ts_k_host_unregister", &be) == TS_OK && be->host_unregister)
    be->host_unregister(h);
}

ts_status ts_k_from_host_async(const ts_kctx *ctx, void *dst, const void *h_src, size_t nbytes) {
  k_call c = {ctx, .empty = nbytes == 0, .ptrs = {dst, h_src}};
  const ts_k_backend *be;
  int run;
  TS_CHECK(k_check(&OP_FROM_HOST_ASYNC, &c, &be, &run));
  if (!run) return TS_OK;
  return be->from_host_async ? be->from_host_async(ctx, dst, h_src, nbytes)
                             : be->from_host(ctx, dst, h_src, nbytes);
}

ts_status ts_k_host_wait(const ts_kctx *ctx) {
  static const char op[] = "ts_k_host_wait";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  if (ctx->flags & TS_K_PLAN) return TS_OK;
  return be->host_wait ? be->host_wait(ctx) : TS_OK;
}

/* ---- initialisation -------------------------------------------------------------- */

static const k_op OP_INIT_FILL = {"ts_k_init_fill", 0, 1, {"out"}};
static const k_op OP_INIT_NORMAL = {"ts_k_init_normal", 0, 2, {"out", "h_state"}};

/* Values made on the host, a piece at a time (4 KiB of stack). */
enum { INIT_PIECE = 1024 };

ts_status ts_k_init_fill(const ts_kctx *ctx, float *out, size_t n, float value) {
  k_call c = {ctx, .empty = n == 0, .ptrs = {out}};
  const ts_k_backend *be;
  int run;
  TS_CHECK(k_check(&OP_INIT_FILL, &c, &be, &run));
  float piece[INIT_PIECE];
  for (size_t k = 0; k < INIT_PIECE; k++) piece[k] = value;
  for (size_t j = 0; run && j < n; j += INIT_PIECE) {
    size_t m = n - j < INIT_PIECE ? n - j : INIT_PIECE;
    TS_CHECK(be->from_host(ctx, out + j, piece, m * sizeof(float)));
  }
  return TS_OK;
}

ts_status ts_k_init_normal(const ts_kctx *ctx, float *out, size_t n, double std, uint64_t *state) {
  k_call c = {ctx, .empty = n == 0, .ptrs = {out, state}};
  const ts_k_backend *be;
  int run;
  TS_CHECK(k_check(&OP_INIT_NORMAL, &c, &be, &run));
  float piece[INIT_PIECE];
  for (size_t j = 0; run && j < n; j += INIT_PIECE) {
    size_t m = n - j < INIT_PIECE ? n - j : INIT_PIECE;
    for (size_t k = 0; k < m; k++) {
      double u1 = ((double)(ts_splitmix64(state) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
      double u2 = ((double)(ts_splitmix64(state) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
      piece[k] = (float)(std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
    }
    TS_CHECK(be->from_host(ctx, out + j, piece, m * sizeof(float)));
  }
  return TS_OK;
}

/* ---- the host's side of a batch --------------------------------------------------- */

static const k_op OP_COUNT_TARGETS = {"ts_k_count_targets", 0, 2, {"h_count", "h_targets"}};
static const k_op OP_CHECK_INDICES = {"ts_k_check_indices", 0, 2, {"h_tokens", "h_targets"}};

ts_status ts_k_count_targets(const ts_kctx *ctx, size_t *count, const int32_t *h_targets,
                             size_t n) {
  k_call c = {ctx, .ptrs = {count, n ? (const void *)h_targets : K_UNUSED}};
  const ts_k_backend *be;
  int run;
  TS_CHECK(k_check(&OP_COUNT_TARGETS, &c, &be, &run));
  *count = 0;
  for (size_t i = 0; run && i < n; i++) *count += h_targets[i] != TS_IGNORE_INDEX;
  return TS_OK;
}

ts_status ts_k_check_indices(const ts_kctx *ctx, const int32_t *h_tokens, const int32_t *h_targets,
                             size_t n, size_t V) {
  k_call c = {ctx, .empty = n == 0, .ptrs = {h_tokens, h_targets}};
  const ts_k_backend *be;
  int run;
  TS_CHECK(k_check(&OP_CHECK_INDICES, &c, &be, &run));
  for (size_t i = 0; run && i < n; i++) {
    if (h_tokens[i] < 0 || (size_t)h_tokens[i] >= V)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "%s: tokens[%zu] = %d is outside the vocabulary [0, %zu)",
                          OP_CHECK_INDICES.name, i, (int)h_tokens[i], V);
    if (h_targets[i] != TS_IGNORE_INDEX && (h_targets[i] < 0 || (size_t)h_targets[i] >= V))
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "%s: targets[%zu] = %d: expected a class in [0, %zu) or %d (ignore)",
                          OP_CHECK_INDICES.name, i, (int)h_targets[i], V, TS_IGNORE_INDEX);
  }
  return TS_OK;
}

/* ---- workspace queries ----------------------------------------------------------- */

size_t ts_k_linear_workspace_bytes(ts_device dev, size_t M, size_t N, size_t K, ts_dtype dt) {
  const ts_k_backend *be = query_backend(dev);
  return be->linear_workspace_bytes ? be->linear_workspace_bytes(M, N, K, dt) : 0;
}

size_t ts_k_linear_bias_workspace_bytes(ts_device dev, size_t M, size_t N, size_t K,
                                        ts_dtype dt) {
  const ts_k_backend *be = query_backend(dev);
  return be->linear_bias_workspace_bytes ? be->linear_bias_workspace_bytes(M, N, K, dt) : 0;
}

size_t ts_k_rmsnorm_workspace_bytes(ts_device dev, size_t N, size_t C, ts_dtype dt) {
  const ts_k_backend *be = query_backend(dev);
  return be->rmsnorm_workspace_bytes ? be->rmsnorm_workspace_bytes(N, C, dt) : 0;
}

size_t ts_k_embedding_workspace_bytes(ts_device dev, size_t N, ts_dtype dt) {
  const ts_k_backend *be = query_backend(dev);
  return be->embedding_workspace_bytes ? be->embedding_workspace_bytes(N, dt) : 0;
}

size_t ts_k_attention_workspace_bytes(ts_device dev, size_t B, size_t T, size_t NH, size_t NKV,
                                      size_t HS, ts_dtype dt) {
  const ts_k_backend *be = query_backend(dev);
  return be->attention_workspace_bytes ? be->attention_workspace_bytes(B, T, NH, NKV, HS, dt) : 0;
}

/* ---- casts and vector ops ---------------------------------------------------------- */

static const k_op OP_CAST = {"ts_k_cast", 2, 2, {"out", "in"}};
static const k_op OP_ZERO = {"ts_k_zero", 0, 1, {"x"}};
static const k_op OP_ADD = {"ts_k_add", 1, 3, {"out", "a", "b"}};
static const k_op OP_SUMSQ = {"ts_k_sumsq", 1, 2, {"out", "x"}};
static const k_op OP_NONFINITE = {"ts_k_nonfinite", 1, 2, {"flag", "x"}};

ts_status ts_k_cast(const ts_kctx *ctx, void *out, ts_dtype out_dt, const void *in, ts_dtype in_dt,
                    size_t n) {
  int resize = out == in && n > 0 && out && ts_dtype_size(out_dt) != ts_dtype_size(in_dt);
  k_call c = {
      ctx,
      {out_dt, in_dt},
      .empty = n == 0,
      .ptrs = {out, in},
      .conflict = resize ? ts_set_error(TS_ERR_INVALID_ARGUMENT,
                                        "%s: in == out needs dtypes of equal size, got %s "
                                        "-> %s",
                                        OP_CAST.name, ts_dtype_name(in_dt), ts_dtype_name(out_dt))
                         : TS_OK};
  K_RUN(OP_CAST, c, cast, ctx, out, out_dt, in, in_dt, n);
}

ts_status ts_k_zero(const ts_kctx *ctx, void *x, size_t nbytes) {
  k_call c = {ctx, .empty = nbytes == 0, .ptrs = {x}};
  K_RUN(OP_ZERO, c, zero, ctx, x, nbytes);
}

ts_status ts_k_add(const ts_kctx *ctx, void *out, const void *a, const void *b, size_t n,
                   ts_dtype dt) {
  k_call c = {ctx, {dt}, .empty = n == 0, .ptrs = {out, a, b}};
  K_RUN(OP_ADD, c, add, ctx, out, a, b, n, dt);
}

/* sumsq and nonfinite receive n == 0 (they write 0). */
ts_status ts_k_sumsq(const ts_kctx *ctx, double *out, const void *x, size_t n, ts_dtype dt) {
  k_call c = {ctx, {dt}, .ptrs = {out, n ? x : K_UNUSED}};
  K_RUN(OP_SUMSQ, c, sumsq, ctx, out, x, n, dt);
}

ts_status ts_k_nonfinite(const ts_kctx *ctx, int32_t *flag, const void *x, size_t n, ts_dtype dt) {
  k_call c = {ctx, {dt}, .ptrs = {flag, n ? x : K_UNUSED}};
  K_RUN(OP_NONFINITE, c, nonfinite, ctx, flag, x, n, dt);
}

static const k_op OP_SUM_RANKS = {"ts_k_sum_ranks", 1, 2, {"out", "h_parts"}};

ts_status ts_k_sum_ranks(const ts_kctx *ctx, void *out, const void *const *parts, int n,
                         size_t count, ts_dtype dt, int accumulate) {
  ts_status invalid = TS_OK, conflict = TS_OK;
  if (n < 1 || n > TS_K_SUM_RANKS_MAX)
    invalid = ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: n = %d parts: expected 1 .. %d",
                           OP_SUM_RANKS.name, n, TS_K_SUM_RANKS_MAX);
  for (int i = 0; invalid == TS_OK && count > 0 && parts && i < n && conflict == TS_OK; i++)
    if (!parts[i])
      conflict =
          ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: parts[%d] is NULL", OP_SUM_RANKS.name, i);
  k_call c = {ctx,
              {dt},
              .invalid = invalid,
              .empty = count == 0,
              .ptrs = {out, (const void *)parts},
              .conflict = conflict};
  K_RUN(OP_SUM_RANKS, c, sum_ranks, ctx, out, parts, n, count, dt, accumulate);
}

/* ---- linear ------------------------------------------------------------------------ */

static const k_op OP_LINEAR_FORWARD = {"ts_k_linear_forward", 1, 3, {"out", "inp", "weight"}};
static const k_op OP_LINEAR_BIAS_FORWARD = {
    "ts_k_linear_bias_forward", 1, 4, {"out", "inp", "weight", "bias"}};
static const k_op OP_LINEAR_BACKWARD = {
    "ts_k_linear_backward", 1, 3, {"dout", "weight", "inp"}, 2, {"dinp", "dweight"}};

/* A forward product with K == 0, once call c of op passes its checks:
 * empty sums, out (M, N) = 0 [+ bias (N) on every row]; inp and weight
 * are not read. */
static ts_status empty_sums(const k_op *op, const k_call *c, void *out, const void *bias,
                            size_t M, size_t N, ts_dtype dt) {
  const ts_k_backend *be;
  int run;
  TS_CHECK(k_check(op, c, &be, &run));
  TS_CHECK(ts_k_zero(c->ctx, out, M * N * ts_dtype_size(dt)));
  return bias ? ts_k_bias_add(c->ctx, out, bias, M, N, dt) : TS_OK;
}

ts_status ts_k_linear_forward(const ts_kctx *ctx, void *out, const void *inp, const void *weight,
                              size_t M, size_t N, size_t K, ts_dtype dt) {
  k_call c = {
      ctx,
      {dt},
      .empty = M == 0 || N == 0,
      .ptrs = {out, K ? inp : K_UNUSED, K ? weight : K_UNUSED},
      .workspace = K ? K_WORKSPACE(ctx, ts_k_linear_workspace_bytes(ctx->device, M, N, K, dt)) : 0};
  if (K == 0 && c.ctx && !c.empty && out)
    return empty_sums(&OP_LINEAR_FORWARD, &c, out, NULL, M, N, dt);
  K_RUN(OP_LINEAR_FORWARD, c, linear_forward, ctx, out, inp, weight, M, N, K, dt);
}

ts_status ts_k_linear_bias_forward(const ts_kctx *ctx, void *out, const void *inp,
                                   const void *weight, const void *bias, size_t M, size_t N,
                                   size_t K, ts_dtype dt) {
  const char *op = OP_LINEAR_BIAS_FORWARD.name;
  ts_status alias = k_no_alias(out, bias, "out", "bias", op);
  if (alias == TS_OK && K) alias = k_no_alias(out, inp, "out", "inp", op);
  if (alias == TS_OK && K) alias = k_no_alias(out, weight, "out", "weight", op);
  size_t ws = K ? K_WORKSPACE(ctx, ts_k_linear_bias_workspace_bytes(ctx->device, M, N, K, dt)) : 0;
  k_call c = {ctx,
              {dt},
              .empty = M == 0 || N == 0,
              .ptrs = {out, K ? inp : K_UNUSED, K ? weight : K_UNUSED, bias},
              .conflict = alias,
              .workspace = ws};
  if (K == 0 && c.ctx && !c.empty && out)
    return empty_sums(&OP_LINEAR_BIAS_FORWARD, &c, out, bias, M, N, dt);
  K_RUN(OP_LINEAR_BIAS_FORWARD, c, linear_bias_forward, ctx, out, inp, weight, bias, M, N, K, dt);
}

ts_status ts_k_linear_backward(const ts_kctx *ctx, void *dinp, void *dweight, const void *dout,
                               const void *inp, const void *weight, size_t M, size_t N, size_t K,
                               ts_dtype dt) {
  /* M or K zero: dinp and dweight are empty; N zero: dinp = 0 (dweight
   * empty); neither output asked for: nothing to do */
  if (ctx && ctx->wgrad && dweight && M && N && K) { /* W: deferred (ts_k_wgrad) */
    TS_CHECK(ts_k_wgrad_record(ctx, 0, dt, dweight, NULL, dout, inp, NULL, NULL, M, N, K));
    dweight = NULL;
  }
  int zero_dinp = M > 0 && K > 0 && N == 0 && dinp;
  k_call c = {ctx,
              {dt},
              .empty = M == 0 || K == 0 || N == 0 || (!dinp && !dweight),
              .ptrs = {dout, dinp ? weight : K_UNUSED, dweight ? inp : K_UNUSED},
              .outs = {dinp, dweight},
              .workspace = K_WORKSPACE(ctx, ts_k_linear_workspace_bytes(ctx->device, M, N, K, dt))};
  if (zero_dinp) {
    const ts_k_backend *be;
    int run;
    TS_CHECK(k_check(&OP_LINEAR_BACKWARD, &c, &be, &run));
    return ts_k_zero(ctx, dinp, M * K * ts_dtype_size(dt));
  }
  K_RUN(OP_LINEAR_BACKWARD, c, linear_backward, ctx, dinp, dweight, dout, inp, weight, M, N, K, dt);
}

/* ---- embedding ------------------------------------------------------------------------ */

static const k_op OP_EMBEDDING_FORWARD = {"ts_k_embedding_forward", 1, 3, {"tokens", "out", "wte"}};
static const k_op OP_EMBEDDING_BACKWARD = {
    "ts_k_embedding_backward", 1, 3, {"tokens", "dwte", "dout"}};

/* Both receive C == 0 (the tokens are still checked). */
ts_status ts_k_embedding_forward(const ts_kctx *ctx, void *out, const int32_t *tokens,
                                 const void *wte, size_t N, size_t C, size_t V, ts_dtype dt) {
  k_call c = {ctx, {dt}, .empty = N == 0, .ptrs = {tokens, C ? out : K_UNUSED, C ? wte : K_UNUSED}};
  K_RUN(OP_EMBEDDING_FORWARD, c, embedding_forward, ctx, out, tokens, wte, N, C, V, dt);
}

ts_status ts_k_embedding_backward(const ts_kctx *ctx, void *dwte, const void *dout,
                                  const int32_t *tokens, size_t N, size_t C, size_t V,
                                  ts_dtype dt) {
  if (ctx && ctx->wgrad && dwte && N && C) /* W: deferred (ts_k_wgrad) */
    return ts_k_wgrad_record(ctx, 4, dt, dwte, NULL, dout, tokens, NULL, NULL, N, C, V);
  k_call c = {ctx,
              {dt},
              .empty = N == 0,
              .ptrs = {tokens, C ? dwte : K_UNUSED, C ? dout : K_UNUSED},
              .workspace = K_WORKSPACE(ctx, ts_k_embedding_workspace_bytes(ctx->device, N, dt))};
  K_RUN(OP_EMBEDDING_BACKWARD, c, embedding_backward, ctx, dwte, dout, tokens, N, C, V, dt);
}

/* ---- RMSNorm ------------------------------------------------------------------------------ */

static const k_op OP_RMSNORM_FORWARD = {
    "ts_k_rmsnorm_forward", 1, 4, {"out", "rstd", "inp", "weight"}};
static const k_op OP_RMSNORM_BACKWARD = {
    "ts_k_rmsnorm_backward", 1, 4, {"dout", "inp", "rstd", "weight"}, 2, {"dinp", "dweight"}};
static const k_op OP_ADD_RMSNORM_FORWARD = {
    "ts_k_add_rmsnorm_forward", 1, 6, {"out", "rstd", "res", "a", "b", "weight"}};

ts_status ts_k_rmsnorm_forward(const ts_kctx *ctx, void *out, float *rstd, const void *inp,
                               const void *weight, size_t N, size_t C, float eps, ts_dtype dt) {
  k_call c = {ctx,
              {dt},
              .empty = N == 0,
              .invalid = N ? k_norm_channels(C, OP_RMSNORM_FORWARD.name) : TS_OK,
              .ptrs = {out, rstd, inp, weight},
              .conflict = k_no_alias(out, inp, "out", "inp", OP_RMSNORM_FORWARD.name)};
  K_RUN(OP_RMSNORM_FORWARD, c, rmsnorm_forward, ctx, out, rstd, inp, weight, N, C, eps, dt);
}

ts_status ts_k_add_rmsnorm_forward(const ts_kctx *ctx, void *out, float *rstd, void *res,
                                   const void *a, const void *b, const void *weight, size_t N,
                                   size_t C, float eps, ts_dtype dt) {
  const char *op = OP_ADD_RMSNORM_FORWARD.name;
  k_call c = {ctx,
              {dt},
              .empty = N == 0,
              .invalid = N ? k_norm_channels(C, op) : TS_OK,
              .ptrs = {out, rstd, res, a, b, weight},
              .conflict = k_add_norm_alias(out, res, a, b, op)};
  K_RUN(OP_ADD_RMSNORM_FORWARD, c, add_rmsnorm_forward, ctx, out, rstd, res, a, b, weight, N, C,
        eps, dt);
}

ts_status ts_k_rmsnorm_backward(const ts_kctx *ctx, void *dinp, void *dweight, const void *dout,
                                const void *inp, const void *weight, const float *rstd, size_t N,
                                size_t C, ts_dtype dt) {
  if (ctx && ctx->wgrad && dweight && N && C) { /* W: deferred (ts_k_wgrad) */
    TS_CHECK(ts_k_wgrad_record(ctx, 1, dt, dweight, NULL, dout, inp, rstd, NULL, N, C, 0));
    dweight = NULL;
  }
  k_call c = {ctx,
              {dt},
              .empty = N == 0 || C == 0,
              .ptrs = {dout, inp, rstd, dinp ? weight : K_UNUSED},
              .outs = {dinp, dweight},
              .workspace = K_WORKSPACE(ctx, ts_k_rmsnorm_workspace_bytes(ctx->device, N, C, dt))};
  K_RUN(OP_RMSNORM_BACKWARD, c, rmsnorm_backward, ctx, dinp, dweight, dout, inp, weight, rstd, N, C,
        dt);
}

/* ---- RoPE --------------------------------------------------------------------------------- */

static const k_op OP_ROPE_FORWARD = {"ts_k_rope_forward", 1, 2, {"out", "x"}};
static const k_op OP_ROPE_BACKWARD = {"ts_k_rope_backward", 1, 2, {"dx", "dout"}};

/* The scalar rule both RoPE directions share. */
static ts_status rope_rule(size_t HS, float theta, const char *op) {
  if (HS % 2 != 0 || HS > TS_K_ROPE_MAX_HS)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: HS = %zu: expected even and <= %d", op, HS,
                        TS_K_ROPE_MAX_HS);
  if (!(theta > 0.0f))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: theta = %g: expected > 0", op, (double)theta);
  return TS_OK;
}

ts_status ts_k_rope_forward(const ts_kctx *ctx, void *out, const void *x, size_t B, size_t T,
                            size_t H, size_t HS, float theta, ts_dtype dt) {
  k_call c = {ctx,
              {dt},
              .invalid = rope_rule(HS, theta, OP_ROPE_FORWARD.name),
              .empty = B == 0 || T == 0 || H == 0 || HS == 0,
              .ptrs = {out, x}};
  K_RUN(OP_ROPE_FORWARD, c, rope_forward, ctx, out, x, B, T, H, HS, theta, dt);
}

ts_status ts_k_rope_backward(const ts_kctx *ctx, void *dx, const void *dout, size_t B, size_t T,
                             size_t H, size_t HS, float theta, ts_dtype dt) {
  k_call c = {ctx,
              {dt},
              .invalid = rope_rule(HS, theta, OP_ROPE_BACKWARD.name),
              .empty = B == 0 || T == 0 || H == 0 || HS == 0,
              .ptrs = {dx, dout}};
  K_RUN(OP_ROPE_BACKWARD, c, rope_backward, ctx, dx, dout, B, T, H, HS, theta, dt);
}

/* ---- attention ---------------------------------------------------------------------------- */

size_t ts_k_attention_state_bytes(ts_device dev, size_t B, size_t T, size_t NH, size_t NKV,
                                  size_t HS, ts_dtype dt) {
  const ts_k_backend *be = query_backend(dev);
  if (be->attention_state_bytes) return be->attention_state_bytes(B, T, NH, NKV, HS, dt);
  return B * NH * T * T * ts_dtype_size(dt);
}

ts_status ts_k_attention_probs_dtype(const ts_kctx *ctx, ts_dtype dt, int bidirectional,
                                     ts_dtype *out) {
  static const char op[] = "ts_k_attention_probs_dtype";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  CHECK_PTR(out);
  *out = be->attention_probs_dtype ? be->attention_probs_dtype(ctx, dt, bidirectional) : TS_FP32;
  return TS_OK;
}

static const k_op OP_ATTENTION_FORWARD = {"ts_k_attention_forward", 1, K_ATTENTION_FORWARD_PTRS};
static const k_op OP_ATTENTION_BACKWARD = {"ts_k_attention_backward", 1, K_ATTENTION_BACKWARD_PTRS};

ts_status ts_k_attention_forward(const ts_kctx *ctx, void *out, void *state, const void *q,
                                 const void *k, const void *v, size_t B, size_t T, size_t NH,
                                 size_t NKV, size_t HS, ts_dtype dt) {
  const char *op = OP_ATTENTION_FORWARD.name;
  int empty = B == 0 || T == 0 || NH == 0;
  k_call c = {ctx,
              {dt},
              .invalid = k_attention_heads(NH, NKV, op),
              .empty = empty,
              .ptrs = {out, state, q, k, v},
              .conflict = empty ? TS_OK : k_attention_hs(HS, op),
              .workspace = K_WORKSPACE(
                  ctx, ts_k_attention_workspace_bytes(ctx->device, B, T, NH, NKV, HS, dt))};
  K_RUN(OP_ATTENTION_FORWARD, c, attention_forward, ctx, out, state, q, k, v, B, T, NH, NKV, HS,
        dt);
}

ts_status ts_k_attention_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                  const void *dout, const void *out, const void *q, const void *k,
                                  const void *v, const void *state, size_t B, size_t T, size_t NH,
                                  size_t NKV, size_t HS, ts_dtype dt) {
  const char *op = OP_ATTENTION_BACKWARD.name;
  int empty = B == 0 || T == 0 || NH == 0;
  k_call c = {ctx,
              {dt},
              .invalid = k_attention_heads(NH, NKV, op),
              .empty = empty,
              .ptrs = {dq, dk, dv, dout, out, q, k, v, state},
              .conflict = empty ? TS_OK : k_attention_hs(HS, op),
              .workspace = K_WORKSPACE(
                  ctx, ts_k_attention_workspace_bytes(ctx->device, B, T, NH, NKV, HS, dt))};
  K_RUN(OP_ATTENTION_BACKWARD, c, attention_backward, ctx, dq, dk, dv, dout, out, q, k, v, state, B,
        T, NH, NKV, HS, dt);
}

/* ---- decoding with a key/value cache --------------------------------------------------- */

static const k_op OP_ROPE_AT = {"ts_k_rope_forward_at", 1, 2, {"out", "x"}};
static const k_op OP_ATTENTION_CACHED = {"ts_k_attention_cached", 1, 4, {"out", "q", "k", "v"}};

ts_status ts_k_rope_forward_at(const ts_kctx *ctx, void *out, const void *x, size_t T,
                               size_t pos0, size_t H, size_t HS, float theta, ts_dtype dt) {
  k_call c = {ctx,
              {dt},
              .invalid = rope_rule(HS, theta, OP_ROPE_AT.name),
              .empty = T == 0 || H == 0 || HS == 0,
              .ptrs = {out, x}};
  K_RUN(OP_ROPE_AT, c, rope_forward_at, ctx, out, x, T, pos0, H, HS, theta, dt);
}

ts_status ts_k_attention_cached(const ts_kctx *ctx, void *out, const void *q, const void *k,
                                const void *v, size_t T, size_t pos0, size_t NH, size_t NKV,
                                size_t HS, ts_dtype dt) {
  const char *op = OP_ATTENTION_CACHED.name;
  int empty = T == 0 || NH == 0;
  ts_status conflict = empty ? TS_OK : k_attention_hs(HS, op);
  if (conflict == TS_OK) conflict = k_no_alias(out, q, "out", "q", op);
  k_call c = {ctx,
              {dt},
              .invalid = k_attention_heads(NH, NKV, op),
              .empty = empty,
              .ptrs = {out, q, k, v},
              .conflict = conflict};
  K_RUN(OP_ATTENTION_CACHED, c, attention_cached, ctx, out, q, k, v, T, pos0, NH, NKV, HS, dt);
}

/* ---- SwiGLU --------------------------------------------------------------------------------- */

static const k_op OP_SWIGLU_FORWARD = {"ts_k_swiglu_forward", 1, 3, {"h", "gate", "up"}};
static const k_op OP_SWIGLU_BACKWARD = {
    "ts_k_swiglu_backward", 1, 5, {"dgate", "dup", "dh", "gate", "up"}};

ts_status ts_k_swiglu_forward(const ts_kctx *ctx, void *h, const void *gate, const void *up,
                              size_t n, ts_dtype dt) {
  int alias = h && (h == gate || h == up);
  k_call c = {ctx,
              {dt},
              .empty = n == 0,
              .ptrs = {h, gate, up},
              .conflict = alias ? ts_set_error(TS_ERR_INVALID_ARGUMENT,
                                               "%s: h aliases gate or up (not allowed)",
                                               OP_SWIGLU_FORWARD.name)
                                : TS_OK};
  K_RUN(OP_SWIGLU_FORWARD, c, swiglu_forward, ctx, h, gate, up, n, dt);
}

ts_status ts_k_swiglu_backward(const ts_kctx *ctx, void *dgate, void *dup, const void *dh,
                               const void *gate, const void *up, size_t n, ts_dtype dt) {
  k_call c = {ctx, {dt}, .empty = n == 0, .ptrs = {dgate, dup, dh, gate, up}};
  K_RUN(OP_SWIGLU_BACKWARD, c, swiglu_backward, ctx, dgate, dup, dh, gate, up, n, dt);
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

static const k_op OP_CE_FORWARD = {
    "ts_k_cross_entropy_forward", 1, 3, {"targets", "loss_rows", "logits"}};
static const k_op OP_LOSS_SUM = {"ts_k_loss_sum", 0, 3, {"out", "loss_rows", "targets"}};
static const k_op OP_CE_BACKWARD = {
    "ts_k_cross_entropy_backward", 1, 3, {"targets", "dlogits", "logits"}};
static const k_op OP_CE_FUSED = {
    "ts_k_cross_entropy_fused", 1, 4, {"targets", "loss_rows", "dlogits", "logits"}};

ts_status ts_k_cross_entropy_forward(const ts_kctx *ctx, float *loss_rows, const void *logits,
                                     const int32_t *targets, size_t N, size_t V, ts_dtype dt) {
  k_call c = {ctx, {dt}, .empty = N == 0, .ptrs = {targets, loss_rows, logits}};
  K_RUN(OP_CE_FORWARD, c, cross_entropy_forward, ctx, loss_rows, logits, targets, N, V, dt);
}

/* Receives N == 0 (it writes 0, 0). */
ts_status ts_k_loss_sum(const ts_kctx *ctx, double *out, const float *loss_rows,
                        const int32_t *targets, size_t N) {
  k_call c = {ctx, .ptrs = {out, N ? (const void *)loss_rows : K_UNUSED,
                            N ? (const void *)targets : K_UNUSED}};
  K_RUN(OP_LOSS_SUM, c, loss_sum, ctx, out, loss_rows, targets, N);
}

ts_status ts_k_cross_entropy_backward(const ts_kctx *ctx, void *dlogits, const void *logits,
                                      const int32_t *targets, size_t N, size_t V, float dloss,
                                      ts_dtype dt) {
  k_call c = {ctx, {dt}, .empty = N == 0 || V == 0, .ptrs = {targets, dlogits, logits}};
  K_RUN(OP_CE_BACKWARD, c, cross_entropy_backward, ctx, dlogits, logits, targets, N, V, dloss, dt);
}

ts_status ts_k_cross_entropy_fused(const ts_kctx *ctx, float *loss_rows, void *dlogits,
                                   const void *logits, const int32_t *targets, size_t N, size_t V,
                                   float dloss, ts_dtype dt) {
  k_call c = {ctx, {dt}, .empty = N == 0, .ptrs = {targets, loss_rows, dlogits, logits}};
  K_RUN(OP_CE_FUSED, c, cross_entropy_fused, ctx, loss_rows, dlogits, logits, targets, N, V, dloss,
        dt);
}

/* ---- AdamW ---------------------------------------------------------------------------------- */

static const k_op OP_ADAMW = {"ts_k_adamw", 2, 4, {"master", "m", "v", "grad"}, 1, {"param_out"}};

/* AdamW's scalar rule (hp not NULL, checked first). */
static ts_status adamw_rule(const ts_adamw_hparams *hp, const char *op) {
  if (hp->step < 1)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: hp->step = %d: expected >= 1 (1-based)", op,
                        hp->step);
  if (!(hp->beta1 >= 0.0f && hp->beta1 < 1.0f) || !(hp->beta2 >= 0.0f && hp->beta2 < 1.0f))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: hp->beta1 = %g, hp->beta2 = %g: expected each in [0, 1)", op,
                        (double)hp->beta1, (double)hp->beta2);
  return TS_OK;
}

ts_status ts_k_adamw(const ts_kctx *ctx, float *master, void *param_out, ts_dtype param_dt,
                     float *m, float *v, const void *grad, ts_dtype grad_dt, size_t n,
                     const ts_adamw_hparams *hp) {
  const char *op = OP_ADAMW.name;
  if (!hp) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: hp is NULL", op);
  int resize = param_out == (void *)master && param_dt != TS_FP32;
  k_call c = {ctx,
              {param_dt, grad_dt},
              .invalid = adamw_rule(hp, op),
              .empty = n == 0,
              .ptrs = {master, m, v, grad},
              .outs = {param_out},
              .conflict = resize && master ? ts_set_error(TS_ERR_INVALID_ARGUMENT,
                                                          "%s: param_out aliases master but "
                                                          "param_dt is %s (needs fp32)",
                                                          op, ts_dtype_name(param_dt))
                                           : TS_OK};
  K_RUN(OP_ADAMW, c, adamw, ctx, master, param_out, param_dt, m, v, grad, grad_dt, n, hp);
}
