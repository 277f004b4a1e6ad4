/*
 * engine.h — the training step (DESIGN.md "One step"): forward over units,
 * loss, backward over units in reverse, global-norm clipping, AdamW.
 *
 * The engine owns every training buffer and allocates each through the
 * memory ledger: per unit one flat buffer (shard/flat.h layout) each of
 * compute params, gradients, Adam m and v, and fp32 master weights when the
 * compute dtype is not fp32; the unit inputs (B, T, C) and saved
 * activations of one micro-batch; two (B, T, C) activation-gradient buffers;
 * one workspace sized for the hungriest unit. One rank, ZeRO stage 0 (the
 * sharded stages arrive with comm/).
 *
 * Loss convention: each micro-batch's loss is the mean over its targets
 * that are not -100 (PyTorch F.cross_entropy); a step's loss is the mean of
 * its micro-batch losses, and gradients are those of that mean.
 */
#ifndef TS_ENGINE_ENGINE_H
#define TS_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "models/llama.h"
#include "shard/flat.h"
#include "shard/ledger.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_engine_opts {
  size_t micro_batch; /* B, sequences per micro-batch */
  size_t seq;         /* T, tokens per sequence */
  size_t grad_accum;  /* micro-batches per optimizer step, >= 1 */
  ts_dtype dtype;     /* compute dtype of params, activations, grads */
  uint64_t seed;      /* initialisation seed */
  float beta1;        /* AdamW beta1, e.g. 0.9 */
  float beta2;        /* AdamW beta2, e.g. 0.95 */
  float eps;          /* AdamW epsilon, e.g. 1e-8 */
  float weight_decay; /* decoupled decay of matrices (norms take none) */
  float grad_clip;    /* max global L2 norm; <= 0 disables clipping */
} ts_engine_opts;

/* Defaults: B 8, T 128, accumulation 1, fp32, seed 1337, AdamW (0.9, 0.95,
 * 1e-8), weight decay 0.1, clipping at 1.0 (nanoGPT / LLaMA settings). */
ts_engine_opts ts_engine_default_opts(void);

typedef struct ts_engine ts_engine; /* opaque; owns its buffers */

typedef struct ts_step_stats {
  double loss;      /* mean of the step's micro-batch losses, nats/token */
  double grad_norm; /* global L2 norm of the gradient before clipping */
  float lr;         /* learning rate applied */
  int step;         /* optimizer steps taken so far, 1-based */
} ts_step_stats;

/* Builds the engine for `model` (borrowed; must outlive the engine),
 * allocates everything through its ledger and initialises the parameters
 * from opts->seed. Errors: TS_ERR_INVALID_ARGUMENT (B, T or accumulation
 * zero, T > max_position_embeddings: the message names the flag and the
 * limit), TS_ERR_UNSUPPORTED (dtype other than fp32 in this build), 
 * TS_ERR_OUT_OF_MEMORY. */
ts_status ts_engine_create(ts_engine **out, const ts_llama *model, const ts_engine_opts *opts);
/* Frees every buffer (the ledger returns to zero) and the engine; NULL is a
 * no-op. */
void ts_engine_free(ts_engine *e);

/* Forward and backward of one micro-batch; gradients accumulate until
 * ts_engine_optimizer_step. inputs, targets: (B, T) int32 host arrays (they
 * may be the engine's own, ts_engine_batch). *loss receives the
 * micro-batch's mean loss (nats/token).
 * Errors: TS_ERR_INVALID_ARGUMENT (token or target out of range),
 * TS_ERR_INVALID_USAGE (more micro-batches than grad_accum). On an error
 * the gradients of the current step are discarded (zeroed), as if the step
 * had not begun. */
ts_status ts_engine_micro_step(ts_engine *e, const int32_t *inputs, const int32_t *targets,
                               double *loss);

/* After grad_accum micro-steps: global grad norm, clipping, AdamW with
 * learning rate lr, gradients zeroed. Fills *stats. TS_ERR_INVALID_USAGE if
 * the number of micro-steps since the last step is not grad_accum. */
ts_status ts_engine_optimizer_step(ts_engine *e, float lr, ts_step_stats *stats);

/* Loss of one (B, T) batch without touching gradients (forward only).
 * *loss_sum and *count: summed row losses and rows with a target. */
ts_status ts_engine_eval(ts_engine *e, const int32_t *inputs, const int32_t *targets,
                         double *loss_sum, size_t *count);

/* The engine's own (B, T) int32 input and target buffers (ledger category
 * activations). A caller that fills them and passes them back to
 * ts_engine_micro_step / ts_engine_eval saves a copy and stays inside the
 * ledger. */
void ts_engine_batch(ts_engine *e, int32_t **inputs, int32_t **targets);

/* The ledger of this rank (read-only). */
const ts_ledger *ts_engine_ledger(const ts_engine *e);

/* The flat layout of unit u, 0 <= u < n_units (asserted). */
const ts_flat_layout *ts_engine_layout(const ts_engine *e, int u);

/* Copies the tensor named `name` (Hugging Face name) into (set) or out of
 * (get) the engine as fp32 host values; numel must match the tensor.
 * set also updates the master weights. TS_ERR_INVALID_ARGUMENT names the
 * tensor when it is unknown or the size differs. get_grad reads the
 * accumulated gradient. */
ts_status ts_engine_set_tensor(ts_engine *e, const char *name, const float *src, size_t numel);
ts_status ts_engine_get_tensor(const ts_engine *e, const char *name, float *dst, size_t numel);
ts_status ts_engine_get_grad(const ts_engine *e, const char *name, float *dst, size_t numel);

/* The logits (B, T, V) of the last micro-step's forward, as fp32 host values
 * (valid until that step's backward overwrote them: only after
 * ts_engine_eval). */
ts_status ts_engine_get_logits(const ts_engine *e, float *dst, size_t numel);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_ENGINE_H */
