/*
 * kernels_front.h — private to the kernels front (kernels.c and
 * kernels_encoder.c): the backend table of each device and the argument
 * checks every public ts_k_* op goes through before it calls its backend
 * (kernels/backend.h). One definition of each check, so every op reports
 * the same fault with the same status and message form ("ts_k_add: out is
 * NULL"). Not part of the API: callers include kernels/kernels.h.
 */
#ifndef TS_KERNELS_KERNELS_FRONT_H
#define TS_KERNELS_KERNELS_FRONT_H

#include <string.h>

#include "kernels/backend.h"
#include "kernels/kernels.h"

/* The backends, indexed by ts_device. */
static const ts_k_backend *const BACKENDS[TS_DEVICE_COUNT] = {
    [TS_DEVICE_CPU] = &ts_k_cpu_backend,
    [TS_DEVICE_CUDA] = &ts_k_cuda_backend,
};

/* ---- checks ---------------------------------------------------------------- */

/* *be = the backend of device dev, or TS_ERR_INVALID_ARGUMENT. */
static inline ts_status backend_for(ts_device dev, const char *op, const ts_k_backend **be) {
  *be = &ts_k_cpu_backend; /* never used on error; keeps every path initialised */
  if ((unsigned)dev >= TS_DEVICE_COUNT)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: ctx->device = %d is not a device", op,
                        (int)dev);
  *be = BACKENDS[dev];
  return TS_OK;
}

/* *be = the backend of ctx's device; a NULL ctx is TS_ERR_INVALID_ARGUMENT. */
static inline ts_status backend_of(const ts_kctx *ctx, const char *op, const ts_k_backend **be) {
  *be = &ts_k_cpu_backend; /* never used on error; keeps every path initialised */
  if (ctx == NULL) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", op);
  return backend_for(ctx->device, op, be);
}

/* TS_ERR_UNSUPPORTED: backend be has no body for op. */
static inline ts_status unsupported(const ts_k_backend *be, const char *op) {
  return ts_set_error(TS_ERR_UNSUPPORTED, "%s: op has no %s implementation yet", op,
                      be->device == TS_DEVICE_CUDA ? "CUDA" : be->name);
}

/* TS_ERR_INVALID_ARGUMENT unless dt is fp32, bf16 or fp16. */
static inline ts_status check_dtype(ts_dtype dt, const char *op) {
  if (dt == TS_FP32 || dt == TS_BF16 || dt == TS_FP16) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: dtype %d: expected TS_FP32, TS_BF16 or TS_FP16",
                      op, (int)dt);
}

/* TS_ERR_INVALID_ARGUMENT naming pointer `what` if p is NULL. */
static inline ts_status check_ptr(const void *p, const char *what, const char *op) {
  if (p != NULL) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, what);
}

/* Checks the named pointer arguments of the op calling it. */
#define CHECK_PTR(p) TS_CHECK(check_ptr((p), #p, op))

/* TS_ERR_OUT_OF_MEMORY, naming both sizes, if ctx's workspace holds fewer
 * than `need` bytes (or is NULL while need > 0). */
static inline ts_status check_workspace(const ts_kctx *ctx, size_t need, const char *op) {
  if (need == 0) return TS_OK;
  if (ctx->workspace == NULL || ctx->workspace_bytes < need)
    return ts_set_error(TS_ERR_OUT_OF_MEMORY,
                        "%s: workspace has %zu bytes, needs %zu (see the op's "
                        "*_workspace_bytes query)",
                        op, ctx->workspace == NULL ? (size_t)0 : ctx->workspace_bytes, need);
  return TS_OK;
}

/* The backend of dev for a size query (a programmer error otherwise). */
static inline const ts_k_backend *query_backend(ts_device dev) {
  TS_ASSERT((unsigned)dev < TS_DEVICE_COUNT);
  return BACKENDS[dev];
}

/* ---- the op table and the one check-and-dispatch path --------------------- */

