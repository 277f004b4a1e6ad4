/* trainer_run.h — private to engine/trainer.c and engine/trainer_resume.c:
 * one training run's state, and the resume steps trainer_resume.c does
 * for trainer.c's setup (which checkpoint to go on from, whether it fits
 * this run, whether its files are intact). */
#ifndef TS_ENGINE_TRAINER_RUN_H
#define TS_ENGINE_TRAINER_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "engine/checkpoint.h"
#include "engine/grid.h"
#include "engine/loader.h"
#include "engine/metrics.h"
#include "engine/mlm.h"
#include "engine/token_file.h"
#include "engine/trace.h"
#include "engine/trainer.h"
#include "engine/trainer_state.h"

typedef struct ts_train_run_state {
  const ts_train_config *cfg; /* borrowed */
  ts_engine_opts eo;         /* cfg->engine with grad_accum resolved */
  size_t global_batch;       /* sequences per step over all ranks */
  ts_comm *world;            /* cfg->dp or own_comm: every rank of the run */
  ts_comm *own_comm;         /* one-rank group when cfg->dp is NULL */
  int wrank, world_size;     /* this rank and the size, of the world */
  ts_grid grid;              /* pipeline stages x dp ranks (P > 1), else zeroed */
  ts_comm *dp;               /* the data-parallel group: world, or the grid's */
  int rank, dp_size;         /* this rank and N, of the data-parallel group */
  int split[TS_ENGINE_MAX_STAGES + 1]; /* first unit of each pipeline stage, then n_units */
  ts_model model;            /* loaded from cfg->model */
  ts_token_file *train, *val; /* DATA/train.bin, DATA/val.bin */
  ts_loader *train_ld, *val_ld; /* shuffled, in file order */
  int mlm;                   /* a masked-LM model: batches from engine/mlm.h */
  ts_mlm_spec mlm_spec;      /* DATA/meta.json's special ids */
  int32_t *mlm_scratch;      /* ts_mlm_scratch_elems(B, T) host ids */
  ts_engine *engine;         /* the step */
  int32_t *inputs, *targets; /* (B, T) host, the engine's own buffers */
  ts_metrics *metrics;       /* rank 0 only */
  ts_trace *trace;           /* cfg->trace_path: this rank's spans; else NULL */
  ts_step_stats last;        /* the last optimizer step */
  char model_path[4096];     /* the config.json cfg->model resolved to */
  char *model_text;          /* its bytes (saved beside every checkpoint), else NULL */
  size_t model_len;          /* bytes */
  ts_checkpoint *ck;         /* the checkpoint resumed from (setup), else NULL */
  int ck_hold;               /* ts_checkpoint_hold's descriptor on ck + 1, else 0 */
  size_t ck_step;            /* resume auto: ck's step-N, the next candidate is older */
  ts_trainer_state saved;    /* ck's trainer.json (ts_train_check_resume_data) */
  size_t start;              /* steps done before this run (resumed), else 0 */
  double load_seconds;       /* this rank's verify and load of ck */
  char notes[1024];          /* what the run says beside its work (ts_train_note), lines, else "" */
  ts_checkpoint_pending *pending; /* the asynchronous save in flight, else NULL */
  char pending_dir[4200];         /* its folder */
  double *times;                  /* (steps run, 3) this rank's step, compute and wait seconds */
  size_t timed;                   /* rows of times filled */
} ts_train_run_state;

/* Appends one line to r->notes (printf format), what the run says beside
 * its work; cut short at the buffer's end. */
void ts_train_note(ts_train_run_state *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Closes the checkpoint resumed from (r->ck) and lets a prune remove it. */
void ts_train_release_checkpoint(ts_train_run_state *r);

/* cfg->resume: finds, opens and checks the checkpoint to go on from (its
 * model, config.json and trainer.json against this run), setting r->ck,
 * r->saved, r->start and the data seed. `resume` auto: the newest intact
 * step-N under save_dir older than `below` ((size_t)-1: any); none at all
 * is a fresh start (r->ck NULL). TS_ERR_INVALID_ARGUMENT when it does not
 * fit this run, TS_ERR_IO or TS_ERR_FORMAT when it is damaged. */
ts_status ts_train_open_resume(ts_train_run_state *r, size_t below);

/* The opened checkpoint against this run's corpus and `seq`: another
 * corpus is refused (TS_ERR_INVALID_ARGUMENT), a moved one or another
 * `seq` said in r->notes. TS_OK without a checkpoint. */
ts_status ts_train_check_resume_data(ts_train_run_state *r);

/* Every rank checks its share of r->ck's files, agreed over the world;
 * `resume` auto falls back to the next older intact checkpoint. */
ts_status ts_train_verify_resume(ts_train_run_state *r);

/* `resume` auto after a run that got further than its checkpoint: says
 * in r->notes how many steps are redone. */
void ts_train_note_redone(ts_train_run_state *r);

#endif /* TS_ENGINE_TRAINER_RUN_H */
