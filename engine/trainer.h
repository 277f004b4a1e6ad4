/*
 * trainer.h — a training run: data, schedule, steps, evaluation, metrics.
 *
 * ts_train_run loads the model config and the token shards, builds the
 * engine, and runs `steps` optimizer steps of grad_accum micro-batches each
 * with a cosine learning rate after linear warm-up, evaluating on the
 * validation shard every eval_every steps and at the end. It never prints:
 * progress goes to an optional callback, records to the metrics file
 * (JSON Lines), so tools/ decides what the terminal shows.
 *
 * Across ranks: every rank of the data-parallel group calls ts_train_run
 * with the same config; each reads its own slice of every global batch
 * (ts_loader_sample_index). With pipeline stages (engine.pipeline_stages
 * P > 1) the world is a grid of P stages x dp ranks (engine/grid.h) and
 * every stage of a dp rank reads that dp rank's slice; the loss each rank
 * reports is the step's (the last stage's, summed to all). Rank 0 alone
 * writes the metrics file and calls the callback. A resumed run appends to
 * it, starting with {"resume": {step, checkpoint}}. The metrics file holds one line per step
 * {step, loss, lr, grad_norm, tokens_per_s, gflops, step_seconds,
 * compute_seconds, wait_seconds, comm_bytes, comm_bytes_across_nodes, loss_scale, skipped} (rank
 * 0's step split into its own work and its communication waits) (a skipped fp16 step adds overflow:
 * {unit, tensor, loss_scale_before, loss_scale_after}, its grad_norm is
 * null and its lr 0), one per evaluation {step, val_loss} (a masked LM adds
 * val_accuracy: the fraction of masked tokens predicted), and at the end
 * {"summary": {params: {unpadded, padded}, world_size, pipeline: {stages,
 * schedule, dp, split (first unit of each stage), bubble_theory ((P-1) /
 * (m+P-1))} (P > 1 only), device ("cpu",
 * "cuda"; on a GPU also gpu_name, gpu_index and device_bytes: {total,
 * ledger_peak, used_at_create, used_now, reserved, overhead}, engine.h
 * ts_device_report, and host_bytes: {ledger_peak, and each category's peak
 * that is not 0}, rank 0's host account), offload_optimizer ("none",
 * "host", "disk"), zero_stage, dtype,
 * activation_checkpointing ("none", "all", "every:K"),
 * activation_bytes_predicted, skipped_steps, loss_scale (final),
 * micro_batch, grad_accum, global_batch, seq, comm_bytes_per_step,
 * comm_bytes_across_nodes_per_step,
 * comm_bytes_by_kind: {all_reduce, ...}, mem_by_rank: [{rank, stage, params,
 * grads, master, optim, activations, comm, workspace, total, peak_rss,
 * model_states}, ...]}} where each mem_by_rank entry is that rank's ledger
 * peak per category and its peak total, the process's peak resident set
 * size (getrusage), and the model states it holds between steps (params,
 * grads, master and optim bytes allocated at the end), in bytes;
 * time_by_rank: [{rank, host, step_median_s, compute_median_s,
 * wait_median_s}, ...], each rank's medians over its steps; straggler:
 * {rank, host, compute_median_s, threshold_ratio} when a rank's median
 * compute exceeds threshold_ratio x the median over ranks (slowest_rank
 * below), else null.
 */
#ifndef TS_ENGINE_TRAINER_H
#define TS_ENGINE_TRAINER_H

#include <stddef.h>

#include "engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reads the tensor of Hugging Face name `name` (numel fp32 host values)
 * from the weights a sample sees (models/generate.h ts_weights_fn). */
typedef ts_status (*ts_train_weights_fn)(void *user, const char *name, float *dst, size_t numel);
/* A sample during training: on rank 0, at `step`, with the model and a
 * reader of its whole current weights (gathered from every rank before
 * the call: every rank takes part). Its error stops the run like a step's. */
typedef ts_status (*ts_train_sample_fn)(void *user, size_t step, const ts_model *m,
                                        ts_train_weights_fn read, void *read_user);

