/* family.c — the shared unit-building pieces of family.h. */
#include "models/family.h"

#include <stdio.h>

void ts_family_start_unit(ts_unit *u, const ts_unit_ops *ops, ts_unit_role r, int layer) {
  u->ops = ops;
  u->role = r;
  u->layer = layer;
  u->tied_unit = u->tied_tensor = -1;
}

void ts_family_add_tensor(ts_unit *u, const char *name, size_t rows, size_t cols, int ndim,
                          ts_init_kind init, double std) {
  TS_ASSERT(u->n_tensors < TS_UNIT_MAX_TENSORS);
  ts_tensor_spec *t = &u->tensors[u->n_tensors++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim;
  t->shape[0] = rows;
  t->shape[1] = cols;
  t->numel = rows * cols;
  t->offset = u->numel;
  t->decay = ndim >= 2;
  t->init = init;
  t->init_std = init == TS_INIT_NORMAL ? std : 0.0;
  u->numel += t->numel;
}

void *ts_family_carve(void *base, char **p, size_t n, size_t es) {
  char *b = (char *)base, *r = b + (((size_t)(*p - b) + 63) & ~(size_t)63);
  *p = r + n * es;
  return r;
}

void *ts_family_tensor(const ts_unit *u, int i, const void *flat, ts_dtype dt) {
  return (char *)flat + u->tensors[i].offset * ts_dtype_size(dt);
}

ts_status ts_family_split_ws(const ts_kctx *ctx, size_t temps, size_t need, ts_kctx *kctx,
                             const char *family, const char *what) {
  if (ctx->workspace_bytes < need)
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s %s: workspace has %zu bytes, needs %zu", family,
                        what, ctx->workspace_bytes, need);
  *kctx = *ctx;
  kctx->workspace = (char *)ctx->workspace + temps;
  kctx->workspace_bytes = ctx->workspace_bytes - temps;
  return TS_OK;
}
