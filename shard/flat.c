/* flat.c — offsets and padding of a unit's flat buffer. */
#include "shard/flat.h"

#include <string.h>

ts_status ts_flat_layout_init(ts_flat_layout *layout, const size_t *numels, size_t n,
                              size_t dp_size) {
  memset(layout, 0, sizeof *layout);
  if (n > TS_UNIT_MAX_TENSORS)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "flat layout: %zu tensors: expected at most %d",
                        n, TS_UNIT_MAX_TENSORS);
  if (dp_size == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "flat layout: dp_size 0: expected >= 1");
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    layout->offset[i] = off;
    layout->numel[i] = numels[i];
    off += numels[i];
  }
  size_t granule = dp_size * TS_FLAT_ALIGN;
  layout->n_tensors = n;
  layout->total = off;
  layout->padded = (off + granule - 1) / granule * granule;
  layout->dp_size = dp_size;
  layout->shard = layout->padded / dp_size;
  return TS_OK;
}

void ts_flat_shard_overlap(const ts_flat_layout *layout, size_t i, size_t rank, size_t *begin,
                           size_t *end) {
  TS_ASSERT(i < layout->n_tensors && rank < layout->dp_size);
  size_t lo = ts_flat_shard_begin(layout, rank), hi = lo + layout->shard;
  size_t b = layout->offset[i], e = b + layout->numel[i];
  if (b < lo) b = lo;
  if (e > hi) e = hi;
  if (b >= e) b = e = lo; /* empty: at the shard's start, so b - lo is 0 */
  *begin = b;
  *end = e;
}
