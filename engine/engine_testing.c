/* engine_testing.c — planted gradient values on the engine's test seam
 * (engine_testing.h); linked into tests only (//engine:testing). */
#include "engine/engine_testing.h"

#include <string.h>

#include "engine/engine.h"

/* One engine's planted values. */
typedef struct plant {
  struct ts_engine *e;        /* the engine (NULL: a free slot) */
  ts_engine_inject inject[4]; /* armed values */
  int n;                      /* how many are armed */
} plant;

enum { SLOTS = 8 };
static plant g_plants[SLOTS];

/* The slot of engine e, or NULL. */
static plant *slot_of(const struct ts_engine *e) {
  for (int i = 0; i < SLOTS; i++)
    if (g_plants[i].e == e) return &g_plants[i];
  return NULL;
}

/* after_backward: writes every value armed on e for (step, unit), as a
 * host fp32 value cast on the engine's device through its workspace. */
static ts_status plant_values(void *user, struct ts_engine *e, int step, int unit, void *grads) {
  const plant *p = slot_of(e);
  if (!p) return TS_OK;
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

static void plant_release(void *user, struct ts_engine *e);

/* The hooks while any engine is armed. */
static const ts_engine_hooks g_hooks = {.after_backward = plant_values, .release = plant_release};

/* Disarms engine e (a no-op when it is not armed); the last one disarmed
 * clears the process's hooks. */
static void disarm(const struct ts_engine *e) {
  plant *p = slot_of(e);
  if (!p) return;
  memset(p, 0, sizeof *p);
  if (ts_engine_get_hooks() != &g_hooks) return; /* another test's hooks */
  for (int i = 0; i < SLOTS; i++)
    if (g_plants[i].e) return;
  ts_engine_set_hooks(NULL);
}

/* release: the engine is gone, so are its planted values. */
static void plant_release(void *user, struct ts_engine *e) { disarm(e); }

void ts_engine_inject_nonfinite(struct ts_engine *e, const ts_engine_inject *inject) {
  if (!inject) {
    disarm(e);
    return;
  }
  plant *p = slot_of(e);
  if (!p) p = slot_of(NULL);
  TS_ASSERT(p != NULL); /* more than SLOTS armed engines alive at once */
  const ts_model *m = ts_engine_model(e);
  TS_ASSERT(inject->unit >= 0 && inject->unit < m->n_units && inject->tensor >= 0 &&
            inject->tensor < m->units[inject->unit].n_tensors);
  int cap = (int)(sizeof p->inject / sizeof p->inject[0]);
  p->e = e;
  p->inject[p->n < cap ? p->n++ : cap - 1] = *inject;
  ts_engine_set_hooks(&g_hooks);
}
