/*
 * engine.h — the training step (DESIGN.md "One step"): forward over units,
 * loss, backward over units in reverse, gradient reduction across the
 * data-parallel group, global-norm clipping, AdamW — at ZeRO stage 0 (DDP),
 * 1, 2 or 3 (DESIGN.md "Flat parameters and shards").
 *
 * The engine owns every training buffer and allocates each through the
 * memory ledger. Per unit, with padded flat length P (shard/flat.h, padded
 * to a multiple of N * 16 for N data-parallel ranks) and shard S = P / N:
 *
 *   stage | compute params      | gradients            | fp32 master, Adam m, v
 *   0     | P                   | P                    | P
 *   1     | P                   | P                    | S
 *   2     | P                   | S (+ P per unit in backward) | S
 *   3     | S (+ P while in use)| S (+ P per unit in backward) | S
 *
 * In fp32 the master weights are the compute parameters (stage 0, 3) or
 * their own slice (stages 1, 2): no separate copy. In bf16 and fp16 the
 * compute parameters and gradients take 2 bytes and the fp32 master
 * weights are a category of their own, so model state per rank is the
 * ZeRO paper's (§5, K = 12): stage 0 16P, stage 1 4P + 12S, stage 2
 * 2P + 14S, stage 3 16S (P, S summed over units). Initialisation fills
 * one unit at a time in fp32 in a transient buffer charged to the
 * workspace category before the kernel workspace is allocated. The transient full
 * buffers of stages 2-3 are charged to the params/grads categories while
 * they live, so the ledger's peak shows them. Tied embeddings: the head's
 * backward adds its gradient of the borrowed tensor into T, a full buffer
 * of the embedding's layout (category grads) that sums the step's
 * micro-batches and is added into the embedding's gradient once, just
 * before the embedding's backward of the last micro-batch (with sharded
 * gradients T becomes that micro-batch's full gradient). With one
 * micro-batch and unsharded gradients the head adds into the embedding's
 * gradient directly (the same bits: it is zero then). So T lives from the
 * head's first backward to the embedding's last, beside the full gradient
 * of each block in turn; in stage 3 the head holds its own gathered
 * parameters and the embedding's at once. This order is the pipeline's
 * (the head on the last stage sends T to the first once per step), so
 * pipelined and plain runs give the same bits. Besides model state: the unit
 * inputs (B, T, C) and saved activations of one micro-batch (a
 * recomputed unit keeps none: one recompute buffer of the largest
 * recomputed unit's saved bytes serves them all;
 * ts_engine_activation_bytes), two (B, T, C)
 * activation-gradient buffers, one workspace sized for the hungriest unit,
 * and one reduce-scatter scratch buffer ((N-1) * S of the largest unit,
 * category comm).
 *
 * Gradient reduction (determinism contract): every stage reduces with the
 * same primitive, a reduce-scatter per unit over the same layout (comm/
 * sums in rank order), so at a fixed data-parallel size and gradient
 * accumulation 1
 * all four stages produce bitwise-identical parameters. Stage 0 follows it
 * with an all-gather of the gradients (all-reduce), stage 1 with an
 * all-gather of the updated parameters; stage 2 reduce-scatters each unit
 * as its backward ends and stage 3 also gathers each unit's parameters
 * before its forward and before its backward. With accumulation K > 1,
 * stages 2-3 reduce-scatter every micro-batch (K times the traffic) and add
 * into the shard, so their sums are ordered differently from stages 0-1.
 * Tied embeddings in stage 3: the head gathers the embedding weight again
 * for its forward and its backward. A recomputed unit's forward runs again
 * inside its backward's gather: one all-gather serves both. Recompute is
 * the same forward on the same input and parameters, so gradients are
 * bitwise those without activation checkpointing.
 *
 * Mixed precision: casts round to nearest even; kernels read bf16/fp16 and
 * accumulate in fp32; reduce-scatter sums half-precision gradients in fp32
 * (comm/); AdamW updates the fp32 master shard and writes the compute copy
 * (ts_k_adamw). fp16 multiplies the loss by the loss scale before backward
 * and divides the gradients by it inside the norm and AdamW.
 *
 * Loss convention: each micro-batch's loss is the mean over its targets
 * that are not -100 (PyTorch F.cross_entropy); a step's loss is the mean of
 * the micro-batch losses of all ranks and accumulation steps, and gradients
 * are those of that mean (each rank scales its loss gradient by 1/(N K)).
 *
 * Pipeline stages (ts_engine_create_pipeline, DESIGN.md "Pipeline
 * stages"): a rank computes the units of its stage only and holds their
 * model state as above within its stage's dp group; the activations of
 * the micro-batches in flight (ts_schedule_in_flight: GPipe m, 1F1B
 * min(P - s, m)) each have a slot: the units' inputs and saved bytes, the
 * stage's output (sent to stage s + 1) and the gradient of its input (sent
 * to s - 1), the batch. Gradients of the m micro-batches are reduced as
 * without pipelining: stages 0-1 once after the last backward, stages 2-3
 * per unit as each micro-batch's backward of it ends.
 *
 * Collectives: with N > 1 ranks, ts_engine_step, ts_engine_eval and
 * (stage 3) ts_engine_get_tensor are collective over the data-parallel group: every rank calls them in the
 * same order. ts_engine_create is local.
 *
 * Devices: every training buffer lives on opts->device and every op runs
 * there through kernels/kernels.h. Inside a step the engine writes the
 * device once per micro-batch (its tokens and targets) and reads it once,
 * at the step's REDUCE action (the micro-batches' losses and the units'
 * squared norms, one block); a skipped fp16 step reads its overflow flags
 * too. The batch goes up by an
 * asynchronous copy from page-locked staging, its tokens and targets
 * checked on the host first. Host memory beside a device: the batch
 * (ts_engine_batch), its staging, and the scalars' host copy. The
 * files of engine/ split it by concept (engine_internal.h).
 */