/* A pointer argument this call does not need (an optional output left
 * NULL, an input that an empty dimension never reads): it passes the
 * pointer check. */
static const char k_unused_;
#define K_UNUSED ((const void *)&k_unused_)

enum { K_MAX_DTYPES = 2, K_MAX_PTRS = 10, K_MAX_OUTS = 3 };

/* A row of the front's table: what is checked of every call of one op. */
/* ts_k_check_host_blocks (kernels.c): whether it is on, and whether p lies
 * in a block registered while it was. */
int ts_k_host_blocks_checked(void);
int ts_k_in_host_block(const void *p);

/* ts_k_op_times_enable (kernels.c): a monotonic clock in seconds, and the
 * sum of the time since t0 into the kind of the op named `name` (its
 * public name). */
double ts_k_op_clock(void);
void ts_k_op_time_add(const char *name, double t0);

typedef struct k_op {
  const char *name;             /* the public name, in every message ("ts_k_add") */
  int n_dtypes;                 /* its dtype arguments, each fp32, bf16 or fp16 */
  int n_ptrs;                   /* its pointer arguments checked for NULL, */
  const char *ptrs[K_MAX_PTRS]; /*   by name, in check order */
  int n_outs;                   /* its optional outputs (NULL allowed: not in ptrs), */
  const char *outs[K_MAX_OUTS]; /*   checked against host blocks only */
} k_op;

/* One call of an op, in its row's order. */
typedef struct k_call {
  const ts_kctx *ctx;
  ts_dtype dtypes[K_MAX_DTYPES]; /* the dtype arguments */
  ts_status invalid;             /* the op's own check of its scalar arguments (a shape rule),
                                    made by the caller: TS_OK, or the status it set with its
                                    message; reported after the dtypes */
  int empty;                     /* 1: the sizes leave nothing to do (TS_OK, nothing runs) */
  const void *ptrs[K_MAX_PTRS];  /* the pointer arguments; K_UNUSED where not needed */
  const void *outs[K_MAX_OUTS];  /* the optional outputs, NULL where not asked for */
  ts_status conflict;            /* the op's own check of its pointers (aliasing), made by the
                                    caller like invalid; reported after the pointers */
  size_t workspace;              /* bytes of ctx->workspace the call needs (K_WORKSPACE) */
} k_call;

/* The workspace a call needs, from the op's query on ctx's device; 0 when
 * ctx is not a valid context (k_check reports that first). */
#define K_WORKSPACE(ctx, query) ((ctx) && (unsigned)(ctx)->device < TS_DEVICE_COUNT ? (query) : 0)

/* The one check of every op, in this order: the context and its backend,
 * the dtypes, the op's scalar rule (c->invalid), emptiness, the pointers,
 * the op's pointer rule (c->conflict), the workspace. On TS_OK, *run is 1
 * when the backend must run: the call is not empty and ctx is not a plan
 * (TS_K_PLAN: checked, then nothing runs). A rejected call has written
 * nothing anywhere. */
static inline ts_status k_check(const k_op *op, const k_call *c, const ts_k_backend **be,
                                int *run) {
  *run = 0;
  TS_CHECK(backend_of(c->ctx, op->name, be));
  for (int i = 0; i < op->n_dtypes; i++) TS_CHECK(check_dtype(c->dtypes[i], op->name));
  if (c->invalid != TS_OK) return c->invalid; /* its message is the last error */
  if (c->empty) return TS_OK;
  for (int i = 0; i < op->n_ptrs; i++) TS_CHECK(check_ptr(c->ptrs[i], op->ptrs[i], op->name));
  if (ts_k_host_blocks_checked() && !(c->ctx->flags & TS_K_HOST_SIDE)) {
    /* device arguments (names without h_) in a registered host block */
    const char *bad = NULL;
    for (int i = 0; i < op->n_ptrs && !bad; i++)
      if (strncmp(op->ptrs[i], "h_", 2) && c->ptrs[i] != K_UNUSED && ts_k_in_host_block(c->ptrs[i]))
        bad = op->ptrs[i];
    for (int i = 0; i < op->n_outs && !bad; i++)
      if (c->outs[i] && ts_k_in_host_block(c->outs[i])) bad = op->outs[i];
    if (bad)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "%s: %s is host memory (a ts_k_host_register block): expected memory "
                          "of the context's device",
                          op->name, bad);
  }
  if (c->conflict != TS_OK) return c->conflict;
  TS_CHECK(check_workspace(c->ctx, c->workspace, op->name));
  *run = !(c->ctx->flags & TS_K_PLAN);
  return TS_OK;
}