/* The file in `save_dir` where rank 0 notes the last step finished,
 * {"step": N}, after every step: a restart says how many steps it redoes
 * (tools/launch.sh reads it too). */
#define TS_TRAIN_PROGRESS "progress.json"

/* What a stop request (ts_train_config.stop) is: a user's (SIGINT: the
 * run ends as finished) or a preemption's (SIGTERM, SIGUSR1: the job is to
 * be requeued and resumed). A larger kind outranks a smaller. */
typedef enum ts_train_stop {
  TS_TRAIN_STOP_USER = 1,
  TS_TRAIN_STOP_PREEMPT = 2,
} ts_train_stop;

typedef struct ts_train_config {
  const char *model;        /* config.json path or preset name */
  const char *data_dir;     /* holds train.bin and val.bin (tessera prepare) */
  size_t steps;             /* optimizer steps, >= 1 */
  ts_engine_opts engine;    /* micro-batch, seq, accumulation, AdamW, seed */
  float lr;                 /* peak learning rate */
  float min_lr_ratio;       /* cosine floor as a fraction of lr (0.1) */
  size_t warmup;            /* linear warm-up steps */
  size_t eval_every;        /* steps between evaluations; 0: only at the end */
  size_t eval_batches;      /* validation micro-batches per evaluation */
  const char *metrics_path; /* JSON Lines output, or NULL */
  size_t global_batch;      /* sequences per optimizer step over all ranks; 0: N*B*K */
  ts_comm *dp;              /* every rank of the run (borrowed; NULL: one rank): the
                               data-parallel group, or with engine.pipeline_stages
                               P > 1 the world cut into P stages x dp ranks */
  const char *trace_path;   /* Chrome trace-event JSON of the run (engine/trace.h), or NULL */
  ts_fp8_scaling fp8;       /* the model's blocks' linear layers in fp8 (ts_model_set_fp8);
                               TS_FP8_OFF by default */
  /* Checkpoints (engine/checkpoint.h), all optional: */
  const char *save_dir;     /* save into SAVE_DIR/step-NNNNNNNN, or NULL: never */
  size_t save_every;        /* steps between saves (0: only at the end and on a stop) */
  size_t keep;              /* complete checkpoints kept in save_dir, newest first; 0: all */
  int save_async;           /* 1 (default): asynchronous saves (checkpoint.h
                               ts_checkpoint_save_async: training waits for the copy to host
                               staging, a ledger category, not the disk); 0: synchronous */
  const char *resume;       /* a checkpoint folder, a folder of them (its newest), "auto"
                               (save_dir's newest, none: start afresh), or NULL */
  const char *init_from;    /* a Hugging Face folder whose weights start the run (fine-tuning;
                               a resumed checkpoint wins), or NULL */
  size_t max_bad_steps;     /* fp32/bf16: this many steps in a row skipped for a non-finite
                               loss or gradient stop the run (TS_ERR_NUMERIC, nothing saved
                               after the last good step); 0: never. Default 3 */
  const char *tensorboard_dir; /* rank 0 writes a TensorBoard event file there
                                 (engine/tensorboard.h), flushed every step, or NULL */
  double peak_flops;        /* per rank, FLOP/s: the MFU's denominator in the TensorBoard
                               log (perf/mfu); 0: no MFU logged */
  size_t sample_every;      /* steps between samples, and one after the last step's
                               evaluation; 0: never. Needs `pipeline_stages` 1 */
  ts_train_sample_fn sample; /* called on rank 0 at each sample (NULL: none) */
  void *sample_user;
  const volatile int *stop; /* set (on a signal, by another thread, with
                               __atomic_store_n) to a ts_train_stop kind to stop at the
                               next step boundary: every rank agrees, saves (save_dir)
                               and returns TS_OK with result->stopped_at and
                               result->stop_kind (the largest any rank held); 0: go
                               on; NULL: not watched */
} ts_train_config;

