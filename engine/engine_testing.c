/* engine_testing.c — planted gradient values on the engine's test seam
 * (engine_testing.h); linked into tests only (//engine:testing). */
#include "engine/engine_testing.h"

#include <string.h>

#include "engine/engine.h"

/* One engine's planted values and the hooks that plant them. */
typedef struct plant {
  struct ts_engine *e;        /* the engine (NULL: a free slot) */
  ts_engine_inject inject[4]; /* armed values */
  int n;                      /* how many are armed */
  ts_engine_hooks hooks;      /* what the engine carries while armed */
} plant;

static plant g_plants[8];

/* after_backward: writes every value armed for (step, unit), as a host
 * fp32 value cast on the engine's device through its workspace. */
static ts_status plant_values(void *user, struct ts_engine *e, int step, int unit, void *grads) {
  const plant *p = user;
  const ts_engine_opts *o = ts_engine_options(e);
  const ts_kctx *ctx = ts_engine_context(e);
  size_t es = ts_dtype_size(o->dtype);
  for (int k = 0; k < p->n; k++) {
    if (p->inject[k].step != step || p->inject[k].unit != unit) continue;
    size_t off = ts_engine_model(e)->units[unit].tensors[p->inject[k].tensor].offset;
    float v = p->inject[k].value;
    TS_CHECK(ts_k_from_host(ctx, ctx->workspace, &v, sizeof v));
    TS_CHECK(ts_k_cast(ctx, (char *)grads + off * es, o->dtype, ctx->workspace, TS_FP32, 1));
  }
  return TS_OK;
}

/* release: the engine is gone, its slot is free. */
static void plant_release(void *user, struct ts_engine *e) { memset(user, 0, sizeof(plant)); }

void ts_engine_inject_nonfinite(struct ts_engine *e, const ts_engine_inject *inject) {
  enum { SLOTS = sizeof g_plants / sizeof g_plants[0] };
  plant *p = NULL;
  for (int i = 0; i < SLOTS && !p; i++)
    if (g_plants[i].e == e) p = &g_plants[i];
  if (!inject) { /* disarm */
    ts_engine_set_hooks(e, NULL);
    if (p) memset(p, 0, sizeof *p);
    return;
  }
  for (int i = 0; i < SLOTS && !p; i++)
    if (!g_plants[i].e) p = &g_plants[i];
  TS_ASSERT(p != NULL); /* more than SLOTS armed engines alive at once */
  const ts_model *m = ts_engine_model(e);
  TS_ASSERT(inject->unit >= 0 && inject->unit < m->n_units && inject->tensor >= 0 &&
            inject->tensor < m->units[inject->unit].n_tensors);
  int cap = (int)(sizeof p->inject / sizeof p->inject[0]);
  p->e = e;
  p->inject[p->n < cap ? p->n++ : cap - 1] = *inject;
  p->hooks.after_backward = plant_values;
  p->hooks.release = plant_release;
  p->hooks.user = p;
  ts_engine_set_hooks(e, &p->hooks);
}
