/*
 * trainer.h — a training run: data, schedule, steps, evaluation, metrics.
 *
 * ts_train_run loads the model config and the token shards, builds the
 * engine, and runs `steps` optimizer steps of grad_accum micro-batches each
 * with a cosine learning rate after linear warm-up, evaluating on the
 * validation shard every eval_every steps and at the end. It never prints:
 * progress goes to an optional callback, records to the metrics file
 * (JSON Lines), so tools/ decides what the terminal shows.
 */
#ifndef TS_ENGINE_TRAINER_H
#define TS_ENGINE_TRAINER_H

#include <stddef.h>

#include "engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

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
} ts_train_config;

/* Defaults: 200 steps, lr 3e-3, floor 0.1, warm-up 20, eval at the end on 16
 * batches, engine defaults. model and data_dir must be set by the caller. */
ts_train_config ts_train_default_config(void);

/* What a callback sees after every step and every evaluation. */
typedef struct ts_train_event {
  int is_eval;            /* 1: an evaluation; 0: an optimizer step */
  size_t step;            /* 1-based optimizer step */
  size_t steps;           /* total steps of the run */
  double loss;            /* step: training loss; eval: validation loss */
  double grad_norm;       /* step only */
  float lr;               /* step only */
  double tokens_per_s;    /* step only: tokens of this step / its wall time */
  double gflops;          /* step only: achieved model GFLOP/s (PaLM count) */
} ts_train_event;

typedef void (*ts_train_callback)(const ts_train_event *ev, void *user);

typedef struct ts_train_result {
  double first_loss;       /* training loss of step 1 */
  double final_loss;       /* training loss of the last step */
  double final_val_loss;   /* validation loss at the end */
  double tokens_per_s;     /* mean over steps 2.. (step 1 warms caches) */
  double gflops;           /* mean achieved GFLOP/s over the same steps */
  size_t num_params;       /* Ψ, unpadded */
  double seconds;          /* wall time of the training loop */
} ts_train_result;

/* Cosine schedule with linear warm-up (Loshchilov & Hutter 2017, SGDR eq. 5
 * without restarts): step s (1-based) of `steps`:
 *   s <= warmup: lr * s / warmup
 *   else:        min + (lr - min) * (1 + cos(pi * (s - warmup) / (steps - warmup))) / 2
 * with min = lr * min_lr_ratio. */
float ts_train_lr(size_t step, size_t steps, size_t warmup, float lr, float min_lr_ratio);

/* Runs the training described by cfg. Errors: anything the config, shard,
 * loader or engine report (one-line messages naming file and field);
 * TS_ERR_IO if the metrics file cannot be written. */
ts_status ts_train_run(const ts_train_config *cfg, ts_train_callback cb, void *user,
                       ts_train_result *result);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_TRAINER_H */
