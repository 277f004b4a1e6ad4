/*
 * state.h — private to engine/: the engine's state (struct ts_engine, a unit's
 * state, a micro-batch's slot) and the small inline helpers every file of
 * the step uses. Each family of the step declares its functions in a
 * header of its own (passes.h, params.h, reduce.h, optimizer.h,
 * pipeline_internal.h, observe.h; tensors.c's slices.h, checkpoint.c's
 * staging.h), so that a file includes what it uses (the optimizer sees no
 * test hook and no NCCL type); engine_internal.h gathers them all for the
 * files that use most.
 *
 * The struct is the engine's identity (model, options, ZeRO policy,
 * device, ledger, kernel context, groups) and the buffers every pass uses
 * (units, slots, activation gradients, scratch), then one part per owner:
 * batch (the micro-batch's tokens), sc (the step's scalar block), optim
 * (the optimizer's progress), pipe (the pipeline stage), update
 * (optimizer.c's, per step), bw (passes.c's backward), obs (observe.c's
 * observers and watcher), run (the executor's), ckpt (checkpoints), and
 * device.c's opaque lending.
 *
 * Ownership: the engine owns every buffer below and allocates each through
 * its ledger on its device (e->device), except: the batch's host staging
 * and the slots' host targets beside a device (the ledger's CPU account),
 * the step scalars on the CPU and their host copy (plain host memory; see
 * alloc_scalars in engine.c),
 * the optimizer state and the update's staging when ts_engine_state_on_host
 * (the CPU account, page-locked) and device.c's lending (its own, opaque
 * here).
 */
#ifndef TS_ENGINE_STATE_H
#define TS_ENGINE_STATE_H

#include <string.h>

#include "engine/engine.h"
#include "engine/loss_scale.h"
#include "engine/observer.h"
#include "engine/trace.h"
#include "engine/zero.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct unit_state {
  ts_flat_layout layout; /* offsets, padding P, shard S for the N ranks */
  void *params;          /* compute dtype: (P), or (S) when the policy shards them */
  void *grads;           /* compute dtype: (P), or (S) when the policy shards them */
  float *master;         /* fp32, NULL in fp32: (P), or (S) with sharded optimizer state */
  float *m, *v;          /* fp32 Adam moments: as master */
  int recompute;         /* activation checkpointing: forward again before backward */
  void *full_params;     /* sharded params: (P) gathered while uses > 0, else NULL */
  int uses;              /* sharded params: holders of full_params */
  int kept;              /* opts.keep_gathered: 1 while the step holds full_params (one
                            of uses) from the unit's first forward to its last backward */
  void *full_grads;      /* sharded grads: (P) from the unit's (or a borrower's)
                            backward to its reduce-scatter, else NULL */
  /* opts.overlap: */
  int holds;                      /* uses taken ahead (a prefetch, the last unit kept for its
                                     backward), each handed to a later acquire */
  ts_comm_request *gather_req;    /* all-gather in flight into full_params (stage 3) or of
                                     updated params (the optimizer, stages 1/2), else NULL */
  ts_comm_request *reduce_req;    /* reduce-scatter of the gradient in flight, else NULL */
  ts_comm_request *reduce_ag_req; /* stage 0: the all-gather of the reduced gradient after
                                     it, else NULL */
} unit_state;

/* The activations of one micro-batch in flight on one model chunk
 * (pipeline schedules hold several; without pipelining there is one).
 * Chunk c owns slots [pipe.slot0[c], + pipe.nslot[c]); micro-batch mb
 * uses the one at mb % nslot[c]: a chunk's forwards and backwards run in
 * micro-batch order, so the ones in flight at once are consecutive, never
 * more than nslot[c] (ts_schedule_in_flight_chunk). */
typedef struct act_slot {
  int chunk;        /* the model chunk it serves (0 but for interleaved) */
  void **acts;      /* [n_units] input (B, T, C) of unit u, for the units this chunk
                       computes (u > 0) and the next chunk's first unit (its output) */
  void **saved;     /* [n_units] the saved bytes of unit u; NULL when recomputed (the
                       engine's recompute_saved serves) or not on this stage */
  int32_t *tokens;  /* (B, T) the micro-batch's inputs */
  int32_t *targets; /* (B, T) its targets, -100 = ignore */
  int32_t *host_targets; /* (B, T) the same in host memory for the model's last unit
                            (ts_unit_args.host_targets): targets itself on the CPU; beside a
                            device, a copy (the ledger's CPU account) in the slots of the
                            chunk that holds that unit, NULL in the others */
  void *gsend;      /* (B, T, C) gradient of the chunk's input, sent to the virtual
                       stage before it (all but the model's first), else NULL */
  float dloss;      /* d(scaled step loss)/d(row loss) of this micro-batch */
  ts_k_wgrad **wgrad; /* [n_units] with a split backward (ZB-H1), the deferred W of each
                         unit of the chunk that splits (ts_unit_splits_backward), from its
                         B to its WEIGHT_UNIT; else NULL */
  ts_comm_request *act_req;  /* pending send of its output (acts[the chunk's end]), or NULL */
  ts_comm_request *grad_req; /* pending send of gsend, or NULL */
} act_slot;