#ifndef TS_ENGINE_ENGINE_H
#define TS_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "engine/grid.h"
#include "engine/schedule.h"
#include "kernels/kernels.h"
#include "models/model.h"
#include "shard/flat.h"
#include "shard/ledger.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ts_engine_opts.comm: the transport of the engine's groups. */
typedef enum ts_engine_comm_kind {
  TS_ENGINE_COMM_AUTO = 0,   /* mpi on the CPU; on GPUs nccl, or staged where ranks share one */
  TS_ENGINE_COMM_MPI = 1,    /* MPI on the buffers (host memory) */
  TS_ENGINE_COMM_STAGED = 2, /* through page-locked host staging (comm/staged.c) */
  TS_ENGINE_COMM_NCCL = 3,   /* NCCL on a communication stream, one GPU per rank (comm/nccl.h) */
} ts_engine_comm_kind;

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
  int zero_stage;     /* ZeRO stage 0 (DDP), 1, 2 or 3 */
  /* Hybrid sharding (PyTorch FSDP2's HSDP, ZeRO++'s hpZ; DESIGN.md "Several
   * nodes"): 0 shards over the whole data-parallel group of N ranks (plain
   * ZeRO). S >= 1 dividing N: the stage shards within groups of S
   * consecutive data-parallel ranks (a node) and replicates across the N/S
   * groups; gradients are reduce-scattered within the group, then each
   * shard is all-reduced across the groups (once per step, before the
   * norm); parameters are all-gathered within the group only. S = N is
   * plain ZeRO. Per-rank model states follow the ZeRO formulas with N = S.
   * Beside a GPU the replicas' all-reduce is staged through host copies of
   * its own on every `comm` (engine/device.c), NCCL's too. */
  int shard_group;
  /* Loss scaling, fp16 only (ignored in fp32 and bf16, whose range needs
   * none). loss_scale 0: dynamic (PyTorch GradScaler / DeepSpeed): start at
   * loss_scale_init, halve on a step whose gradients hold inf or NaN (the
   * step is skipped), double after loss_scale_window clean steps in a row;
   * an overflow with the scale already at min_loss_scale is an error.
   * loss_scale > 0: that fixed scale; an overflowing step is still skipped. */
  float loss_scale;         /* 0 dynamic, > 0 fixed */
  float loss_scale_init;    /* dynamic: initial scale, 65536 = 2^16 */
  size_t loss_scale_window; /* dynamic: clean steps before doubling, 2000 */
  float min_loss_scale;     /* dynamic: floor, 1 */
  /* Activation checkpointing: 0 none; K >= 1 checkpoints blocks 0, K, 2K, ...
   * (1: every block). A checkpointed block keeps only its input and runs
   * its forward again just before its backward. The embedding saves
   * nothing and the head's backward follows its forward directly, so
   * neither is ever checkpointed. */
  size_t recompute_every;
  /* ZeRO stage 3 only (stages 0-2 hold whole parameters): 1 keeps each
   * unit's gathered parameters from its first forward of a step to its
   * backward in the step's last micro-batch (PyTorch FSDP2's
   * reshard_after_forward=False, across micro-batches too): one all-gather
   * per unit per step instead of one per forward and per backward, for the
   * memory of the gathered units held at once (the plan charges it). 0
   * (the default): gathered for each forward and each backward and freed
   * after. The bits are the same either way (a gather copies). */
  int keep_gathered;
  /* Communication overlap (DESIGN.md "Communication overlap"; 1, the
   * default of ts_engine_default_opts): collectives are started ahead and
   * waited for where their result is needed. ZeRO-3 starts unit i+1's
   * all-gather before computing unit i (prefetch depth 1: the plan charges
   * the second gathered unit) and keeps the last unit gathered from its
   * forward into its backward; stages 2/3 start unit i's reduce-scatter
   * as its backward ends and wait for it after unit i-1's backward; stages
   * 0/1 reduce-scatter (and stage 0 all-gathers) each unit's gradient as
   * the step's last backward produces it (DDP's buckets, one per unit); the
   * optimizer's all-gathers of updated parameters run beside AdamW of the
   * next unit. The data-parallel group gets a communication thread (comm.h
   * ts_comm_set_thread) when it has two or more ranks and MPI allows it, on
   * the CPU and on the staged transport beside a GPU, so the data moves
   * while the step computes; otherwise the same order runs without one. The bits are those of 0
   * (every sum in the same order: the transport's rank order). */
  int overlap;
  /* The transport of the data-parallel and pipeline groups
   * (ts_engine_comm_kind; DESIGN.md "GPU"). auto (0): mpi on the CPU; on a
   * GPU nccl, or staged when gpu_shared. mpi: MPI on the buffers themselves
   * (CPU only). staged: every collective and send moves device ->
   * page-locked host -> MPI -> device in chunks of comm_chunk_bytes per rank
   * (comm.h ts_comm_set_memory); on the CPU it stages host memory the same
   * way (the GPU path's twin). nccl (GPU only): dp's collectives through
   * NCCL on a communication stream ordered by events (comm/nccl.h; on one
   * rank too when asked by name, auto keeps one rank local), pp's sends
   * through the staged transport. The bits are the same on every
   * transport: every sum is fp32 in rank order, rounded once. */
  int comm;
  /* 1: another rank of this node uses this rank's GPU (more local ranks
   * than GPUs), so auto picks staged (NCCL refuses two ranks on one GPU).
   * Every rank of a job must pass the same value (train agrees on it over
   * the world). */
  int gpu_shared;
  /* staged: bytes of each rank's part of a chunk (0: 1 MiB; at least
   * TS_COMM_STAGING_MIN_PIECE). The plan charges the staging, 4 N times
   * this, to the host (category comm). */
  size_t comm_chunk_bytes;
  /* Where every training buffer lives and every op runs: the CPU, or a
   * CUDA GPU (ordinal device_index; the caller picks it, e.g. local rank %
   * device count). Several ranks on GPUs talk through NCCL or the staged
   * transport (`comm`). The plan takes any device. */
  ts_device device;
  int device_index;
  int allow_tf32; /* CUDA fp32 products on TF32 tensor cores (kernels.h TS_K_ALLOW_TF32) */
  int plain_attention; /* CUDA bf16/fp16 attention on the plain kernels, not cuDNN's
                          (kernels.h TS_K_PLAIN_ATTENTION) */
  int async_save;      /* 1: a host copy of this rank's checkpoint bytes (room for its stage's
                          largest rank file; ledger category staging, host account) for
                          ts_checkpoint_save_async */
  /* Offload to a local disk (DESIGN.md "Offload"; ZeRO-Infinity): NULL,
   * or a folder where this rank keeps its optimizer state (fp32 master
   * weights in bf16/fp16, Adam's m and v) in a scratch file, streamed in
   * pieces (offload_piece) through three buffers (engine/offload.h):
   * memory holds the pieces in flight only; the ledger's disk account
   * charges the file.
   * The bits are those without it. Any device: beside a GPU the pieces
   * are in page-locked host memory and AdamW runs on the CPU as with
   * offload_optimizer. Borrowed: it must outlive the engine. */
  const char *offload_dir;
  /* offload_dir: elements per piece streamed (0: 4 Mi, 16 MiB per array;
   * else a multiple of 1024): memory holds three pieces of the state.
   * offload_optimizer: elements per copy between the device and the host
   * (the host staging holds one gradient and one parameter piece). */
  size_t offload_piece;
  /* 1: the optimizer state (fp32 master weights, Adam's m and v) in host
   * memory (ZeRO-Offload, Ren et al. 2021): beside a GPU page-locked, at
   * its exact size, charged to the ledger's host (CPU) account; each
   * unit's update copies its gradient shard to the host in pieces, runs
   * the CPU's AdamW (the device's element update, kernels.h ts_k_adamw:
   * the same bits) and copies the updated parameters back. In fp32 the
   * device's parameters are the master weights: copied to the host,
   * updated, copied back. On the CPU the state is in host memory with or
   * without it: the flag runs the GPU's path there (the same copies,
   * within host memory), a twin for tests, saving nothing. */
  int offload_optimizer;
  /* 1 (ZeRO stage 3, with offload_optimizer, one pipeline stage): this
   * rank's parameter shards in host memory too (ZeRO-Infinity's parameter
   * offload), page-locked beside a GPU and charged to the host account:
   * each all-gather first copies the shard to the device, into its place
   * in the gathered buffer; the update writes the host's shard directly.
   * The same bits. On the CPU, like offload_optimizer, a twin for tests. */
  int offload_params;
  /* Pipeline stages (DESIGN.md "Pipeline stages"; ts_engine_create_pipeline):
   * the units split into P contiguous stages, each stage's grad_accum
   * micro-batches run by the schedule. P = 1: no pipelining. */
  int pipeline_stages;         /* P >= 1 */
  ts_schedule_kind schedule;   /* GPipe, 1F1B or interleaved 1F1B */
  /* v model chunks per rank (the interleaved schedule, P >= 2): the units
   * split into P v contiguous virtual stages, virtual stage j on rank
   * j % P (round-robin), P v <= TS_ENGINE_MAX_STAGES; ZB-V: 2 (0 and 1
   * mean it too), its V placing virtual stages s and 2 P - 1 - s on rank
   * s (ts_schedule_vstage); 0 or 1 otherwise (one chunk: the stage). */
  int virtual_stages;
  const char *pipeline_split;  /* NULL or "auto": balanced by cost (ts_engine_unit_cost);
                                  else "a,b,..." units per (virtual) stage (borrowed) */
} ts_engine_opts;

