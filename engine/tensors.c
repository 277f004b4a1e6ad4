/*
 * tensors.c — the engine's view of one tensor: the slice iterator over
 * (tensor, this rank's part of it) that AdamW, get/set tensor and the
 * overflow search share, and those three users (engine_internal.h).
 *
 * A rank holds each buffer of unit u either whole (P elements, flat offsets
 * as in the layout) or as its shard [r S, (r+1) S); the policy table says
 * which per buffer (params, grads, optimizer state). A tensor's part in a
 * buffer is its flat range clipped to what the buffer holds, and its
 * element offset there is the flat offset minus the buffer's first flat
 * element: that arithmetic lives here once.
 */
#include <math.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "shard/collect.h"

size_t ts_engine_shard_begin(const ts_engine *e, int u) {
  return ts_flat_shard_begin(&e->units[u].layout, (size_t)e->rank);
}

void *ts_engine_grad_shard(const ts_engine *e, int u) {
  const unit_state *s = &e->units[u];
  return e->zero->shard_grads ? s->grads : (char *)s->grads + ts_engine_shard_begin(e, u) * e->es;
}

size_t ts_engine_held_offset(const ts_engine *e, int u, int sharded, size_t flat) {
  return flat - (sharded ? ts_engine_shard_begin(e, u) : 0);
}

ts_slice ts_slice_of(const ts_engine *e, int u, int i, int sharded) {
  const ts_tensor_spec *t = &e->model->units[u].tensors[i];
  ts_slice s = {i, t->offset, t->offset + t->numel, 0};
  if (sharded)
    ts_flat_shard_overlap(&e->units[u].layout, (size_t)i, (size_t)e->rank, &s.begin, &s.end);
  s.offset = ts_engine_held_offset(e, u, sharded, s.begin);
  return s;
}

/* Walks the non-empty parts of unit u's tensors (layout order) in a
 * buffer that holds the whole unit (sharded == 0) or this rank's shard:
 * the one slice iterator of AdamW, tensor get/set and the overflow search
 * (checkpoints take ts_slice_of per tensor). */
typedef struct ts_slice_iter {
  const ts_engine *e; /* the engine (borrowed) */
  int unit;           /* the unit walked */
  int sharded;        /* 1: the buffer holds this rank's shard, 0: the whole unit */
  int next;           /* the next tensor to look at */
} ts_slice_iter;

/* An iterator over unit u's parts in a buffer sharded or whole. */
static ts_slice_iter ts_slices(const ts_engine *e, int u, int sharded) {
  ts_slice_iter it = {e, u, sharded, 0};
  return it;
}

/* Fills *s with the next part; 0 when there is none left. */
static int ts_slice_next(ts_slice_iter *it, ts_slice *s) {
  while (it->next < it->e->model->units[it->unit].n_tensors) {
    *s = ts_slice_of(it->e, it->unit, it->next++, it->sharded);
    if (s->begin < s->end) return 1;
  }
  return 0;
}

/* ---- AdamW ------------------------------------------------------------------- */

/* AdamW of n elements whose state (master, m, v: host) is in host memory
 * while their gradient (device) is not (ts_engine_state_on_host), in
 * pieces of the staging's length: the gradient piece copied to the host,
 * the CPU's AdamW (the device's element update: the same bits), the
 * updated parameters copied back to the device, or written in place where
 * they are host memory too (ts_engine_params_on_host). master NULL (fp32):
 * the parameters are the master weights: on the device copied to the host,
 * updated there and copied back. */
static ts_status adamw_staged(ts_engine *e, float *master, char *param, const char *grad, float *m,
                              float *v, size_t n, const ts_adamw_hparams *hp) {
  ts_dtype dt = e->opts.dtype;
  size_t es = e->es, cap = e->update.stage_n;
  ts_kctx host = ts_engine_host_ctx(e);
  int host_params = ts_engine_params_on_host(e);
  for (size_t k = 0; k < n; k += cap) {
    size_t c = n - k < cap ? n - k : cap;
    TS_CHECK(ts_k_to_host(&e->ctx, e->update.host_grad, grad + k * es, c * es));
    if (host_params) { /* the parameters are the host's: updated where they are */
      TS_CHECK(ts_k_adamw(&host, master ? master + k : (float *)(param + k * es),
                          master ? param + k * es : NULL, dt, m + k, v + k, e->update.host_grad, dt,
                          c, hp));
      continue;
    }
    float *mst = master ? master + k : (float *)e->update.host_param;
    if (!master) TS_CHECK(ts_k_to_host(&e->ctx, e->update.host_param, param + k * es, c * es));
    TS_CHECK(ts_k_adamw(&host, mst, master ? e->update.host_param : NULL, dt, m + k, v + k,
                        e->update.host_grad, dt, c, hp));
    TS_CHECK(ts_k_from_host(&e->ctx, param + k * es, e->update.host_param, c * es));
  }
  return TS_OK;
}

