/* host_weights.c — a model's whole weights gathered to host memory
 * (engine/host_weights.h). */
#include "engine/host_weights.h"

#include <stdlib.h>
#include <string.h>

ts_status ts_host_weights_alloc(ts_host_weights *w, const ts_model *m, int keep) {
  memset(w, 0, sizeof *w);
  w->m = m;
  if (!keep) {
    size_t largest = 1;
    for (int u = 0; u < m->n_units; u++)
      for (int i = 0; i < m->units[u].n_tensors; i++)
        if (m->units[u].tensors[i].numel > largest) largest = m->units[u].tensors[i].numel;
    w->scratch = malloc(largest * sizeof *w->scratch);
    return w->scratch ? TS_OK : ts_set_error(TS_ERR_OUT_OF_MEMORY, "weights: %zu floats", largest);
  }
  w->units = calloc((size_t)m->n_units, sizeof *w->units);
  if (!w->units) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "weights: %d units", m->n_units);
  for (int u = 0; u < m->n_units; u++) {
    w->units[u] = malloc((m->units[u].numel ? m->units[u].numel : 1) * sizeof(float));
    if (!w->units[u]) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "weights: unit %d", u);
  }
  return TS_OK;
}

ts_status ts_host_weights_gather(ts_host_weights *w, ts_engine *e) {
  for (int u = 0; u < w->m->n_units; u++) {
    const ts_unit *un = &w->m->units[u];
    for (int i = 0; i < un->n_tensors; i++) {
      const ts_tensor_spec *t = &un->tensors[i];
      TS_CHECK(ts_engine_get_tensor(e, t->name, w->units ? w->units[u] + t->offset : w->scratch,
                                    t->numel));
    }
  }
  return TS_OK;
}

ts_status ts_host_weights_read(void *user, const char *name, float *dst, size_t numel) {
  const ts_host_weights *w = user;
  int u, i;
  TS_CHECK(ts_model_find_tensor(w->m, name, &u, &i));
  const ts_tensor_spec *t = &w->m->units[u].tensors[i];
  if (t->numel != numel || !w->units)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "tensor %s: %zu values, expected %zu%s", name,
                        numel, t->numel, w->units ? "" : " (the weights are not kept here)");
  memcpy(dst, w->units[u] + t->offset, numel * sizeof *dst);
  return TS_OK;
}

void ts_host_weights_free(ts_host_weights *w) {
  for (int u = 0; w->units && u < w->m->n_units; u++) free(w->units[u]);
  free(w->units);
  free(w->scratch);
  memset(w, 0, sizeof *w);
}