struct ts_engine {
  const ts_model *model;      /* borrowed from the creator */
  ts_engine_opts opts;        /* as given */
  const ts_zero_policy *zero; /* the stage's policy (zero.h) */
  ts_device device;      /* where every training buffer lives */
  ts_ledger ledger;      /* every buffer below, per device */
  ts_kctx ctx;           /* the device's context, with the workspace */
  ts_comm *dp;           /* data-parallel group (borrowed or own_comm) */
  ts_comm *own_comm;     /* the one-rank group made when none was given */
  int rank, dp_size;     /* this rank r and N, of the data-parallel group (hybrid sharding:
                            of the shard group, S ranks) */
  ts_comm *rep;          /* hybrid sharding: the replica group (this shard's N/S copies, one per
                            shard group, in group order), else NULL */
  ts_comm *own_shard, *own_rep; /* hybrid sharding: the two groups cut from the dp group given */
  int replicas, rep_rank;       /* N/S and this rank's shard group (1 and 0 without hybrid) */
  size_t es;             /* bytes per compute element */
  void *scratch;         /* reduce-scatter scratch, (N-1) * max S elements */
  size_t scratch_bytes;  /* its size, bytes */
  unit_state *units;     /* [n_units]; those of other pipeline stages stay zeroed, but
                            for a tied head's lender (its params alone: the replica) */
  act_slot *slots;       /* [n_slots] micro-batches in flight, chunk by chunk */
  int n_slots;           /* 1 without pipelining */
  struct {               /* the micro-batch's tokens (passes.c loads them; engine.c's buffers) */
    int32_t *tokens;       /* (B, T) slot 0's inputs (the micro-step's batch) */
    int32_t *targets;      /* (B, T) slot 0's targets */
    int32_t *host_tokens;  /* (B, T) the host's batch (ts_engine_batch): tokens itself on the
                              CPU, host staging for a device */
    int32_t *host_targets; /* (B, T) likewise */
    int32_t *staging;      /* beside a device: (2, B, T) page-locked host copy of a
                              micro-batch's tokens then targets, read by an asynchronous copy;
                              else NULL */
  } batch;
  struct ts_engine_lending *lending; /* device.c's: the memory lent to dp, pp and rep
                                        (ts_engine_lend_memory), NULL while none is */
  struct ts_offload *offload; /* opts.offload_dir: offload.c's (the optimizer state in a scratch
                                 file), else NULL */
  const struct ts_offload_store *offload_store; /* where its bytes go: NULL, the file; the plan
                                                   device's none (plan.c) */
  ts_device_report report; /* beside a device: its name, total and used_at_create */
  void *dbuf[2];         /* (B, T, C) activation gradients, ping-pong */
  ts_k_wgrad_mem wmem;   /* the W stores' memory (slots' wgrad): ledger transients
                            (activations), the workspace and recompute buffer volatile */
  void *recompute_saved; /* saved activations of the recomputed unit in use */
  struct { /* the step's scalars on the device, read once per step as one block (the
              passes write loss, reduce.c reads it back and sums over the grid) */
    double *block;         /* the block: loss then sumsq then eval_loss */
    double *loss;          /* (grad_accum, 2): each micro-batch's (loss sum, rows) */
    double *sumsq;         /* (n_units): squared norm of each unit's gradient shard */
    double *eval_loss;     /* (2): the evaluation's (loss sum, rows) */
    int32_t *nonfinite;    /* (n_units, TS_UNIT_MAX_TENSORS): overflow search flags */
    size_t bytes;          /* bytes of the block */
    double *host;          /* host copy of the block (what the step reads back) */
    double *part;          /* (1 + n_units) host: the step's loss sum and per-unit squared
                              norms, summed over the pipeline's stages */
    double reduced[2];     /* the REDUCE action's sums over the grid: the step's loss (each
                              micro-batch's mean, summed) and the gradients' sum of squares */
  } sc;
  struct {                 /* the optimizer's progress (optimizer.c; saved in checkpoints) */
    int step;              /* optimizer updates applied (AdamW's t) */
    int attempts;          /* optimizer steps finished, skipped ones included */
    ts_loss_scaler scaler; /* fp16 loss scaling (scale 1 otherwise) */
  } optim;
  struct { /* pipeline stages (pipeline.c; without pipelining P = 1, stage 0, all units) */
    int stages, stage;     /* P and this rank's pipeline stage s */
    int chunks;            /* v model chunks (1 but for interleaved and ZB-V) */
    int head_stage;        /* the stage computing the model's last unit (P - 1; ZB-V: 0) */
    int c_begin[TS_ENGINE_MAX_CHUNKS]; /* chunk c's units [c_begin[c], c_end[c]): virtual */
    int c_end[TS_ENGINE_MAX_CHUNKS];   /* stage c P + s, in model order */
    int slot0[TS_ENGINE_MAX_CHUNKS];   /* chunk c's first slot */
    int nslot[TS_ENGINE_MAX_CHUNKS];   /* and its count (ts_schedule_in_flight_chunk) */
    ts_comm *pp;           /* the pipeline group of this dp rank (borrowed or own_pp), NULL
                              when P = 1 */
    ts_comm *own_pp;       /* a plan's own pipeline group (ts_comm_plan), else NULL */
    int lender;            /* the unit a tied head borrows from (its tied_unit), or -1 */
    int replica;           /* 1: units[lender] holds only the tied head's copy of the
                              lender's parameters (the last stage, P > 1) */
    void *tied_grads;      /* tied head: its gradient of the borrowed tensor, summed over the
                              step's micro-batches, (P) of the lender's layout, compute dtype;
                              a transient (grads) from the first head backward to the fold */
    ts_comm_request *tied_req; /* pending send of tied_grads to stage 0, or NULL */
    ts_schedule sched;     /* the step's schedule (P > 1), built once */
    ts_stage_schedule program; /* this stage's list as the executor runs it: sched's, lowered
                                  (step.c) at the first step; owned */
  } pipe;
  struct {                 /* the step's update (optimizer.c), set by OPTIMIZER */
    int skipped;           /* 1: the step is skipped (its units' actions do nothing) */
    ts_status st;          /* the first error of a unit's action, returned by OPTIMIZER_END */
    float scale;           /* each gradient's factor: clip / loss scale */
    double norm;           /* the global gradient norm, unscaled */
    void *host_grad;       /* ts_engine_state_on_host: (stage_n) a gradient piece, host
                              (page-locked beside a GPU), compute dtype; else NULL */
    void *host_param;      /* (stage_n) a parameter piece, host, compute dtype */
    size_t stage_n;        /* elements of each */
  } update;
  struct {                 /* the backward of the micro-batch in progress (passes.c) */
    const void *din;       /* the gradient of the current unit's output */
    int cur;               /* dbuf index its input gradient goes to */
  } bw;
  struct {                 /* what watches the step (observe.c's) */
    ts_trace *trace;                 /* train --trace: spans (borrowed); NULL: none */
    ts_step_observer trace_observer; /* the trace's observer, registered while trace is set */
    const ts_step_observer *list[TS_ENGINE_MAX_OBSERVERS]; /* (n), borrowed */
    int n;
    ts_comm_watcher watcher; /* on dp, rep, pp while an observer watches calls */
    int watching;            /* 1 while it is on them */
    int64_t calls_told;      /* the calls told to observers since it was put on */
  } obs;
  int comm_thread;              /* 1: dp has a communication thread this engine started */
  int rs_pending;               /* opts.overlap, stages 2/3: the unit whose reduce-scatter is
                                   in flight (its full_grads kept until it ends), else -1 */
  int hold_last;                /* opts.overlap: the action after this forward is the same
                                   micro-batch's backward (keep the last unit gathered) */
  struct {                      /* the executor's (step.c) */
    int in_step;                /* 1 while ts_engine_step runs its list */
    int mb;                     /* the micro-batch of the action running (its index in the
                                   step) */
    int in_micro_batch;         /* 1 while an action of micro-batch mb runs (spans and the
                                   watchdog name it; a forward that keeps gathered units) */
  } run;
  struct {                      /* checkpoints (checkpoint.c's) */
    void *staging;              /* opts.async_save: this rank's checkpoint file bytes (host,
                                   staging), the copy an asynchronous save writes; else NULL */
    size_t staging_bytes;       /* its size, bytes */
    struct ts_checkpoint_pending *pending; /* the asynchronous save in flight, else NULL */
    double staging_wait;        /* seconds state changes waited for its copies, summed */
  } ckpt;
};

