/*
 * engine_internal.h — private to engine/: the engine's state (state.h) and
 * every family's functions (their own headers, gathered here for the files
 * that use most of them), by concept:
 *   engine.c   create, free, accessors
 *   observe.c  the observers and what the step tells them (actions, spans,
 *              timed waits; the trace is one), the waits for collectives
 *   step.c     the executor: this rank's list of the step's actions, one
 *              place per action kind (nothing calls back into it)
 *   passes.c   FORWARD and BACKWARD: a micro-batch's load, forward and
 *              backward over the units, the tied head's gradient fold
 *   params.c   the full parameters of a unit: stage 3's gathers, their
 *              prefetch and holds
 *   reduce.c   the gradients' buffers and reduce-scatters, and REDUCE: the
 *              step's reductions and the global norm's sums
 *   optimizer.c  OPTIMIZER: skip, or clip, AdamW, all-gather the update
 *   pipeline.c SEND_* and RECV_*: the stage's geometry and schedule, create
 *              on a grid, the sends and receives of activations, their
 *              gradients, the tied embedding and its replica
 *   device.c   the engine beside a GPU: its preparation at create, the
 *              card's memory report
 *   zero.c     the ZeRO stage as a policy table (zero.h)
 *   loss_scale.c  the fp16 loss scaler (loss_scale.h)
 *   tensors.c  the slice iterator over (tensor, this rank's part), AdamW
 *              per unit, get/set tensor, the overflow search
 *   plan.c     the memory plan (create and one step on the plan device),
 *              the activation prediction and the units' costs
 *   checkpoint.c, checkpoint_load.c  checkpoints (checkpoint.h): each rank's
 *              slices out, any layout's parts back in
 *   eval.c     evaluation (one stage or a pipeline): a batch's loss, a
 *              masked LM's accuracy
 *
 * The step's files include state.h and the families they call, not this.
 */
#ifndef TS_ENGINE_ENGINE_INTERNAL_H
#define TS_ENGINE_ENGINE_INTERNAL_H

#include "engine/observe.h"
#include "engine/offload.h"
#include "engine/optimizer.h"
#include "engine/params.h"
#include "engine/passes.h"
#include "engine/pipeline_internal.h"
#include "engine/reduce.h"
#include "engine/slices.h"
#include "engine/staging.h"
#include "engine/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- engine.c: create, free ------------------------------------------------------- */

/* A new engine for model and opts (every option checked, the loss scaler
 * set up) with an empty ledger and nothing allocated yet; *out is NULL on
 * any error. */
ts_status ts_engine_new(const ts_model *model, const ts_engine_opts *opts, ts_engine **out);

/* Allocates every buffer through the ledger and initialises the
 * parameters (on the plan device: charges only). */
ts_status ts_engine_alloc(ts_engine *e);

/* ts_engine_create's body for pipeline stage `stage` (0 without
 * pipelining; pp NULL then), both groups borrowed. */
ts_status ts_engine_create_stage(ts_engine **out, const ts_model *model, const ts_engine_opts *opts,
                                 ts_comm *dp, ts_comm *pp, int stage);

/* Where a unit's optimizer state lives (ts_engine_alloc_model_state). */
typedef enum ts_state_place {
  TS_STATE_ON_DEVICE = 0, /* beside the parameters, on dev */
  TS_STATE_ON_HOST = 1,   /* host memory (the ledger's CPU account): opts.offload_optimizer */
  TS_STATE_IN_FILE = 2,   /* offload.c's file (opts.offload_dir): nothing allocated here */
} ts_state_place;

/* The model state of one flat buffer of layout l under policy z in dt
 * (zero.h's table): s->params (params_on_host: in host memory, the CPU
 * account), grads on dev, and where `place` says master (NULL in fp32),
 * m, v. */
ts_status ts_engine_alloc_model_state(ts_ledger *ledger, ts_device dev, const ts_flat_layout *l,
                                      const ts_zero_policy *z, ts_dtype dt, ts_state_place place,
                                      int params_on_host, unit_state *s);
/* Frees what ts_engine_alloc_model_state allocated (NULLs are fine). */
void ts_engine_free_model_state(ts_ledger *ledger, unit_state *s);

/* ---- eval.c ------------------------------------------------------------------------ */

/* After an evaluation forward of slot 0 on the last stage: *correct = the
 * rows of the (B, T) host targets, -100 skipped, whose logits' first
 * maximum is the target (the logits are read on the host: a copy from a
 * device). */
ts_status ts_engine_count_correct(ts_engine *e, const int32_t *targets, double *correct);

/* ---- device.c ---------------------------------------------------------------------- */

/* Beside a GPU, before anything is allocated (ts_engine_lend_memory has
 * lent comm the device's memory): sets the kernels' flags, refuses a run the card cannot hold (the
 * plan's other blocks at their peak plus every reserved transient), naming each category, and
 * reserves the step's transients. */
ts_status ts_engine_prepare_device(ts_engine *e);

/* Lends the engine's memory to its groups (comm.h ts_comm_set_memory):
 * beside a device, dp always (its collectives run on device buffers); on
 * the staged transport, dp with two or more ranks and pp, each with host
 * staging of ts_comm_staging_bytes(N, comm_chunk_bytes) charged to the
 * ledger's CPU account (category comm) and page-locked; on nccl, dp on
 * NCCL (with the communication stream's context, comm_ctx) and pp staged.
 * Hybrid sharding's replica group (rep) is lent as pp is, staged on every
 * transport: beside a device, and on the CPU's staged transport. Before
 * ts_engine_alloc, in create and in the plan alike. */
ts_status ts_engine_lend_memory(ts_engine *e);
/* 1 when dp of dp_size ranks goes on NCCL under opts: nccl resolved on a
 * GPU, with two ranks or more, or one when `comm` names nccl (the one-rank
 * NCCL path; auto keeps one rank local). */
int ts_engine_dp_on_nccl(const ts_engine_opts *opts, int dp_size);
/* Undoes ts_engine_lend_memory (groups back to host memory, staging
 * freed); a no-op for what was not lent. */
void ts_engine_unlend_memory(ts_engine *e);
/* 1 while dp holds the engine's memory (its set-up was collective). */
int ts_engine_dp_lent(const ts_engine *e);
/* Waits for the communication stream (NCCL's), if any. */
void ts_engine_lending_sync(ts_engine *e);

/* ---- plan.c ------------------------------------------------------------------------ */

/* An engine on the plan device (plan ledger, TS_K_PLAN context, plan
 * groups: nothing allocated, computed or sent) after create and one step:
 * ts_engine_plan's, kept for its ledger (the account and the transients'
 * profile). Free with ts_engine_free. */
/* The plan's engine (ts_engine_plan_engine) before its step: world rank
 * stage x dp_size's, its groups' link classes for ranks_per_node
 * consecutive world ranks per node (0: one node). Errors as
 * ts_engine_plan_stage. */
ts_status ts_engine_plan_build(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                               int stage, int ranks_per_node, ts_engine **out);
/* The plan's batch source (ts_engine_batch_fn): nothing to read. */
ts_status ts_engine_plan_batch(void *user, int mb, int32_t *inputs, int32_t *targets);

ts_status ts_engine_plan_engine(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                                int stage, ts_engine **out);

/* The recompute buffer's bytes: the largest saved bytes of a recomputed
 * unit among units [begin, end) (0 when none is). */
size_t ts_engine_recompute_bytes(const ts_model *m, const ts_engine_opts *o, int begin, int end);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_ENGINE_INTERNAL_H */