/* "auto", "mpi", "staged", "nccl"; "?" for others. */
const char *ts_engine_comm_name(int comm);
/* The transport opts picks: auto resolved for opts->device and
 * opts->gpu_shared. */
ts_engine_comm_kind ts_engine_comm_resolve(const ts_engine_opts *opts);

/* Defaults: B 8, T 128, accumulation 1, fp32, seed 1337, AdamW (0.9, 0.95,
 * 1e-8), weight decay 0.1, clipping at 1.0 (nanoGPT / LLaMA settings),
 * ZeRO stage 0, dynamic loss scaling from 2^16 with window 2000 and
 * minimum 1 (fp16 only), no activation checkpointing, no pipelining
 * (P = 1; schedule 1F1B when P > 1, auto split), communication overlap on. */
ts_engine_opts ts_engine_default_opts(void);

/* The checks of two options that callers may want before anything else
 * (they are part of ts_engine_create's and ts_engine_plan's): the ZeRO
 * stage 0-3, and 1 to TS_ENGINE_MAX_STAGES pipeline stages.
 * TS_ERR_INVALID_ARGUMENT naming the option ("`zero_stage` 5: expected a
 * ZeRO stage 0, 1, 2 or 3"). */
ts_status ts_engine_check_zero_stage(long long zero_stage);
ts_status ts_engine_check_pipeline_stages(long long stages);

