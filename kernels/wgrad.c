/*
 * wgrad.c — the store of deferred weight gradients (kernels.h
 * ts_k_wgrad_*): the weight-gradient halves of the backward ops, recorded
 * in call order with their operands (copied when they lie in a volatile
 * range), run later by the same ops with only their weight outputs.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

enum { KIND_LINEAR, KIND_RMSNORM, KIND_LAYERNORM, KIND_BIAS, KIND_EMBEDDING, N_KINDS };
enum { MAX_IN = 4 };

typedef struct record {
  int kind;
  ts_dtype dt;
  void *out[2];             /* the weight outputs (NULL: not asked for) */
  const void *in[MAX_IN];   /* the operands, or their copies */
  void *copy[MAX_IN];       /* the copies this record owns, else NULL */
  size_t d[3];              /* the op's sizes */
} record;

struct ts_k_wgrad {
  const ts_k_wgrad_mem *mem;
  struct {
    const void *p;
    size_t bytes;
  } call[TS_K_WGRAD_CALL_RANGES]; /* the store's own volatile ranges (ts_k_wgrad_volatile) */
  record *rec;
  size_t n, cap;
  size_t bytes; /* of copies held */
};

ts_status ts_k_wgrad_new(const ts_k_wgrad_mem *mem, ts_k_wgrad **out) {
  *out = NULL;
  if (!mem || !mem->alloc || !mem->release)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "ts_k_wgrad_new: expected a memory with alloc and release");
  ts_k_wgrad *w = calloc(1, sizeof *w);
  if (!w) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "ts_k_wgrad_new: the store");
  w->mem = mem;
  *out = w;
  return TS_OK;
}

void ts_k_wgrad_clear(ts_k_wgrad *w) {
  if (!w) return;
  for (size_t i = 0; i < w->n; i++)
    for (int j = 0; j < MAX_IN; j++)
      if (w->rec[i].copy[j]) w->mem->release(w->mem->user, w->rec[i].copy[j]);
  w->n = 0;
  w->bytes = 0;
}

void ts_k_wgrad_free(ts_k_wgrad *w) {
  if (!w) return;
  ts_k_wgrad_clear(w);
  free(w->rec);
  free(w);
}

size_t ts_k_wgrad_pending(const ts_k_wgrad *w) { return w ? w->n : 0; }
size_t ts_k_wgrad_bytes(const ts_k_wgrad *w) { return w ? w->bytes : 0; }

void ts_k_wgrad_volatile(ts_k_wgrad *w, int i, const void *p, size_t bytes) {
  TS_ASSERT(i >= 0 && i < TS_K_WGRAD_CALL_RANGES);
  w->call[i].p = p;
  w->call[i].bytes = p ? bytes : 0;
}

static int in_range(uintptr_t a, const void *p, size_t bytes) {
  uintptr_t lo = (uintptr_t)p;
  return p && a >= lo && a - lo < bytes;
}

/* 1 if p lies in one of mem's or w's volatile ranges. */
static int is_volatile(const ts_k_wgrad *w, const void *p) {
  uintptr_t a = (uintptr_t)p;
  for (int i = 0; i < w->mem->n_ranges; i++)
    if (in_range(a, w->mem->ranges[i].p, w->mem->ranges[i].bytes)) return 1;
  for (int i = 0; i < TS_K_WGRAD_CALL_RANGES; i++)
    if (in_range(a, w->call[i].p, w->call[i].bytes)) return 1;
  return 0;
}

/* The bytes of each operand of a record of `kind`. */
static void operand_bytes(int kind, ts_dtype dt, const size_t d[3], size_t bytes[MAX_IN]) {
  size_t es = ts_dtype_size(dt);
  memset(bytes, 0, MAX_IN * sizeof *bytes);
  switch (kind) {
    case KIND_LINEAR: /* dout (M, N), inp (M, K) */
      bytes[0] = d[0] * d[1] * es;
      bytes[1] = d[0] * d[2] * es;
      break;
    case KIND_RMSNORM: /* dout, inp (N, C), rstd (N) fp32 */
      bytes[0] = bytes[1] = d[0] * d[1] * es;
      bytes[2] = d[0] * 4;
      break;
    case KIND_LAYERNORM: /* dout, inp (N, C), mean, rstd (N) fp32 */
      bytes[0] = bytes[1] = d[0] * d[1] * es;
      bytes[2] = bytes[3] = d[0] * 4;
      break;
    case KIND_BIAS: /* dout (N, C) */
      bytes[0] = d[0] * d[1] * es;
      break;
    default: /* embedding: dout (N, C), tokens (N) int32 */
      bytes[0] = d[0] * d[1] * es;
      bytes[1] = d[0] * 4;
      break;
  }
}

