/*
 * metrics.h — a training run's records as JSON Lines (the fields are listed
 * in engine/trainer.h): one line per optimizer step, one per evaluation and
 * a summary at the end, each flushed as written; and, when asked, the same
 * step and evaluation figures as TensorBoard scalars (engine/tensorboard.h:
 * train/loss, train/lr, train/grad_norm (not for a skipped step),
 * train/loss_scale, perf/tokens_per_s, perf/gflops, perf/mfu given a peak,
 * memory/<category>_MiB of the ledger now and memory/peak_MiB; val/loss and
 * val/accuracy), flushed every record. The trainer decides what to record
 * and when (rank 0 writes); this file owns the formats.
 */
#ifndef TS_ENGINE_METRICS_H
#define TS_ENGINE_METRICS_H

#include <stddef.h>

#include "engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_metrics ts_metrics; /* opaque: the open file */

/* Opens path for writing, truncated, or appended to when append != 0 (a
 * resumed run goes on in its file); path NULL gives a sink that accepts
 * every record and writes nothing. tensorboard_dir (or NULL): a new event
 * file there as well. TS_ERR_IO ("PATH: cannot open for writing: ...",
 * ts_tensorboard_open's), TS_ERR_OUT_OF_MEMORY. */
ts_status ts_metrics_open(ts_metrics **out, const char *path, int append,
                          const char *tensorboard_dir);

/* Closes the file; NULL is a no-op. */
void ts_metrics_close(ts_metrics *m);

/* What one step line holds besides the engine's statistics. */
typedef struct ts_metrics_step {
  size_t step;         /* 1-based optimizer step */
  float lr;            /* the learning rate asked for */
  double tokens_per_s; /* tokens of the step over its wall time */
  double gflops;       /* achieved model GFLOP/s (PaLM count) */
  double seconds;      /* the step's wall time */
  double compute_seconds; /* of it, this rank's own work: seconds less wait_seconds */
  double wait_seconds;    /* of it, the time in communication waits (ts_comm_wait_seconds) */
  const ts_mem_account *memory; /* TensorBoard: the ledger after the step, or NULL */
  double peak_flops;      /* TensorBoard: per rank, FLOP/s, perf/mfu's denominator; 0: none */
} ts_metrics_step;

/* {step, loss, lr, grad_norm, tokens_per_s, gflops, step_seconds,
 * compute_seconds, wait_seconds, comm_bytes, comm_bytes_across_nodes, loss_scale, skipped[,
 * overflow: {unit, tensor, loss_scale_before, loss_scale_after}]}. TS_ERR_IO. */
ts_status ts_metrics_write_step(ts_metrics *m, const ts_metrics_step *s, const ts_step_stats *st);

/* {step, val_loss}, and val_accuracy when accuracy >= 0. TS_ERR_IO. */
ts_status ts_metrics_write_eval(ts_metrics *m, size_t step, double val_loss, double accuracy);

/* A resumed run's first line: {"resume": {"step": N, "checkpoint": DIR}};
 * step lines after it continue from N + 1 (lines of the interrupted run
 * past N above it were not kept in the checkpoint). */
ts_status ts_metrics_write_resume(ts_metrics *m, size_t step, const char *checkpoint);

/* Per rank in the summary: the ledger's peak per category, its peak total,
 * the process's peak RSS and the model states held at the end, bytes; then
 * the medians over its steps of the step's wall time, its compute and its
 * waits (ts_metrics_step), seconds. */
enum {
  TS_METRICS_TOTAL = TS_MEM_NUM_CATEGORIES,
  TS_METRICS_PEAK_RSS = TS_MEM_NUM_CATEGORIES + 1,
  TS_METRICS_MODEL_STATES = TS_MEM_NUM_CATEGORIES + 2,
  TS_METRICS_STEP_S = TS_MEM_NUM_CATEGORIES + 3,
  TS_METRICS_COMPUTE_S = TS_MEM_NUM_CATEGORIES + 4,
  TS_METRICS_WAIT_S = TS_MEM_NUM_CATEGORIES + 5,
  TS_METRICS_RANK_FIELDS = TS_MEM_NUM_CATEGORIES + 6,
};

typedef struct ts_metrics_summary {
  size_t params_unpadded, params_padded; /* Ψ and Σ padded flat lengths */
  int world_size;                        /* every rank: P pipeline stages x dp */
  int dp_size;                           /* data-parallel ranks per stage */
  const int *split;                      /* (P) first unit of each pipeline stage */
  const ts_engine_opts *opts;            /* stage, dtype, recompute, batch shape */
  size_t activation_bytes_predicted;     /* ts_engine_activation_bytes */
  size_t skipped_steps;                  /* fp16 overflows */
  float loss_scale;                      /* the final one */
  size_t global_batch;                   /* sequences per step, all ranks */
  const ts_step_stats *last;             /* the last optimizer step (communication) */
  const double *mem;                     /* (world_size, TS_METRICS_RANK_FIELDS) */
  const ts_device_report *device;        /* rank 0's GPU as measured; NULL on the CPU */
  const ts_mem_account *host;            /* beside a GPU rank 0's host account (its staging,
                                            an offloaded optimizer state); NULL on the CPU */
  int slowest_rank;                      /* the straggler (trainer.h), else -1 */
  double straggler_ratio;                /* the threshold it was found with */
} ts_metrics_summary;

/* The median of column col of rows (n, stride) of doubles, sorting a copy;
 * 0 when n is 0. */
double ts_metrics_median(const double *rows, size_t n, size_t stride, size_t col);

/* The straggler test over the summary's rows mem (world_size,
 * TS_METRICS_RANK_FIELDS): *slowest receives the rank with the largest
 * median compute (TS_METRICS_COMPUTE_S), *slowest_s its seconds and
 * *median_s the median over ranks of theirs; returns 1 when *slowest_s
 * exceeds ratio x *median_s, else 0 (always 0 on one rank, outputs
 * untouched then). */
int ts_metrics_straggler(const double *mem, int world_size, double ratio, int *slowest,
                         double *slowest_s, double *median_s);

/* {"summary": {...}} as trainer.h lists. TS_ERR_IO, TS_ERR_OUT_OF_MEMORY. */
ts_status ts_metrics_write_summary(ts_metrics *m, const ts_metrics_summary *s);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_METRICS_H */