/* Hybrid sharding: opts->shard_group checked against a data-parallel
 * group of dp_size ranks (0, or a divisor of dp_size).
 * TS_ERR_INVALID_ARGUMENT naming `shard_group`, the size and dp_size. */
ts_status ts_engine_check_shard_group(const ts_engine_opts *opts, int dp_size);
/* The ranks each tensor is sharded over in a data-parallel group of
 * dp_size: opts->shard_group when hybrid (0 < S < dp_size), else dp_size. */
int ts_engine_shard_size(const ts_engine_opts *opts, int dp_size);

/* Whether unit u of m is recomputed (activation checkpointing) under
 * opts->recompute_every: blocks (ts_unit.layer >= 0) whose layer is a
 * multiple of it. */
int ts_engine_is_recomputed(const ts_model *m, const ts_engine_opts *opts, int u);

/* Activation bytes one rank allocates (ledger category activations), from
 * the units' declared saved bytes (ts_unit_saved_bytes) alone: the (B, T)
 * int32 inputs and targets, the (B, T, C) input of every unit but the
 * first, two (B, T, C) activation-gradient buffers, the saved bytes of
 * every unit not checkpointed and, when some unit is, one recompute buffer
 * of the largest checkpointed unit's saved bytes. Independent of the ZeRO
 * stage and N. The engine allocates exactly this at create. */
size_t ts_engine_activation_bytes(const ts_model *m, const ts_engine_opts *opts);

/* The same for pipeline stage `stage` of opts->pipeline_stages (stage 0:
 * ts_engine_activation_bytes): per micro-batch in flight (ZB-H1: from
 * forward to W; the copies its W stores make come on top, transients the
 * plan charges)
 * (ts_schedule_in_flight) the (B, T) inputs and targets, the (B, T, C)
 * inputs of the stage's units and its output, the saved bytes of its units
 * not checkpointed and, on stages s > 0, the (B, T, C) gradient sent back;
 * once, the two activation-gradient buffers and the recompute buffer of
 * its checkpointed units. 0 for a stage or split the options do not
 * allow. */
enum { TS_ENGINE_MAX_STAGES = 64 };
/* The most model chunks per rank (opts.virtual_stages). */
enum { TS_ENGINE_MAX_CHUNKS = 16 };
size_t ts_engine_activation_bytes_stage(const ts_model *m, const ts_engine_opts *opts, int stage);

