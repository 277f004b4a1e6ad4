/*
 * engine_testing.h — the one test seam of engine/ (the step, checkpoint
 * saves, the training loop); not for training code.
 *
 * Every fault and planted value a test needs reaches the code through the
 * process's hooks below, NULL unless a test sets them: production code pays
 * one pointer test where a hook may run (after each unit's backward,
 * before each commit of a checkpoint save, before each chunk of an
 * asynchronous save's copy and when the optimizer step waits for it, after
 * each training step, when an engine is freed, before each offload job). What tests plant (non-finite gradients, for loss
 * scaling) is written on top of the seam in engine_testing.c, a test-only
 * library (//engine:testing); the kill-a-rank hook of the launcher's
 * restart tests is set by the test binary //tools:tessera_testing. One set
 * of hooks per process: setting them replaces the previous set.
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

/* The hooks; each may be NULL. */
typedef struct ts_engine_hooks {
  /* Runs after unit `unit`'s backward in every micro-step of optimizer step
   * `step` (1-based, skipped steps counted) of engine e, with the unit's
   * full, not yet reduced gradient `grads` (the unit's padded flat length,
   * the compute dtype, on the engine's device). A status other than TS_OK
   * fails the micro-step. */
  ts_status (*after_backward)(void *user, struct ts_engine *e, int step, int unit, void *grads);
  /* Runs in ts_checkpoint_save on each rank before every point a crash
   * could hit: after each chunk written, before each file's commit, before
   * each extra file and before the index's commit. */
  void (*save_point)(void *user);
  /* Runs in ts_train_run after training step `step` (1-based) and its
   * save, on world rank `rank`. */
  void (*after_step)(void *user, size_t step, int rank);
  /* Runs when engine e is freed. */
  void (*release)(void *user, struct ts_engine *e);
  /* Runs before each chunk an asynchronous save copies to its staging (on
   * the CPU in the save's writer thread, while training goes on). */
  void (*stage_point)(void *user);
  /* Runs when the optimizer step finds an asynchronous save's copy to the
   * staging unfinished (on the CPU), on the training thread, just before it
   * waits for the copy (no lock held): a test that holds the copy at
   * stage_point lets it go from here, so the step is known to wait. */
  void (*staging_wait)(void *user);
  /* Runs in an offload's I/O thread (offload.h) before each job: the read
   * (write 0) or write-back (1) of unit `unit`'s optimizer state, the job's
   * number `job` (0, 1, ... per engine). A nonzero errno fails the job
   * with it, as if the disk had (EIO, ENOSPC). */
  int (*offload_io)(void *user, int write, int unit, long long job);
  void *user; /* passed back as is */
  /* Runs in ts_checkpoint_load on each rank before each tensor it reads: a
   * crash during a resume's read (issue 45). */
  void (*load_point)(void *user);
} ts_engine_hooks;

/* Sets the process's hooks (NULL clears them: training); borrowed, they
 * must outlive their use. */
void ts_engine_set_hooks(const ts_engine_hooks *hooks);
/* The process's hooks, NULL in training. */
const ts_engine_hooks *ts_engine_get_hooks(void);

/* The engine's kernel context (its device and workspace), for hooks that
 * write device memory. */
const ts_kctx *ts_engine_context(const struct ts_engine *e);

/* This rank's fp32 optimizer state of unit u (0 <= u < units, asserted):
 * which 0 = Adam m, 1 = Adam v, 2 = master weights (NULL in fp32, where the
 * compute parameters are the masters). *n receives its length in elements:
 * the padded unit P when the stage keeps it whole, this rank's shard S
 * otherwise. On the engine's device; in host memory with opts.offload_optimizer
 * beside a GPU; with opts.offload_dir a host copy (valid until the next
 * call). */
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

/* Arms one more planted value on engine e of this rank only (up to 4; a
 * fifth replaces the fourth), or with NULL disarms e's; unit and tensor
 * must exist (asserted). Sets the process's hooks while any engine is
 * armed (replacing others); at most 8 engines armed at once (asserted),
 * each disarmed when it is freed. */
void ts_engine_inject_nonfinite(struct ts_engine *e, const ts_engine_inject *inject);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_ENGINE_TESTING_H */
