/*
 * engine_testing.h — the engine's one test seam; not for training code.
 *
 * Production code pays one pointer test per unit backward: the hooks an
 * engine carries are NULL unless a test sets them. What tests plant
 * (non-finite gradients, for loss scaling) is written on top of the seam
 * in engine_testing.c, a test-only library (//engine:testing).
 */
#ifndef TS_ENGINE_ENGINE_TESTING_H
#define TS_ENGINE_ENGINE_TESTING_H

#include <stddef.h>

#include "base/base.h"
#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ts_engine;

typedef struct ts_engine_hooks {
  /* Runs after unit `unit`'s backward in every micro-step of optimizer step
   * `step` (1-based, skipped steps counted), with the unit's full,
   * not yet reduced gradient `grads` (the unit's padded flat length, the
   * compute dtype, on the engine's device). A status other than TS_OK
   * fails the micro-step. */
  ts_status (*after_backward)(void *user, struct ts_engine *e, int step, int unit, void *grads);
  /* Runs once when the engine carrying the hooks is freed (NULL: none). */
  void (*release)(void *user, struct ts_engine *e);
  void *user; /* passed back as is */
} ts_engine_hooks;

/* Sets (or with NULL clears) the engine's hooks; borrowed, must outlive
 * their use. */
void ts_engine_set_hooks(struct ts_engine *e, const ts_engine_hooks *hooks);
const ts_engine_hooks *ts_engine_get_hooks(const struct ts_engine *e);

/* The engine's kernel context (its device and workspace), for hooks that
 * write device memory. */
const ts_kctx *ts_engine_context(const struct ts_engine *e);

/* This rank's fp32 optimizer state of unit u (0 <= u < units, asserted):
 * which 0 = Adam m, 1 = Adam v, 2 = master weights (NULL in fp32, where the
 * compute parameters are the masters). *n receives its length in elements:
 * the padded unit P when the stage keeps it whole, this rank's shard S
 * otherwise. On the engine's device. */
const float *ts_engine_optimizer_state(const struct ts_engine *e, int u, int which, size_t *n);

/* ---- planted values (engine_testing.c, //engine:testing) ------------------ */

/* A planted gradient value: during the micro-steps of optimizer step
 * `step` (1-based, counting skipped steps), right after unit `unit`'s
 * backward, element 0 of tensor `tensor` (index in the unit's layout) of
 * this rank's unreduced gradient is overwritten with `value` (e.g. INFINITY)
 * in the compute dtype. step 0: no injection. */
typedef struct ts_engine_inject {
  int step;
  int unit;
  int tensor;
  float value;
} ts_engine_inject;

/* Arms one more planted value on this rank only (up to 4; a fifth
 * replaces the fourth), or with NULL disarms them all; unit and tensor
 * must exist (asserted). Uses the engine's hooks; at most 8 engines armed
 * at once (asserted), each released when it is freed. */
void ts_engine_inject_nonfinite(struct ts_engine *e, const ts_engine_inject *inject);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_ENGINE_TESTING_H */