/* The memory plan of one rank of N = dp_size data-parallel ranks training
 * `model` with opts: the engine's own create and one whole step (every
 * micro-batch's forward and backward, with every transient gather and full
 * gradient, and the optimizer step) run on the plan device: a plan ledger
 * (ts_ledger_init_plan) that charges each allocation and allocates nothing,
 * a kernels context that checks every op and runs none (TS_K_PLAN), plan
 * groups that count and move nothing (ts_comm_plan); no compute, no MPI,
 * the same code path as training. *out receives the counters of
 * opts->device: peak[c] per category, peak_total, and current[c] = what
 * stays allocated between steps. Shards are equal, so every rank's plan is
 * the same. The optimizer step and evaluation allocate nothing
 * (evaluation's forward is a part of the micro-step), so a real run's
 * ledger peaks equal these exactly (tests/zero_test). Milliseconds for
 * LLaMA-2 70B at N = 1024. Errors: those of ts_engine_create's checks, and
 * TS_ERR_INVALID_ARGUMENT for dp_size outside 1 .. INT32_MAX. The config's
 * sizes are bounded (TS_MODEL_MAX_PARAMS); products of an absurd B or T
 * (e.g. B NH T^2 attention bytes) are not checked for size_t overflow. */
ts_status ts_engine_plan(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                         ts_mem_account *out);

/* The model state alone (categories params, grads, master, optim) of one
 * rank for Ψ = psi parameters held as one flat buffer padded to a multiple
 * of dp_size * 16 elements, at zero_stage in dtype, on a plan ledger (*out:
 * current[c] = peak[c]; nothing else is charged, no transients). In
 * bf16/fp16 these are the ZeRO paper's (Rajbhandari et al. 2020, §5.1 and
 * Table 1, K = 12): 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N bytes for stages
 * 0-3; in fp32 the master weights are the parameters themselves (engine.h's
 * table). TS_ERR_INVALID_ARGUMENT for dp_size outside 1 .. INT32_MAX or a
 * stage outside 0-3. */
ts_status ts_engine_plan_params(size_t psi, ts_dtype dtype, int zero_stage, size_t dp_size,
                                ts_mem_account *out);

/* The cost of unit u in one micro-batch, used to balance pipeline stages:
 * its forward and backward FLOPs (models/model.h's FLOP model: 3 x
 * ts_unit_forward_flops) plus the bytes it reads and writes per token (its
 * (B, T, C) input, output and their gradients), per micro-batch of B T
 * tokens. Units: FLOP-equivalents. */
double ts_engine_unit_cost(const ts_model *m, const ts_engine_opts *opts, int u);

/* The split of m's units into opts->pipeline_stages stages (with v =
 * opts->virtual_stages > 1 chunks per rank, into P v virtual stages; read
 * P as P v below): first[s] is
 * stage s's first unit (first[0] = 0), then first[P] = m->n_units, P + 1
 * entries; auto balances
 * ts_engine_unit_cost (ts_pipeline_split_balanced), an explicit split is
 * parsed (ts_pipeline_split_parse). TS_ERR_INVALID_ARGUMENT, naming the
 * option: P < 1 or more stages than units ("`pipeline_stages` 9: expected 1
 * to 6 stages ..."), an explicit split that does not give every
 * stage a unit and cover the units exactly. */
ts_status ts_engine_pipeline_split(const ts_model *m, const ts_engine_opts *opts, int *first);

/* The model chunks per rank opts asks for: opts->virtual_stages under the
 * interleaved schedule, 2 under ZB-V, else 1. */
int ts_engine_opts_chunks(const ts_engine_opts *opts);

/* The memory plan of pipeline stage `stage` (0 .. P-1) of one rank of its
 * dp_size data-parallel ranks, as ts_engine_plan (which is stage 0's): its
 * units' model state, the tied head's replica of the lender's parameters
 * (last stage), the activations of the schedule's micro-batches in flight
 * (ts_schedule_in_flight: GPipe m, 1F1B min(P - s, m)), the receive and
 * send buffers, and one whole step of that stage's schedule replayed. */
ts_status ts_engine_plan_stage(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                               int stage, ts_mem_account *out);

/* ts_engine_plan_stage's plan, and beside a device (opts->device not CPU)
 * the host memory the same engine holds, in *host: the batch's staging
 * (activations), the staged transport's host staging (comm), an
 * asynchronous save's copy (staging). On the CPU *host is all zero (the
 * device account is the host's). *disk: the offload folder's file
 * (opts->offload_dir: categories master and optim), else all zero.
 * Errors as ts_engine_plan_stage. */
ts_status ts_engine_plan_stage_host(const ts_model *model, const ts_engine_opts *opts,
                                    size_t dp_size, int stage, ts_mem_account *out,
                                    ts_mem_account *host, ts_mem_account *disk);