/* Defaults: 200 steps, lr 3e-3, floor 0.1, warm-up 20, eval at the end on 16
 * batches, engine defaults, one rank, asynchronous saves. model and data_dir must be set by the
 * caller. */
ts_train_config ts_train_default_config(void);

/* Reconciles the global batch G with N = dp_size data-parallel ranks,
 * micro-batch B and accumulation K (DeepSpeed's train_batch_size = B * K * N): with
 * G == 0, K must be >= 1 and G becomes N * B * K; with G > 0 and K == 0, K
 * is derived as G / (N * B); with both, G must equal N * B * K. Updates
 * *global_batch and eo->grad_accum. TS_ERR_INVALID_ARGUMENT with a message
 * that prints the derived values, e.g. "`global_batch` 30: not divisible by
 * 2 ranks x `micro_batch` 4 = 8 (it would need `grad_accum` 3.75)" (in the
 * library's terms: options named as in its structs, in backquotes, which
 * tools map to their flags, tools/flags.h). */
ts_status ts_train_resolve_batch(size_t dp_size, size_t *global_batch, ts_engine_opts *eo);

/* What a callback sees after every step and every evaluation. */
typedef struct ts_train_event {
  int is_eval;            /* 1: an evaluation; 0: an optimizer step */
  /* (rank 0 only) */
  size_t step;            /* 1-based optimizer step */
  size_t steps;           /* total steps of the run */
  double loss;            /* step: training loss; eval: validation loss */
  double accuracy;        /* eval of a masked LM: masked tokens predicted (fraction); else -1 */
  double grad_norm;       /* step only */
  float lr;               /* step only */
  double tokens_per_s;    /* step only: tokens of this step / its wall time */
  double gflops;          /* step only: achieved model GFLOP/s (PaLM count) */
  float loss_scale;       /* step only: loss scale of its gradients (1 unless fp16) */
  float next_loss_scale;  /* step only: the scale after it */
  int skipped;            /* step only: 1 when fp16 overflow skipped it */
  const char *overflow_tensor; /* skipped: the tensor where the overflow began */
} ts_train_event;

typedef void (*ts_train_callback)(const ts_train_event *ev, void *user);

