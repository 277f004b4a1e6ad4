/*
 * flat.h — the flat-buffer layout of one unit and its partition across the
 * data-parallel ranks (DESIGN.md "Flat parameters and shards").
 *
 * A unit's tensors sit back to back, in layout order, in one flat buffer.
 * The total is padded with zeros up to a multiple of dp_size * 16 elements,
 * so rank r owns exactly [r*S, (r+1)*S) with S = padded / dp_size, and every
 * shard starts 16-element aligned. The same offsets index the compute params,
 * the gradients, the fp32 master weights and each Adam moment.
 */
#ifndef TS_SHARD_FLAT_H
#define TS_SHARD_FLAT_H

#include <stddef.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_FLAT_ALIGN 16     /* elements; padding granule per rank */

typedef struct ts_flat_layout {
  size_t n_tensors;                     /* tensors in layout order */
  size_t offset[TS_UNIT_MAX_TENSORS];   /* element offset of each tensor */
  size_t numel[TS_UNIT_MAX_TENSORS];    /* elements of each tensor */
  size_t total;                         /* sum of numel[], unpadded elements */
  size_t padded;                        /* total rounded up to dp_size*16 */
  size_t dp_size;                       /* ranks sharing the buffer */
  size_t shard;                         /* padded / dp_size, elements per rank */
} ts_flat_layout;

/* Lays out n tensors of numels[i] elements for dp_size ranks.
 * Returns TS_ERR_INVALID_ARGUMENT when n > TS_UNIT_MAX_TENSORS or
 * dp_size == 0. */
ts_status ts_flat_layout_init(ts_flat_layout *layout, const size_t *numels, size_t n,
                              size_t dp_size);

/* First element owned by rank r: r * layout->shard. */
static inline size_t ts_flat_shard_begin(const ts_flat_layout *layout, size_t rank) {
  return rank * layout->shard;
}

/* The part of tensor i (i < n_tensors, asserted) that rank r owns, as flat
 * element offsets [*begin, *end) of the full buffer; when the tensor lies
 * wholly in other ranks' shards, *begin == *end == the shard's first element
 * (so the shard-relative offset of an empty part is 0, never negative). Subtract
 * ts_flat_shard_begin(layout, r) to index a shard-sized buffer (the view of
 * the gradient shard, fp32 master weights and Adam moments of this rank). */
void ts_flat_shard_overlap(const ts_flat_layout *layout, size_t i, size_t rank, size_t *begin,
                           size_t *end);

#ifdef __cplusplus
}
#endif

#endif /* TS_SHARD_FLAT_H */