typedef struct ts_engine ts_engine; /* opaque; owns its buffers */

typedef struct ts_step_stats {
  double loss;              /* mean of the step's micro-batch losses over all ranks */
  double grad_norm;         /* global L2 norm of the (unscaled) gradient before
                               clipping; inf or NaN on a skipped step */
  float lr;                 /* learning rate applied (0 on a skipped step) */
  int step;                 /* optimizer updates applied so far (AdamW's t):
                               skipped steps do not count */
  float loss_scale;         /* loss scale of this step's gradients (1 unless fp16) */
  float next_loss_scale;    /* loss scale of the next step */
  int skipped;              /* 1: a non-finite gradient (fp16 overflow, or a diverging
                               fp32/bf16 run) or, in fp32/bf16, a non-finite loss:
                               parameters and moments untouched */
  int overflow_unit;        /* skipped: where the overflow began: the last unit
                               (the first that backward reaches) holding a
                               non-finite gradient on any rank, else -1 */
  char overflow_tensor[80]; /* skipped: its first non-finite tensor (layout order),
                               or "loss" when only the loss is non-finite,
                               Hugging Face name, else "" */
  ts_comm_counters comm;    /* bytes this rank sent during the step, per kind */
  uint64_t comm_bytes;      /* their sum, bytes */
  uint64_t comm_remote_bytes; /* of comm_bytes: those to ranks on other nodes (the link
                                 class across nodes; ts_comm_set_nodes), bytes */
} ts_step_stats;

/* The bytes one rank sends in one training step of the plan, by kind and
 * by link class (DESIGN.md "Several nodes"), in out->comm,
 * out->comm_bytes and out->comm_remote_bytes (the rest of *out zeroed):
 * world rank `stage` x dp_size (data-parallel rank 0 of pipeline stage
 * `stage`; hybrid sharding: of the first shard group), with
 * ranks_per_node consecutive world ranks per node (0: every rank on one
 * node), as the engine's groups count them on a real run of that layout
 * (ts_comm_set_nodes). Errors as ts_engine_plan_stage;
 * TS_ERR_INVALID_ARGUMENT for ranks_per_node < 0. */
ts_status ts_engine_plan_comm(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                              int stage, int ranks_per_node, ts_step_stats *out);

/* Builds the engine for `model` (borrowed; must outlive the engine) on the
 * data-parallel group dp (borrowed; NULL: one rank, no MPI), allocates
 * everything through its ledger and initialises the parameters from
 * opts->seed (identical on every rank, whatever N and stage).
 * Errors: TS_ERR_INVALID_ARGUMENT (B, T or accumulation zero, T >
 * max_position_embeddings, zero_stage outside 0-3: the message names the
 * flag and the expected value; in fp16 also a loss scale that is negative
 * or not finite, an initial scale below the minimum, a window of 0; an
 * unknown device; `comm` mpi on a GPU), TS_ERR_UNSUPPORTED (`comm` nccl,
 * not built), TS_ERR_INVALID_USAGE (a group already on a communication
 * thread, or lent another engine's memory: one owner per group),
 * TS_ERR_OUT_OF_MEMORY (on a GPU also before anything is allocated, when
 * the plan exceeds the card's free memory: the message names the
 * categories), TS_ERR_CUDA, TS_ERR_MPI. */
ts_status ts_engine_create(ts_engine **out, const ts_model *model, const ts_engine_opts *opts,
                           ts_comm *dp);
/* ts_engine_create for pipeline stage grid->stage of grid->stages (=
 * opts->pipeline_stages, else TS_ERR_INVALID_ARGUMENT): the engine holds
 * its stage's units (ts_engine_pipeline_split) with ZeRO stage
 * opts->zero_stage inside grid->dp_group, and talks to its neighbour
 * stages through grid->pp_group (both borrowed). A tied head on the last
 * stage holds its own copy of the lender's parameters (sharded as the
 * stage says), updated from stage 0 after every step. Local, like create;
 * errors as create and ts_engine_pipeline_split. */
ts_status ts_engine_create_pipeline(ts_engine **out, const ts_model *model,
                                    const ts_engine_opts *opts, const ts_grid *grid);

/* Frees every buffer (the ledger returns to zero) and the engine; NULL is a
 * no-op. */
void ts_engine_free(ts_engine *e);

/* Fills the (B, T) int32 host arrays inputs and targets with micro-batch
 * mb (0 .. grad_accum - 1) of the current step; a status other than TS_OK
 * stops the step. */
typedef ts_status (*ts_engine_batch_fn)(void *user, int mb, int32_t *inputs, int32_t *targets);