/* Whether the optimizer state (master, m, v, or an offload's slots) is
 * host memory apart from the device's (opts.offload_optimizer, or
 * offload_dir beside a GPU): page-locked, copied into and out of as host
 * memory, and each unit's AdamW runs on host copies of its gradient and
 * parameters (tensors.c ts_engine_adamw_part). On the CPU device
 * offload_optimizer takes the same path, a twin of the GPU's for tests
 * (kernels.h ts_k_check_host_blocks tells the two memories apart there). */
static inline int ts_engine_state_on_host(const ts_engine *e) {
  return e->opts.offload_optimizer || (e->opts.offload_dir && e->device != TS_DEVICE_CPU);
}

/* Whether this rank's parameter shards are host memory apart from the
 * device's (opts.offload_params, ZeRO-3): a gather copies the shard to the
 * device first (params.c), the update writes it on the host, tensors are
 * staged on the host. On the CPU a twin, as ts_engine_state_on_host. */
static inline int ts_engine_params_on_host(const ts_engine *e) { return e->opts.offload_params; }

/* The host's kernel context: a CPU context without workspace or stream,
 * with e->ctx's flags (a plan's runs nothing) and TS_K_HOST_SIDE (its
 * pointers are host memory). Runs AdamW on state in host memory. */
static inline ts_kctx ts_engine_host_ctx(const ts_engine *e) {
  ts_kctx c;
  memset(&c, 0, sizeof c);
  c.device = TS_DEVICE_CPU;
  c.flags = e->ctx.flags | TS_K_HOST_SIDE;
  return c;
}