/* Checks call c of op and, when it must run, calls backend entry fn with
 * the remaining arguments (TS_ERR_UNSUPPORTED when the backend has none);
 * returns from the calling function. */
#define K_RUN(op, c, fn, ...)                                                 \
  do {                                                                        \
    const ts_k_backend *be_;                                                  \
    int run_;                                                                 \
    TS_CHECK(k_check(&(op), &(c), &be_, &run_));                              \
    if (!run_) return TS_OK;                                                  \
    if (!ts_k_op_timing()) /* the usual case: one load */                     \
      return be_->fn ? be_->fn(__VA_ARGS__) : unsupported(be_, (op).name);    \
    double t0_ = ts_k_op_clock();                                             \
    ts_status st_ = be_->fn ? be_->fn(__VA_ARGS__) : unsupported(be_, (op).name); \
    ts_k_op_time_add((op).name, t0_);                                         \
    return st_;                                                               \
  } while (0)

/* TS_ERR_INVALID_ARGUMENT naming both if output `out` (not NULL) is input
 * `in`, else TS_OK: an op's conflict rule. */
static inline ts_status k_no_alias(const void *out, const void *in, const char *out_name,
                                   const char *in_name, const char *op) {
  if (out == NULL || out != in) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: %s aliases %s (not allowed)", op, out_name,
                      in_name);
}

/* The scalar rule of a normalisation forward with rows (RMSNorm:
 * kernels.c; LayerNorm: kernels_encoder.c): a row needs a channel. */
static inline ts_status k_norm_channels(size_t C, const char *op) {
  return C == 0
             ? ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: C = 0: expected at least 1 channel", op)
             : TS_OK;
}

/* The pointer rule of a residual add fused with the norm after it
 * (ts_k_add_rmsnorm_forward: kernels.c; ts_k_add_layernorm_forward:
 * kernels_encoder.c): the sum res may alias a or b, the normalised out
 * none of res, a and b. */
static inline ts_status k_add_norm_alias(const void *out, const void *res, const void *a,
                                         const void *b, const char *op) {
  ts_status s = k_no_alias(out, res, "out", "res", op);
  if (s == TS_OK) s = k_no_alias(out, a, "out", "a", op);
  if (s == TS_OK) s = k_no_alias(out, b, "out", "b", op);
  return s;
}

/* The scalar rule every attention pass shares (causal: kernels.c;
 * bidirectional, NKV = NH: kernels_encoder.c): NKV >= 1 dividing NH. */
static inline ts_status k_attention_heads(size_t NH, size_t NKV, const char *op) {
  if (NKV == 0 || NH % NKV != 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: NH = %zu, NKV = %zu: expected NKV >= 1 dividing NH", op, NH, NKV);
  return TS_OK;
}

/* The rule on HS of a non-empty attention pass. */
static inline ts_status k_attention_hs(size_t HS, const char *op) {
  return HS == 0 ? ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: HS = 0: expected >= 1", op) : TS_OK;
}

/* The rows of the attention passes (causal and bidirectional alike). */
#define K_ATTENTION_FORWARD_PTRS \
  5, { "out", "state", "q", "k", "v" }
#define K_ATTENTION_BACKWARD_PTRS \
  9, { "dq", "dk", "dv", "dout", "out", "q", "k", "v", "state" }

#endif /* TS_KERNELS_KERNELS_FRONT_H */