/* One whole optimizer step of grad_accum micro-batches, fetched by batch:
 * this rank's list of the step's schedule (ts_schedule_build; without
 * pipelining a one-stage 1F1B: forward then backward of each micro-batch),
 * run by one executor (observers, observer.h, see each action):
 *   FORWARD, BACKWARD of each micro-batch, the backward as one action per
 *     unit (BACKWARD_UNIT) followed, where the stage reduces then, by the
 *     unit's reduce-scatter (REDUCE_UNIT: stages 2-3 every micro-batch,
 *     stages 0-1 with overlap in the last): gradients accumulate; with
 *     pipeline stages the SEND and RECV actions move activations and their
 *     gradients, paired so that no rank waits on a wrong peer;
 *   REDUCE: stages 0-1's gradient reduction, then the global grad norm
 *     from every rank's gradient shard (summed per unit in model order over
 *     the pipeline, then one all-reduce over the dp group, rank order, so
 *     every stage and layout reports the same bits);
 *   OPTIMIZER, then one OPTIMIZER_UNIT per unit and OPTIMIZER_END:
 *     clipping (torch.nn.utils.clip_grad_norm_: scale max_norm /
 *     (norm + 1e-6) when norm > max_norm), each unit's AdamW with learning
 *     rate lr on this rank's shard and the all-gather of its update
 *     (stages 1-2), gradients zeroed.
 * Every stage calls batch for every micro-batch (stage 0 reads the inputs,
 * the last stage the targets). The bits are those of the same
 * micro-batches without pipelining at the same dp size: every unit
 * computes the same values, backward runs in micro-batch order, the tied
 * head's gradient is summed into the lender's at the same point.
 * fp16: the gradients are those of the loss times the loss scale; the
 * norm's all-reduce agrees on overflow (a non-finite sum of squares on any
 * rank), and an overflowing step is skipped on every rank: a second
 * all-reduce (skipped steps only) finds where it began (overflow_unit),
 * gradients are zeroed, parameters, master weights and moments stay as
 * they were, and the scale is updated (see ts_engine_opts). Otherwise the
 * norm and AdamW see the gradients divided by the scale (a power of two:
 * exact). fp32 and bf16: a non-finite gradient norm or step loss is never
 * applied either: the step is skipped alike, naming the tensor (or
 * "loss"); the caller decides how many in a row end the run. Fills *stats
 * (the loss: the mean of the micro-batches' mean losses over the dp
 * group). Collective over the grid (pipeline and dp groups).
 * Errors: TS_ERR_INVALID_ARGUMENT (batch NULL; a token or target out of
 * range), batch's own, an observer's, TS_ERR_INVALID_USAGE (called inside
 * a step, from an observer), TS_ERR_NUMERIC (dynamic scaling, an overflow
 * with the scale at min_loss_scale: the message names the tensor and the
 * recent scale history; the step is skipped, stats filled), TS_ERR_MPI.
 * A step that fails before its OPTIMIZER action is discarded: gradients
 * zeroed, nothing kept, as if it had not begun. */
ts_status ts_engine_step(ts_engine *e, ts_engine_batch_fn batch, void *user, float lr,
                         ts_step_stats *stats);

/* Loss of this rank's (B, T) batch without touching gradients (forward
 * only; collective in stage 3, and over the pipeline group of a pipeline
 * stage, whose every stage gets the last stage's sums). *loss_sum and
 * *count: summed row losses and rows with a target, of this dp rank only. */
ts_status ts_engine_eval(ts_engine *e, const int32_t *inputs, const int32_t *targets,
                         double *loss_sum, size_t *count);
/* ts_engine_eval, and *correct: this dp rank's rows with a target whose
 * logits' first maximum is the target (the accuracy of a masked LM's
 * predictions; correct NULL: ts_engine_eval). The logits are read on the
 * host, a row at a time (a copy each from a device). Errors: those of
 * ts_engine_eval, TS_ERR_OUT_OF_MEMORY for the host copy of a row. */
ts_status ts_engine_eval_accuracy(ts_engine *e, const int32_t *inputs, const int32_t *targets,
                                  double *loss_sum, size_t *count, size_t *correct);

/* The engine's own (B, T) int32 input and target buffers, host memory
 * (ledger category activations: on the CPU they are the batch the units
 * read; beside a device, host staging charged to the ledger's CPU
 * account). A caller that fills them and passes them back to
 * ts_engine_eval saves a copy on the CPU and stays inside the ledger. */
void ts_engine_batch(ts_engine *e, int32_t **inputs, int32_t **targets);

/* This rank's memory counters on the engine's device (read-only; the
 * ledger's account of opts->device). */
const ts_mem_account *ts_engine_memory(const ts_engine *e);

/* This rank's memory counters in host memory (the ledger's CPU account):
 * beside a device its host staging and, with opts->offload_optimizer or
 * offload_dir, the optimizer state or its pieces; on the CPU the same
 * account as ts_engine_memory. */
const ts_mem_account *ts_engine_host_memory(const ts_engine *e);

