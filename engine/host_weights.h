/*
 * host_weights.h — a model's whole weights as fp32 host values, gathered
 * from a training engine at any ZeRO stage (train --sample-every hands them
 * to generation, models/generate.h). One rank keeps them, one flat buffer
 * per unit laid out as the unit's parameters; the others hold one tensor
 * at a time while they take part in the gather.
 */
#ifndef TS_ENGINE_HOST_WEIGHTS_H
#define TS_ENGINE_HOST_WEIGHTS_H

#include <stddef.h>

#include "engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_host_weights {
  const ts_model *m;
  float **units;  /* keep: [n_units] fp32 host buffers, each the unit's numel; else NULL */
  float *scratch; /* not keep: the largest tensor's fp32 host values; else NULL */
} ts_host_weights;

/* Zeroes *w and allocates for m (kept by pointer): keep != 0 every unit's
 * buffer, else one tensor's scratch. TS_ERR_OUT_OF_MEMORY (free *w with
 * ts_host_weights_free all the same). Local: agree on the outcome before
 * gathering. */
ts_status ts_host_weights_alloc(ts_host_weights *w, const ts_model *m, int keep);

/* Every tensor of m in layout order through ts_engine_get_tensor (e holds
 * m's units; collective at ZeRO stage 3: every rank of its group calls
 * this alike), into the kept buffers or the scratch. Its errors. */
ts_status ts_host_weights_gather(ts_host_weights *w, ts_engine *e);

/* The kept tensor `name` (numel fp32) into dst: a ts_weights_fn
 * (models/generate.h) over w. TS_ERR_INVALID_ARGUMENT (not a tensor of m,
 * another size). */
ts_status ts_host_weights_read(void *w, const char *name, float *dst, size_t numel);

/* Frees what w holds; a zeroed w is fine. */
void ts_host_weights_free(ts_host_weights *w);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_HOST_WEIGHTS_H */