/* The chunk of this rank's stage that computes unit u, or -1. */
static inline int ts_engine_chunk_of(const ts_engine *e, int u) {
  for (int c = 0; c < e->pipe.chunks; c++)
    if (u >= e->pipe.c_begin[c] && u < e->pipe.c_end[c]) return c;
  return -1;
}

/* Whether unit u is computed by this rank's stage. */
static inline int ts_engine_owns(const ts_engine *e, int u) {
  return ts_engine_chunk_of(e, u) >= 0;
}

/* The units this rank computes, in model order: for (int u =
 * ts_engine_first_unit(e); u >= 0; u = ts_engine_next_unit(e, u)). */
static inline int ts_engine_first_unit(const ts_engine *e) { return e->pipe.c_begin[0]; }
static inline int ts_engine_next_unit(const ts_engine *e, int u) {
  int c = ts_engine_chunk_of(e, u);
  if (u + 1 < e->pipe.c_end[c]) return u + 1;
  return c + 1 < e->pipe.chunks ? e->pipe.c_begin[c + 1] : -1;
}
/* The same in reverse model order, from ts_engine_last_unit. */
static inline int ts_engine_last_unit(const ts_engine *e) {
  return e->pipe.c_end[e->pipe.chunks - 1] - 1;
}
static inline int ts_engine_prev_unit(const ts_engine *e, int u) {
  int c = ts_engine_chunk_of(e, u);
  if (u > e->pipe.c_begin[c]) return u - 1;
  return c > 0 ? e->pipe.c_end[c - 1] - 1 : -1;
}
#define TS_ENGINE_FOR_UNITS(e, u) \
  for (int u = ts_engine_first_unit(e); u >= 0; u = ts_engine_next_unit(e, u))

/* The mean loss of a (sum, rows) pair: 0 when no row has a target. */
static inline double ts_engine_mean_loss(const double *pair) {
  return pair[1] > 0 ? pair[0] / pair[1] : 0.0;
}

/* The virtual stage of this rank's chunk c, and the chunk of virtual
 * stage j on whichever rank (schedule.h's placement of the step's
 * schedule). */
static inline int ts_engine_vstage(const ts_engine *e, int c) {
  return ts_schedule_vstage(e->pipe.sched.kind, e->pipe.stages, e->pipe.stage, c);
}
static inline int ts_engine_chunk_of_vstage(const ts_engine *e, int j) {
  return ts_schedule_chunk_of(e->pipe.sched.kind, e->pipe.stages, j);
}

/* Slot of micro-batch mb on chunk c. */
static inline act_slot *ts_engine_slot(ts_engine *e, int mb, int c) {
  return &e->slots[e->pipe.slot0[c] + mb % e->pipe.nslot[c]];
}

/* Message tags on the pipeline group: kind + TS_TAG_KINDS (chunk + v
 * micro-batch), v = 1 but for the interleaved schedule (the sender's
 * chunk). */
enum { TS_TAG_ACT = 0, TS_TAG_GRAD, TS_TAG_TIED, TS_TAG_PARAMS, TS_TAG_EVAL, TS_TAG_KINDS };
static inline int ts_engine_tag(int kind, int mb) { return kind + TS_TAG_KINDS * mb; }
static inline int ts_engine_chunk_tag(const ts_engine *e, int kind, int mb, int chunk) {
  return kind + TS_TAG_KINDS * (chunk + e->pipe.chunks * mb);
}

/* Elements of one (B, T, C) activation. */
static inline size_t ts_engine_btc(const ts_engine *e) {
  return e->opts.micro_batch * e->opts.seq * e->model->hidden_size;
}

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_STATE_H */
