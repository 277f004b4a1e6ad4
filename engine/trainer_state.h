/*
 * trainer_state.h — private to engine/'s trainer: a checkpoint's
 * trainer.json, written beside every checkpoint and read back as untrusted
 * input: where to go on from (the step, the data seed, the
 * next sample), the learning-rate schedule and the settings of the run that
 * saved it.
 *
 * Every field is checked for type and range before anything trusts it:
 * step, steps, data_seed, next_sample and global_batch are required; the
 * others (the schedule and the run's settings, for people and tools) are
 * optional and, when present, typed and in range. Consistency with the
 * checkpoint's index: step = the optimizer's attempts (the steps finished,
 * skipped ones included), data_seed = the index's, next_sample = step x
 * global_batch, and zero_stage, dtype, pipeline and world_size, when
 * present, the index's.
 */
#ifndef TS_ENGINE_TRAINER_STATE_H
#define TS_ENGINE_TRAINER_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/checkpoint.h"
#include "engine/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_trainer_state {
  size_t step;         /* optimizer steps done (the checkpoint's step) */
  size_t steps;        /* the saving run's total steps (its schedule's length) */
  uint64_t data_seed;  /* the data order's seed */
  size_t global_batch; /* sequences per step over all ranks */
  int has_schedule;    /* 1: lr, min_lr_ratio and warmup below were present */
  double lr;           /* the saving run's peak learning rate */
  double min_lr_ratio; /* its cosine floor, a fraction of lr */
  size_t warmup;       /* its warm-up steps */
  size_t seq;          /* its tokens per sequence; 0: not recorded */
  char data[4096];     /* its `data` folder as given; "": not recorded */
  size_t data_tokens;  /* its train.bin's token count; 0: not recorded */
} ts_trainer_state;

/* Parses trainer.json's text (len bytes, host) of the checkpoint in folder
 * dir, whose index says *info, into *out. TS_ERR_FORMAT with one line
 * naming DIR/trainer.json, the field and the expected value ("field
 * \"step\" = 21: expected the index's optimizer.attempts 20"; "field
 * \"data_seed\" = 7: expected the index's 1337"). No allocation outlives
 * the call. */
ts_status ts_trainer_state_parse(const char *text, size_t len, const char *dir,
                                 const ts_checkpoint_info *info, ts_trainer_state *out);

/* trainer.json's text for a checkpoint of the run (cfg, eo) after `step`
 * optimizer steps (malloc'd; NULL when out of memory): the fields the
 * parser above reads back. Where to go on from: the step, the data seed (a
 * string: a 64-bit seed does not fit a JSON number's double; a batch is a
 * pure function of (seed, step, sample index)) and next_sample = step x
 * global_batch; the learning-rate schedule (its rate at `step`); the run's
 * settings (with `data` its train.bin's data_tokens, which a resume
 * checks), its last loss and fp16 loss scale, for people and tools. */
char *ts_trainer_state_json(const ts_train_config *cfg, const ts_engine_opts *eo, size_t step,
                            size_t global_batch, int world_size, double last_loss,
                            float loss_scale, size_t data_tokens);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_TRAINER_STATE_H */