ts_status ts_engine_adamw_part(ts_engine *e, int u, float lr, float scale, size_t lo, size_t hi,
                               float *const at[3]) {
  unit_state *s = &e->units[u];
  const ts_zero_policy *z = e->zero;
  ts_dtype dt = e->opts.dtype;
  ts_slice_iter it = ts_slices(e, u, z->shard_optim);
  ts_slice sl;
  while (ts_slice_next(&it, &sl)) {
    /* the slice's elements of the optimizer state inside [lo, hi) */
    size_t a = sl.offset > lo ? sl.offset : lo, b = sl.offset + (sl.end - sl.begin);
    if (b > hi) b = hi;
    if (a >= b) continue;
    size_t d = a - sl.offset; /* from the slice's start */
    const ts_tensor_spec *t = &e->model->units[u].tensors[sl.tensor];
    ts_adamw_hparams hp = {lr, e->opts.beta1, e->opts.beta2, e->opts.eps,
                           t->decay ? e->opts.weight_decay : 0.0f, e->optim.step, scale};
    char *param =
        (char *)s->params + (ts_engine_held_offset(e, u, z->shard_params, sl.begin) + d) * e->es;
    const char *grad =
        (const char *)s->grads + (ts_engine_held_offset(e, u, z->shard_grads, sl.begin) + d) * e->es;
    if (ts_engine_state_on_host(e)) {
      TS_CHECK(adamw_staged(e, at[0] ? at[0] + (a - lo) : NULL, param, grad, at[1] + (a - lo),
                            at[2] + (a - lo), b - a, &hp));
      continue;
    }
    /* fp32: the compute parameters are the master weights */
    float *master = at[0] ? at[0] + (a - lo) : (float *)param;
    TS_CHECK(ts_k_adamw(&e->ctx, master, at[0] ? param : NULL, dt, at[1] + (a - lo),
                        at[2] + (a - lo), grad, dt, b - a, &hp));
  }
  return TS_OK;
}

ts_status ts_engine_adamw_unit(ts_engine *e, int u, float lr, float scale) {
  unit_state *s = &e->units[u];
  float *const at[3] = {s->master, s->m, s->v};
  size_t n = e->zero->shard_optim ? s->layout.shard : s->layout.padded;
  return ts_engine_adamw_part(e, u, lr, scale, 0, n, at);
}

/* ---- the overflow search -------------------------------------------------------- */

ts_status ts_engine_find_overflow(ts_engine *e, int *unit, int *tensor) {
  const ts_model *m = e->model;
  enum { MAX = TS_UNIT_MAX_TENSORS };
  /* A flag per (unit, tensor) of the reduced gradient shard, on the device,
   * read once. Every part is looked at, empty ones included (flag 0);
   * units of other pipeline stages are theirs to look at. */
  TS_ENGINE_FOR_UNITS(e, u)
    for (int i = 0; i < m->units[u].n_tensors; i++) {
      ts_slice sl = ts_slice_of(e, u, i, 1);
      TS_CHECK(ts_k_nonfinite(&e->ctx, e->sc.nonfinite + u * MAX + i,
                              (char *)ts_engine_grad_shard(e, u) + sl.offset * e->es,
                              sl.end - sl.begin, e->opts.dtype));
    }
  /* the host copy of the flags: the same place in the host block */
  int32_t *flags = (int32_t *)((char *)e->sc.host + ((char *)e->sc.nonfinite - (char *)e->sc.block));
  size_t nflags = (size_t)m->n_units * MAX;
  TS_CHECK(ts_k_to_host(&e->ctx, flags, e->sc.nonfinite, nflags * sizeof *flags));
  /* Backward runs from the last unit to the first and a non-finite
   * activation gradient spoils every unit below it, so the answer is the
   * highest unit holding a non-finite reduced gradient on any rank, and in
   * it the first such tensor in layout order: agreed by an all-reduce (max)
   * of each rank's u * MAX + (MAX - 1 - i), -1 for none. */
  double key = -1;
  for (int u = ts_engine_last_unit(e); u >= 0 && key < 0; u = ts_engine_prev_unit(e, u))
    for (int i = 0; i < m->units[u].n_tensors; i++)
      if (flags[u * MAX + i]) {
        key = (double)(u * MAX + (MAX - 1 - i));
        break;
      }
  ts_engine_comm_note(e, -1);
  TS_CHECK(ts_comm_all_reduce_f64(e->dp, &key, 1, TS_COMM_MAX));
  if (e->pipe.pp) TS_CHECK(ts_comm_all_reduce_f64(e->pipe.pp, &key, 1, TS_COMM_MAX));
  if (key < 0) /* partial sums overflowed, no element did: impossible in fp16 */
    return ts_set_error(TS_ERR_INTERNAL, "engine: overflow agreed but no rank holds a "
                                         "non-finite gradient");
  *unit = (int)key / MAX;
  *tensor = MAX - 1 - (int)key % MAX;
  return TS_OK;
}