ts_status ts_k_wgrad_record(const ts_kctx *ctx, int kind, ts_dtype dt, void *out0, void *out1,
                            const void *in0, const void *in1, const void *in2, const void *in3,
                            size_t d0, size_t d1, size_t d2) {
  ts_k_wgrad *w = ctx->wgrad;
  if ((unsigned)kind >= N_KINDS)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "ts_k_wgrad_record: kind %d", kind);
  if (w->n == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 16;
    record *r = realloc(w->rec, cap * sizeof *r);
    if (!r) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "ts_k_wgrad: %zu records", cap);
    w->rec = r;
    w->cap = cap;
  }
  record r = {kind, dt, {out0, out1}, {in0, in1, in2, in3}, {NULL}, {d0, d1, d2}};
  size_t bytes[MAX_IN];
  operand_bytes(kind, dt, r.d, bytes);
  ts_status st = TS_OK;
  for (int j = 0; j < MAX_IN && st == TS_OK; j++) {
    if (!r.in[j] || !bytes[j] || !is_volatile(w, r.in[j])) continue;
    st = w->mem->alloc(w->mem->user, bytes[j], &r.copy[j]);
    if (st == TS_OK) {
      ts_kctx plain = *ctx;
      plain.wgrad = NULL;
      st = ts_k_copy(&plain, r.copy[j], r.in[j], bytes[j]);
      r.in[j] = r.copy[j];
      w->bytes += bytes[j];
    }
  }
  if (st != TS_OK) {
    for (int j = 0; j < MAX_IN; j++)
      if (r.copy[j]) w->mem->release(w->mem->user, r.copy[j]);
    return st;
  }
  w->rec[w->n++] = r;
  return TS_OK;
}

/* p moved from [from, from + bytes) to `to`, or p. */
static void *rebase(void *p, const void *from, size_t bytes, void *to) {
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)from;
  if (!p || !bytes || a < lo || a - lo >= bytes) return p;
  return (char *)to + (a - lo);
}

ts_status ts_k_wgrad_run(const ts_kctx *ctx, ts_k_wgrad *w, const void *from, size_t bytes,
                         void *to) {
  ts_kctx k = *ctx;
  k.wgrad = NULL;
  ts_status st = TS_OK;
  for (size_t i = 0; i < w->n && st == TS_OK; i++) {
    const record *r = &w->rec[i];
    void *o0 = rebase(r->out[0], from, bytes, to), *o1 = rebase(r->out[1], from, bytes, to);
    switch (r->kind) {
      case KIND_LINEAR:
        st = ts_k_linear_backward(&k, NULL, o0, r->in[0], r->in[1], NULL, r->d[0], r->d[1],
                                  r->d[2], r->dt);
        break;
      case KIND_RMSNORM:
        st = ts_k_rmsnorm_backward(&k, NULL, o0, r->in[0], r->in[1], NULL, r->in[2], r->d[0],
                                   r->d[1], r->dt);
        break;
      case KIND_LAYERNORM:
        st = ts_k_layernorm_backward(&k, NULL, o0, o1, r->in[0], r->in[1], NULL, r->in[2],
                                     r->in[3], r->d[0], r->d[1], r->dt);
        break;
      case KIND_BIAS:
        st = ts_k_bias_backward(&k, o0, r->in[0], r->d[0], r->d[1], r->dt);
        break;
      default:
        st = ts_k_embedding_backward(&k, o0, r->in[0], r->in[1], r->d[0], r->d[1], r->d[2], r->dt);
        break;
    }
  }
  ts_k_wgrad_clear(w);
  return st;
}