/* This rank's bytes on a local disk: opts->offload_dir's scratch file
 * (categories master and optim; ledger.h ts_ledger_disk_account), all zero
 * without offload. */
const ts_mem_account *ts_engine_disk(const ts_engine *e);

/* What the GPU itself reports (cudaMemGetInfo), beside the ledger: the
 * measured counterpart of ts_engine_memory, so that the CUDA context,
 * cuBLASLt's and cuDNN's own allocations and anything else on the card show
 * up as the difference. All bytes. */
typedef struct ts_device_report {
  char name[96];          /* e.g. "NVIDIA H100 80GB HBM3"; "cpu" on the CPU */
  int index;              /* CUDA ordinal; 0 on the CPU */
  size_t total;           /* the card's memory */
  size_t used_at_create;  /* total - free after the context and handles were made, before the
                             engine allocated anything (context, libraries, other processes) */
  size_t used_now;        /* total - free now */
  size_t reserved;        /* the step's transients kept between uses (ts_ledger_cached_bytes) */
  size_t overhead;        /* used_now - the ledger's current device bytes - reserved */
} ts_device_report;

/* Fills *out for e's device (a CPU engine: name "cpu", zeros).
 * TS_ERR_CUDA. */
ts_status ts_engine_device_report(const ts_engine *e, ts_device_report *out);

/* The engine's options (as given) and its data-parallel group. */
const ts_engine_opts *ts_engine_options(const ts_engine *e);
ts_comm *ts_engine_comm(const ts_engine *e);

/* The model the engine trains (borrowed from the creator). */
const ts_model *ts_engine_model(const ts_engine *e);

/* Records the engine's spans (forward, backward, recompute per unit and
 * micro-batch; all-gathers, reduce-scatters; the optimizer step) into t
 * (engine/trace.h; borrowed, NULL: stop). On a GPU every span then waits
 * for the device at its end. */
typedef struct ts_trace ts_trace;
void ts_engine_set_trace(ts_engine *e, ts_trace *t);

/* Number of units of the model (embedding, blocks, head). */
int ts_engine_num_units(const ts_engine *e);

/* This rank's pipeline stage and the units it computes, [*begin, *end)
 * (stage 0 and every unit without pipelining); with v model chunks
 * (interleaved), those of its first chunk (ts_engine_chunk_units). */
int ts_engine_stage_units(const ts_engine *e, int *begin, int *end);

/* The model chunks this rank computes (opts.virtual_stages; 1 without
 * the interleaved schedule) and chunk c's units, [*begin, *end): virtual
 * stage c P + s of the P v (0 <= c < chunks, asserted). */
int ts_engine_chunks(const ts_engine *e);
void ts_engine_chunk_units(const ts_engine *e, int c, int *begin, int *end);

/* 1 when rank's pipeline stage computes unit u (one of its chunks). */
int ts_engine_computes_unit(const ts_engine *e, int u);

/* The flat layout of unit u of m (its tensors in layout order, padded for
 * dp_size data-parallel ranks: shard/flat.h) into *out, whichever pipeline
 * stage computes it. Errors: ts_flat_layout_init's. */
ts_status ts_engine_unit_layout(const ts_model *m, int u, size_t dp_size, ts_flat_layout *out);

/* The flat layout of unit u, 0 <= u < n_units (asserted), as this engine
 * holds it (zeroed for a unit of another pipeline stage). */
const ts_flat_layout *ts_engine_layout(const ts_engine *e, int u);

/* Copies the tensor named `name` (Hugging Face name) into (set) or out of
 * (get) the engine as fp32 host values; numel must match the tensor.
 * set (every rank passes the same values) writes this rank's part of the
 * compute parameters and master weights. get is collective in stage 3 (it
 * gathers the unit). get_grad reads the accumulated gradient and needs a
 * one-rank group (TS_ERR_INVALID_USAGE otherwise; ranks hold unreduced or
 * sharded gradients). TS_ERR_INVALID_ARGUMENT names the tensor when it is
 * unknown or the size differs; TS_ERR_INVALID_USAGE when its unit is on
 * another pipeline stage (a tied head's stage holds the borrowed tensor's
 * parameters too: get and set reach them). */
ts_status ts_engine_set_tensor(ts_engine *e, const char *name, const float *src, size_t numel);
ts_status ts_engine_get_tensor(ts_engine *e, const char *name, float *dst, size_t numel);
ts_status ts_engine_get_grad(const ts_engine *e, const char *name, float *dst, size_t numel);

/* The loss scale the next micro-steps' gradients carry (1 unless fp16). */
float ts_engine_loss_scale(const ts_engine *e);

/* The logits (B, T, V) of the last micro-step's forward, as fp32 host values
 * (valid until that step's backward overwrote them: only after
 * ts_engine_eval). */
ts_status ts_engine_get_logits(const ts_engine *e, float *dst, size_t numel);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_ENGINE_H */