/* ---- tensors in and out ------------------------------------------------------------ */

/* Converts n elements between fp32 host values and the compute dtype on
 * the engine's device: to_host 0 writes dev (dt) from host (fp32), 1 the
 * other way. Directly on the CPU; elsewhere a workspace-sized piece at a
 * time through the workspace (cast on the device, copy across). host is
 * only read when !to_host (the casts of const away are for that). */
static ts_status stage(ts_engine *e, int to_host, void *dev, float *host, size_t n) {
  ts_dtype dt = e->opts.dtype;
  const ts_kctx *c = &e->ctx;
  if (e->device == TS_DEVICE_CPU)
    return to_host ? ts_k_cast(c, host, TS_FP32, dev, dt, n) : ts_k_cast(c, dev, dt, host, TS_FP32, n);
  size_t piece = c->workspace_bytes / 4;
  if (piece == 0) return ts_set_error(TS_ERR_INTERNAL, "engine: no workspace to stage tensors");
  for (size_t k = 0; k < n; k += piece) {
    size_t m = n - k < piece ? n - k : piece;
    char *d = (char *)dev + k * e->es;
    if (to_host) {
      TS_CHECK(ts_k_cast(c, c->workspace, TS_FP32, d, dt, m));
      TS_CHECK(ts_k_to_host(c, host + k, c->workspace, m * 4));
    } else {
      TS_CHECK(ts_k_from_host(c, c->workspace, host + k, m * 4));
      TS_CHECK(ts_k_cast(c, d, dt, c->workspace, TS_FP32, m)); /* stream order guards the reuse */
    }
  }
  return TS_OK;
}

/* stage() for a unit's own parameters: on the host, where they are host
 * memory (ts_engine_params_on_host), a cast on the host's context. */
static ts_status stage_params(ts_engine *e, int to_host, void *params, float *host, size_t n) {
  if (!ts_engine_params_on_host(e)) return stage(e, to_host, params, host, n);
  ts_dtype dt = e->opts.dtype;
  ts_kctx h = ts_engine_host_ctx(e);
  return to_host ? ts_k_cast(&h, host, TS_FP32, params, dt, n)
                 : ts_k_cast(&h, params, dt, host, TS_FP32, n);
}

/* Finds tensor `name`: its unit and index, checking its size and that
 * this rank holds it (its pipeline stage's units; a tied head's copy of the
 * lender's parameters when params != 0). */
static ts_status find(const ts_engine *e, const char *name, size_t numel, int params, int *u,
                      int *i) {
  TS_CHECK(ts_model_find_tensor(e->model, name, u, i));
  if (!ts_engine_owns(e, *u) && !(params && e->pipe.replica && e->units[*u].params))
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "tensor %s: unit %d is not on pipeline stage %d (units %d..%d%s)", name,
                        *u, e->pipe.stage, e->pipe.c_begin[0], e->pipe.c_end[0] - 1,
                        e->pipe.chunks > 1 ? " and its other chunks'" : "");
  const ts_tensor_spec *t = &e->model->units[*u].tensors[*i];
  if (t->numel != numel)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "tensor %s: %zu elements given, expected %zu",
                        name, numel, t->numel);
  return TS_OK;
}

/* Host values into an offloaded state array, a piece at a time
 * (offload.h ts_offload_each): array 0 master, 1 m, 2 v; src is element
 * `lo` of the state's range. */
typedef struct state_copy {
  ts_engine *e;
  const float *src;
  size_t lo;
  int array;
} state_copy;

/* Host values into state (host or device memory: ts_engine_state_on_host). */
static ts_status state_from_host(ts_engine *e, float *dst, const float *src, size_t n) {
  return ts_engine_state_on_host(e) ? ts_k_host_copy(&e->ctx, dst, src, n * 4)
                                    : ts_k_from_host(&e->ctx, dst, src, n * 4);
}

static ts_status copy_state(void *arg, float *const at[3], size_t first, size_t count) {
  const state_copy *c = arg;
  return state_from_host(c->e, at[c->array], c->src + (first - c->lo), count);
}