typedef struct ts_train_result {
  double first_loss;       /* training loss of step 1 */
  double final_loss;       /* training loss of the last step */
  double final_val_loss;   /* validation loss at the end */
  double final_val_accuracy; /* a masked LM's: masked tokens predicted at the end; else -1 */
  double tokens_per_s;     /* mean over steps 2.. (step 1 warms caches) */
  double op_seconds[TS_K_OPS_KINDS]; /* with ts_k_op_times_enable on: this process's op time
                                        by kind (kernels.h) over steps 2.. */
  double op_wall_seconds;  /* the wall time of those steps (0: fewer than 2 steps) */
  double gflops;           /* mean achieved GFLOP/s over the same steps */
  size_t num_params;       /* Ψ, unpadded */
  size_t padded_params;    /* Σ over units of the padded flat length */
  double seconds;          /* wall time of the training loop */
  int world_size;          /* N data-parallel ranks */
  size_t global_batch;     /* sequences per optimizer step, all ranks */
  uint64_t comm_bytes_per_step; /* bytes this rank sent in the last step */
  uint64_t comm_remote_bytes_per_step; /* of them, to ranks on other nodes (hosts) */
  ts_mem_account memory;   /* this rank's memory counters at the end (peaks) */
  ts_mem_account disk;     /* this rank's bytes on a disk (engine.h ts_engine_disk: the
                              offload folder's file; all zero without offload) */
  ts_mem_account host;     /* this rank's host memory counters (engine.h
                              ts_engine_host_memory; on the CPU the same as memory) */
  int setup_failed;        /* on error: 1 when it happened during setup, where
                              every rank agrees and returns an error */
  int failed_elsewhere;    /* on a setup (or agreed) error: 1 when another rank
                              reports it (this rank need not print) */
  int failed_together;     /* on error: 1 when every rank stopped at the same
                              point with the same error (fp16 overflow at the
                              minimum loss scale): no rank waits, no abort */
  size_t skipped_steps;    /* steps skipped for fp16 overflow or a non-finite value */
  size_t resumed_from;     /* the step of the checkpoint the run resumed from, else 0 */
  char notes[1024];        /* (rank 0) what the run says beside its work, lines ending in
                              '\n', in library terms (tools map them to flags,
                              tools/flags.h): resumed with another learning-rate schedule
                              than the saving run's; data without meta.json; else "" */
  size_t stopped_at;       /* the step after which a stop request ended the run, else 0 */
  int stop_kind;           /* that request's ts_train_stop (the largest over the ranks) */
  char saved[4096];        /* the last checkpoint saved, else "" */
  size_t saves;            /* checkpoints saved */
  double save_seconds;     /* the wall time training waited for its saves, summed: the
                              whole save when synchronous; when asynchronous the
                              staging copy (on the CPU: the optimizer steps' waits for
                              it) and, at a save, an unfinished previous write */
  double save_wait_seconds; /* asynchronous: of save_seconds, the waits at a save for the
                               previous save's writers */
  double save_tail_seconds; /* asynchronous: the wait for the last save's writers after
                               training ended (not in save_seconds) */
  double load_seconds;     /* the resumed checkpoint's verify and load, wall time */
  double load_bytes;       /* what every rank read of it (checksums, slices), summed */
  int pipeline_split[TS_ENGINE_MAX_STAGES + 1]; /* first unit of each pipeline stage, then
                                                   the number of units */
  int slowest_rank;              /* the straggler: the world rank whose median compute time
                                    per step (its step less its communication waits) exceeds
                                    TS_TRAIN_STRAGGLER_RATIO x the median over ranks of
                                    theirs; else -1 (and on one rank) */
  double slowest_compute_s;      /* the largest rank's median compute seconds per step */
  double ranks_compute_median_s; /* the median over ranks of those medians */
} ts_train_result;

/* A rank is named a straggler above this ratio (trainer.h slowest_rank).
 * Every rank's step takes the same wall time (each collective waits for
 * the slowest), so ranks are compared by their compute, the step less
 * its waits: NVIDIA's resiliency extension's straggler detection
 * likewise compares the ranks' own compute sections. */
#define TS_TRAIN_STRAGGLER_RATIO 1.2

/* Parses --activation-checkpointing: "none" (0), "all" (1), "every:K"
 * (K >= 1) into ts_engine_opts.recompute_every; TS_ERR_INVALID_ARGUMENT names
 * the value and the choices. ts_train_recompute_name is its inverse. */
ts_status ts_train_parse_recompute(const char *s, size_t *every);
void ts_train_recompute_name(size_t every, char *buf, size_t cap);

/* Cosine schedule with linear warm-up (Loshchilov & Hutter 2017, SGDR eq. 5
 * without restarts): step s (1-based) of `steps`:
 *   s <= warmup: lr * s / warmup
 *   else:        min + (lr - min) * (1 + cos(pi * (s - warmup) / (steps - warmup))) / 2
 * with min = lr * min_lr_ratio. */
float ts_train_lr(size_t step, size_t steps, size_t warmup, float lr, float min_lr_ratio);

/* Runs the training described by cfg (collective over cfg->dp). Setup
 * errors (config, shards, batch sizes, engine) are agreed between ranks
 * before any training: every rank returns an error with
 * result->setup_failed set, and all but the lowest failing rank set
 * result->failed_elsewhere; rank 0 opens (truncates) the metrics file only
 * after every rank's setup succeeded, so a failed start leaves an earlier
 * run's file untouched. An error after setup is this rank's alone (its
 * peers may be waiting in a collective: abort the job). Errors: anything the config,
 * shard, loader or engine report (one-line messages naming file and
 * field); TS_ERR_IO if the metrics file cannot be written; TS_ERR_MPI. */
ts_status ts_train_run(const ts_train_config *cfg, ts_train_callback cb, void *user,
                       ts_train_result *result);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_TRAINER_H */
