/*
 * engine_testing.h — test hooks of the engine; not for training code.
 */
#ifndef TS_ENGINE_ENGINE_TESTING_H
#define TS_ENGINE_ENGINE_TESTING_H

#ifdef __cplusplus
extern "C" {
#endif

struct ts_engine;

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
 * must exist (asserted). */
void ts_engine_inject_nonfinite(struct ts_engine *e, const ts_engine_inject *inject);

/* This rank's fp32 optimizer state of unit u (0 <= u < units, asserted):
 * which 0 = Adam m, 1 = Adam v, 2 = master weights (NULL in fp32, where the
 * compute parameters are the masters). *n receives its length in elements:
 * the padded unit P in stage 0, this rank's shard S otherwise. */
const float *ts_engine_optimizer_state(const struct ts_engine *e, int u, int which, size_t *n);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_ENGINE_TESTING_H */