ts_status ts_engine_set_tensor(ts_engine *e, const char *name, const float *src, size_t numel) {
  int u, i;
  TS_CHECK(find(e, name, numel, 1, &u, &i));
  ts_engine_wait_staging(e);
  unit_state *s = &e->units[u];
  const ts_tensor_spec *t = &e->model->units[u].tensors[i];
  ts_slice p = ts_slice_of(e, u, i, e->zero->shard_params);
  if (p.end > p.begin) /* (an empty part's begin may lie before the tensor) */
    TS_CHECK(stage_params(e, 0, (char *)s->params + p.offset * e->es,
                          (float *)src + (p.begin - t->offset), p.end - p.begin));
  ts_slice o = ts_slice_of(e, u, i, e->zero->shard_optim);
  /* master weights: bf16/fp16, on units this stage updates (a tied head's
   * replica of its lender holds parameters only) */
  if (e->opts.dtype == TS_FP32 || !ts_engine_owns(e, u) || o.end == o.begin) return TS_OK;
  const float *from = src + (o.begin - t->offset);
  if (e->offload) {
    state_copy c = {e, from, o.offset, 0};
    return ts_offload_each(e, u, o.offset, o.end - o.begin, 1, copy_state, &c);
  }
  return state_from_host(e, s->master + o.offset, from, o.end - o.begin);
}

ts_status ts_engine_set_state(ts_engine *e, int u, int i, int which, const float *src) {
  TS_ASSERT(ts_engine_owns(e, u) && which >= 0 && which <= 1);
  ts_engine_wait_staging(e);
  unit_state *s = &e->units[u];
  const ts_tensor_spec *t = &e->model->units[u].tensors[i];
  ts_slice o = ts_slice_of(e, u, i, e->zero->shard_optim);
  if (o.end == o.begin) return TS_OK;
  const float *from = src + (o.begin - t->offset);
  if (e->offload) {
    state_copy c = {e, from, o.offset, 1 + which};
    return ts_offload_each(e, u, o.offset, o.end - o.begin, 1, copy_state, &c);
  }
  float *dst = (which == 0 ? s->m : s->v) + o.offset;
  return state_from_host(e, dst, from, o.end - o.begin);
}

ts_status ts_engine_get_tensor(ts_engine *e, const char *name, float *dst, size_t numel) {
  int u, i;
  TS_CHECK(find(e, name, numel, 1, &u, &i));
  const void *full;
  TS_CHECK(ts_engine_acquire_params(e, u, &full));
  size_t off = e->model->units[u].tensors[i].offset;
  ts_status st = stage(e, 1, (char *)full + off * e->es, dst, numel);
  ts_engine_release_params(e, u);
  return st;
}

ts_status ts_engine_get_grad(const ts_engine *e, const char *name, float *dst, size_t numel) {
  if (e->dp_size * e->replicas != 1)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "engine: get_grad of %s on %d ranks: gradients are unreduced or sharded; "
                        "expected a one-rank group",
                        name, e->dp_size);
  int u, i;
  TS_CHECK(find(e, name, numel, 0, &u, &i));
  /* One rank: the gradient buffer is the whole padded unit in every stage. */
  size_t off = e->model->units[u].tensors[i].offset;
  TS_CHECK(stage((ts_engine *)e, 1, (char *)e->units[u].grads + off * e->es, dst, numel));
  float scale = e->optim.scaler.scale;
  if (scale != 1.0f)
    for (size_t k = 0; k < numel; k++) dst[k] /= scale;
  return TS_OK;
}

ts_status ts_engine_get_logits(const ts_engine *e, float *dst, size_t numel) {
  size_t B = e->opts.micro_batch, T = e->opts.seq, V = e->model->vocab_size;
  if (numel != B * T * V)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "logits: %zu elements given, expected %zu",
                        numel, B * T * V);
  int h = e->model->n_units - 1;
  if (!ts_engine_owns(e, h))
    return ts_set_error(TS_ERR_INVALID_USAGE, "logits: the last unit is on the last pipeline stage");
  const act_slot *sl = &e->slots[e->pipe.slot0[e->pipe.chunks - 1]]; /* the head's chunk */
  void *logits = ts_unit_logits(e->model, h, sl->saved[h], B, T, e->opts.dtype);
  if (!logits)
    return ts_set_error(TS_ERR_INVALID_USAGE, "logits: the last unit of %s has none",
                        e->model->name);
  return stage((ts_engine *)e, 1, logits, dst, numel);
}

const float *ts_engine_optimizer_state(const ts_engine *e, int u, int which, size_t *n) {
  TS_ASSERT(ts_engine_owns(e, u) && which >= 0 && which <= 2);
  const unit_state *s = &e->units[u];
  *n = e->zero->shard_optim ? s->layout.shard : s->layout.padded;
  if (e->offload) return ts_offload_peek((ts_engine *)e, u, which == 0 ? 1 : which == 1 ? 2 : 0);
  return which == 0 ? s->m : which == 1 ? s->v : s->master;
}
