/*
 * slices.h — private to engine/: tensors.c: (tensor, this rank's part) — the slice
 * iterator over a unit's tensors, AdamW per unit, moments set, the
 * overflow search.
 */
#ifndef TS_ENGINE_SLICES_H
#define TS_ENGINE_SLICES_H

#include "engine/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* First flat element of this rank's shard of unit u. */
size_t ts_engine_shard_begin(const ts_engine *e, int u);

/* This rank's gradient shard (S) of unit u: its own buffer when the
 * policy shards gradients, else its slice of the full gradient. */
void *ts_engine_grad_shard(const ts_engine *e, int u);

/* One part of a tensor that this rank holds in a buffer of unit u. */
typedef struct ts_slice {
  int tensor;    /* index in the unit's layout */
  size_t begin;  /* first flat element of the part (offset in the full unit) */
  size_t end;    /* one past the last */
  size_t offset; /* element offset of `begin` in the held buffer */
} ts_slice;

/* The part of tensor i alone (possibly empty: begin == end). */
ts_slice ts_slice_of(const ts_engine *e, int u, int i, int sharded);
/* Element offset of flat element `flat` of unit u in a held buffer. */
size_t ts_engine_held_offset(const ts_engine *e, int u, int sharded, size_t flat);

/* AdamW on this rank's part of unit u (for the optimizer step): each
 * tensor's part with its own weight decay; scale multiplies the gradient
 * first. */
ts_status ts_engine_adamw_unit(ts_engine *e, int u, float lr, float scale);
/* The same on elements [lo, hi) of the unit's optimizer state alone, whose
 * master (NULL in fp32: the parameters are the masters), m and v arrays
 * start at at[0..2] with element lo (an offloaded piece, offload.h); the
 * same bits as the whole unit's, piece by piece (AdamW is elementwise). */
ts_status ts_engine_adamw_part(ts_engine *e, int u, float lr, float scale, size_t lo, size_t hi,
                               float *const at[3]);

/* Writes this rank's part of Adam's moment `which` (0: m, 1: v) of tensor
 * i of unit u (owned, asserted) from src, the whole tensor as fp32 host
 * values (only the part held is read). A checkpoint's load. */
ts_status ts_engine_set_state(ts_engine *e, int u, int i, int which, const float *src);

/* Skipped step: where the overflow began: the highest unit holding a
 * non-finite reduced gradient on any rank and its first such tensor
 * (layout order), agreed by one all-reduce. */
ts_status ts_engine_find_overflow(ts_engine *e, int *unit, int *tensor);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_SLICES_H */
