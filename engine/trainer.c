/* trainer.c — the training loop around the engine: data, schedule,
 * evaluation, and what to record when (engine/metrics.c writes it). */
#include "engine/trainer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "engine/checkpoint.h"
#include "engine/engine_testing.h"
#include "engine/host_memory.h"
#include "engine/host_weights.h"
#include "engine/loader.h"
#include "engine/metrics.h"
#include "engine/mlm.h"
#include "engine/trace.h"
#include "engine/trainer_run.h"
#include "engine/trainer_state.h"

ts_train_config ts_train_default_config(void) {
  ts_train_config c;
  memset(&c, 0, sizeof c);
  c.steps = 200;
  c.engine = ts_engine_default_opts();
  c.lr = 3e-3f;
  c.min_lr_ratio = 0.1f;
  c.warmup = 20;
  c.eval_every = 0;
  c.eval_batches = 16;
  c.max_bad_steps = 3;
  c.save_async = 1;
  return c;
}

float ts_train_lr(size_t step, size_t steps, size_t warmup, float lr, float min_lr_ratio) {
  if (warmup > 0 && step <= warmup) return lr * (float)step / (float)warmup;
  float min = lr * min_lr_ratio;
  if (steps <= warmup) return lr;
  double progress = (double)(step - warmup) / (double)(steps - warmup);
  if (progress > 1) progress = 1;
  return min + (lr - min) * (float)(0.5 * (1.0 + cos(M_PI * progress)));
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

ts_status ts_train_resolve_batch(size_t dp_size, size_t *global_batch, ts_engine_opts *eo) {
  size_t G = *global_batch, B = eo->micro_batch, K = eo->grad_accum, NB = dp_size * B;
  if (B == 0 || dp_size == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "`micro_batch` %zu on %zu ranks: expected >= 1", B,
                        dp_size);
  if (G == 0) {
    if (K == 0)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "`grad_accum` 0: expected >= 1, or `global_batch` to derive it");
    *global_batch = NB * K;
    return TS_OK;
  }
  if (K == 0) {
    if (G % NB != 0)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "`global_batch` %zu: not divisible by %zu ranks x `micro_batch` %zu = "
                          "%zu (it would need `grad_accum` %.4g)",
                          G, dp_size, B, NB, (double)G / (double)NB);
    eo->grad_accum = G / NB;
    return TS_OK;
  }
  if (G != NB * K)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`global_batch` %zu: expected %zu ranks x `micro_batch` %zu x "
                        "`grad_accum` %zu = %zu",
                        G, dp_size, B, K, NB * K);
  return TS_OK;
}

typedef ts_train_run_state run; /* trainer_run.h: the run's state, by its short name here */

void ts_train_release_checkpoint(run *r) {
  ts_checkpoint_close(r->ck);
  r->ck = NULL;
  if (r->ck_hold) close(r->ck_hold - 1);
  r->ck_hold = 0;
}

static void run_free(run *r) {
  ts_checkpoint_abandon(r->pending); /* an error path: its writer ends, nothing commits */
  free(r->times);
  free(r->model_text);
  free(r->mlm_scratch);
  ts_train_release_checkpoint(r);
  ts_metrics_close(r->metrics);
  ts_engine_free(r->engine);
  ts_trace_free(r->trace);
  ts_loader_free(r->train_ld);
  ts_loader_free(r->val_ld);
  ts_token_file_close(r->train);
  ts_token_file_close(r->val);
  ts_model_free(&r->model);
  ts_grid_free(&r->grid);
  ts_comm_free(r->own_comm);
}

/* The seed of the validation masks: fixed, so every evaluation of every
 * run masks the same positions. */
#define VAL_MASK_SEED 0x76616cull

/* Sequences first ... first + B - 1 of loader ld into (B, T) host inputs
 * and targets: next-token windows, or masked-LM sequences of mask seed
 * `seed`. */
static ts_status fill(run *r, ts_loader *ld, uint64_t seed, int32_t *inputs, int32_t *targets,
                      uint64_t first) {
  size_t B = r->eo.micro_batch;
  if (!r->mlm) return ts_loader_fill(ld, inputs, targets, first, B);
  return ts_mlm_fill(ld, &r->mlm_spec, seed, r->mlm_scratch, inputs, targets, first, B,
                     r->eo.seq);
}

/* Mean validation loss over the first eval_batches global batches of
 * N * B sequences: rank r evaluates its B of each, and the loss sums and
 * counts are summed over ranks (the same sequences whatever N). A masked
 * LM also gets *accuracy, the fraction of masked tokens predicted (else
 * -1). */
static ts_status evaluate(run *r, double *val_loss, double *accuracy) {
  size_t B = r->eo.micro_batch, NB = B * (size_t)r->dp_size;
  size_t windows = ts_loader_num_windows(r->val_ld);
  size_t batches = r->cfg->eval_batches;
  if (batches * NB > windows) batches = windows / NB;
  double sums[3] = {0, 0, 0}; /* loss sum, target count, targets predicted */
  for (size_t i = 0; i < batches; i++) {
    double s;
    size_t c, ok = 0;
    uint64_t first = (uint64_t)i * NB + (uint64_t)r->rank * B;
    TS_CHECK(fill(r, r->val_ld, VAL_MASK_SEED, r->inputs, r->targets, first));
    TS_CHECK(ts_engine_eval_accuracy(r->engine, r->inputs, r->targets, &s, &c,
                                     r->mlm ? &ok : NULL));
    sums[0] += s;
    sums[1] += (double)c;
    sums[2] += (double)ok;
  }
  TS_CHECK(ts_comm_all_reduce_f64(r->dp, sums, 3, TS_COMM_SUM));
  *val_loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  *accuracy = !r->mlm ? -1.0 : sums[1] > 0 ? sums[2] / sums[1] : 0.0;
  return TS_OK;
}

/* Appends one line (printf-style, library terms) to r->notes, what the
 * run says beside its work (ts_train_result.notes). */
void ts_train_note(run *r, const char *fmt, ...) {
  size_t n = strlen(r->notes);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->notes + n, sizeof r->notes - n, fmt, ap);
  va_end(ap);
  n = strlen(r->notes);
  if (n + 1 < sizeof r->notes) snprintf(r->notes + n, sizeof r->notes - n, "\n");
}

/* The data's meta.json (ts_data_meta_read) against the model: a masked-LM
 * model needs meta.json of `prepare --mlm` whose [PAD] and [SEP] are the
 * model's, and room for [CLS] and [SEP] in `seq` (then the scratch of
 * ts_mlm_fill); a causal LM refuses masked-LM data. Either way the model
 * must cover the tokenizer's vocabulary. A causal LM's data without
 * meta.json (llm.c's shards) is said in r->notes: its token ids are still
 * checked against the model's vocabulary as the files open. */
static ts_status check_data(run *r) {
  const char *dir = r->cfg->data_dir;
  const ts_model *m = &r->model;
  ts_data_meta meta;
  TS_CHECK(ts_data_meta_read(dir, &meta));
  if (!meta.present && r->mlm)
    return ts_set_error(TS_ERR_IO,
                        "%s/meta.json: missing: expected the meta.json of prepare with `mlm` (a "
                        "masked-LM model needs its special ids)",
                        dir);
  if (!meta.present) {
    ts_train_note(r,
                  "note: %s has no meta.json (not from tessera prepare): the tokenizer is not "
                  "checked, only that every token id is below the model's vocab_size %zu",
                  dir, m->vocab_size);
    return TS_OK;
  }
  if (r->mlm && !meta.mlm)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s/meta.json: field \"mlm\" %s: expected true (a masked-LM model needs "
                        "data from prepare with `mlm`)",
                        dir, meta.mlm_given ? "is false" : "missing");
  if (!r->mlm && meta.mlm)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: a causal LM: expected data prepared without `mlm`, but %s/meta.json "
                        "says \"mlm\": true",
                        ts_model_origin(m), dir);
  if (meta.vocab_size > m->vocab_size)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: vocab_size %zu: expected at least %s/meta.json's %zu",
                        ts_model_origin(m), m->vocab_size, dir, meta.vocab_size);
  if (!r->mlm) return TS_OK;
  ts_mlm_spec *s = &r->mlm_spec;
  *s = meta.spec;
  if (s->pad_id != m->pad_token_id || s->sep_id != m->sep_token_id)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: pad_token_id %d, sep_token_id %d: expected those of %s/meta.json "
                        "([PAD] %d, [SEP] %d)",
                        ts_model_origin(m), (int)m->pad_token_id, (int)m->sep_token_id, dir,
                        (int)s->pad_id, (int)s->sep_id);
  if (r->eo.seq < 3)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`seq` %zu: expected at least 3 for a masked LM ([CLS] text [SEP])",
                        r->eo.seq);
  r->mlm_scratch = malloc(ts_mlm_scratch_elems(r->eo.micro_batch, r->eo.seq) * sizeof(int32_t));
  if (!r->mlm_scratch) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "masked-LM batch scratch");
  return TS_OK;
}

static ts_status setup(run *r) {
  const ts_train_config *cfg = r->cfg;
  char path[4096];
  if (r->wrank == 0 && cfg->save_dir) TS_CHECK(ts_check_writable(cfg->save_dir, "`save_dir`", 1));
  if (r->wrank == 0 && cfg->trace_path)
    TS_CHECK(ts_check_writable(cfg->trace_path, "`trace_path`", 0));
  int P = r->eo.pipeline_stages;
  TS_CHECK(ts_engine_check_pipeline_stages(P));
  if (P > 1) { /* the grid: P stages of dp ranks (P must divide the world) */
    TS_CHECK(ts_grid_make(r->world, P, &r->grid));
    r->dp = r->grid.dp_group;
    r->rank = r->grid.dp_rank;
    r->dp_size = r->grid.dp;
  }
  TS_CHECK(ts_engine_check_shard_group(&r->eo, r->dp_size)); /* hybrid: S divides dp */
  TS_CHECK(ts_train_resolve_batch((size_t)r->dp_size, &r->global_batch, &r->eo));
  TS_CHECK(ts_model_resolve(cfg->model, r->model_path, sizeof r->model_path));
  TS_CHECK(ts_model_load(r->model_path, &r->model));
  TS_CHECK(ts_model_set_fp8(&r->model, cfg->fp8, r->eo.dtype));
  if (cfg->fp8 && (r->eo.schedule == TS_SCHEDULE_ZB_H1 || r->eo.schedule == TS_SCHEDULE_ZBV))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`fp8` %s: `schedule` %s defers weight gradients, which have no fp8 form: "
                        "expected gpipe, 1f1b or interleaved",
                        ts_fp8_scaling_name(cfg->fp8), ts_schedule_kind_name(r->eo.schedule));
  if (cfg->fp8 && (r->eo.micro_batch * r->eo.seq) % 16)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`fp8` %s: `micro_batch` %zu x `seq` %zu = %zu tokens per product: expected "
                        "a multiple of 16",
                        ts_fp8_scaling_name(cfg->fp8), r->eo.micro_batch, r->eo.seq,
                        r->eo.micro_batch * r->eo.seq);
  if (cfg->save_dir) TS_CHECK(ts_read_file(r->model_path, &r->model_text, &r->model_len));
  TS_CHECK(ts_engine_pipeline_split(&r->model, &r->eo, r->split));
  TS_CHECK(ts_train_open_resume(r, (size_t)-1));
  size_t V = r->model.vocab_size, T = r->eo.seq, NB = r->eo.micro_batch * (size_t)r->dp_size;
  snprintf(path, sizeof path, "%s/train.bin", cfg->data_dir);
  TS_CHECK(ts_token_file_open(&r->train, path, V));
  snprintf(path, sizeof path, "%s/val.bin", cfg->data_dir);
  TS_CHECK(ts_token_file_open(&r->val, path, V));
  r->mlm = r->model.objective == TS_OBJECTIVE_MASKED_LM;
  TS_CHECK(check_data(r));
  TS_CHECK(ts_train_check_resume_data(r));
  size_t W = r->mlm ? T - 2 : T; /* a masked-LM sequence is [CLS] window [SEP] */
  TS_CHECK(ts_loader_init(&r->train_ld, r->train, W, r->eo.seed, 1));
  TS_CHECK(ts_loader_init(&r->val_ld, r->val, W, 0, 0));
  if (ts_loader_num_windows(r->val_ld) < NB)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s/val.bin: %zu windows of `seq` %zu: expected at least %d ranks x "
                        "`micro_batch` %zu = %zu",
                        cfg->data_dir, ts_loader_num_windows(r->val_ld), T, r->dp_size,
                        r->eo.micro_batch, NB);
  TS_CHECK(ts_check_node_fits(&r->model, &r->eo, (size_t)r->dp_size,
                              r->eo.pipeline_stages > 1 ? r->grid.stage : 0));
  if (P > 1) TS_CHECK(ts_engine_create_pipeline(&r->engine, &r->model, &r->eo, &r->grid));
  else TS_CHECK(ts_engine_create(&r->engine, &r->model, &r->eo, r->dp));
  ts_engine_batch(r->engine, &r->inputs, &r->targets);
  if (r->ck) { /* every rank checks its share of the files, then loads its parts */
    double t0 = now_s();
    TS_CHECK(ts_train_verify_resume(r));
    if (!strcmp(r->cfg->resume, "auto")) ts_train_note_redone(r);
    TS_CHECK(ts_checkpoint_load(r->ck, r->engine));
    r->load_seconds = now_s() - t0;
  } else if (cfg->init_from) {
    TS_CHECK(ts_checkpoint_import_hf(r->engine, cfg->init_from));
  }
  if (cfg->trace_path) {
    TS_CHECK(ts_trace_new(&r->trace));
    ts_engine_set_trace(r->engine, r->trace);
  }
  return TS_OK;
}

/* Rank 0 opens the metrics file, truncating it: only once every rank's
 * setup succeeded, so that a failed start leaves an earlier run's file as
 * it was. */
static ts_status open_metrics(run *r) {
  int lead = r->wrank == 0;
  TS_CHECK(ts_metrics_open(&r->metrics, lead ? r->cfg->metrics_path : NULL, r->ck != NULL,
                           lead ? r->cfg->tensorboard_dir : NULL));
  return r->ck ? ts_metrics_write_resume(r->metrics, r->start, ts_checkpoint_dir(r->ck)) : TS_OK;
}

/* Agreement on this rank's status st over the world (ts_comm_agree): if
 * any rank failed, every rank returns an error and the lowest failing rank
 * keeps its own message; res (NULL: a save's) records that setup failed
 * and whether elsewhere. */
static ts_status agree(run *r, ts_status st, ts_train_result *res, const char *what) {
  int first;
  ts_status out = ts_comm_agree(r->world, st, what, &first);
  if (res && first >= 0) {
    res->setup_failed = 1;
    res->failed_elsewhere = first != r->wrank;
  }
  return out;
}

/* A save's failure that every rank returns (agreed: its folder, its files,
 * its commit, the prune) stops every rank at the same point, so no rank
 * aborts and only `first`, the lowest failing rank, reports it; first < 0
 * (not agreed) leaves res as it is. Returns st. */
static ts_status save_failed(run *r, ts_status st, int first, ts_train_result *res) {
  if (st != TS_OK && first >= 0) {
    res->failed_together = 1;
    res->failed_elsewhere = first != r->wrank;
  }
  return st;
}

/* agree() for a step of a save, its failure marked by save_failed. */
static ts_status agree_save(run *r, ts_status st, ts_train_result *res, const char *what) {
  int first;
  st = ts_comm_agree(r->world, st, what, &first);
  return save_failed(r, st, first, res);
}

/* Setup on every rank, agreed; then the metrics file, agreed. */
static ts_status setup_agreed(run *r, ts_train_result *res) {
  TS_CHECK(agree(r, setup(r), res, "during setup"));
  return agree(r, open_metrics(r), res, "during setup");
}

static ts_status eval_and_log(run *r, size_t step, ts_train_callback cb, void *user,
                              double *val, double *accuracy) {
  TS_CHECK(evaluate(r, val, accuracy));
  if (r->wrank != 0) return TS_OK;
  TS_CHECK(ts_metrics_write_eval(r->metrics, step, *val, *accuracy));
  if (cb) {
    ts_train_event ev;
    memset(&ev, 0, sizeof ev);
    ev.is_eval = 1;
    ev.step = step;
    ev.steps = r->cfg->steps;
    ev.loss = *val;
    ev.accuracy = *accuracy;
    cb(&ev, user);
  }
  return TS_OK;
}

/* This process's peak resident set size (getrusage ru_maxrss, KiB on
 * Linux), bytes: everything the ledger holds plus what it does not (code,
 * MPI and OpenBLAS buffers, the data loader, the allocator's slack). */
static double peak_rss_bytes(void) {
  struct rusage ru;
  return getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss * 1024.0 : 0.0;
}

/* The summary line (rank 0 writes; every rank contributes its memory and
 * its step times). */
static ts_status write_summary(run *r, ts_train_result *res) {
  enum { W = TS_METRICS_RANK_FIELDS };
  size_t n = (size_t)r->world_size * W;
  double *mem = calloc(n, sizeof *mem);
  if (!mem) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "summary: %zu doubles", n);
  const ts_mem_account *l = ts_engine_memory(r->engine);
  double *row = mem + (size_t)r->wrank * W;
  for (int c = 0; c < TS_MEM_NUM_CATEGORIES; c++) row[c] = (double)l->peak[c];
  row[TS_METRICS_TOTAL] = (double)l->peak_total;
  row[TS_METRICS_PEAK_RSS] = peak_rss_bytes();
  row[TS_METRICS_MODEL_STATES] = (double)ts_mem_model_state_bytes(l);
  row[TS_METRICS_STEP_S] = ts_metrics_median(r->times, r->timed, 3, 0);
  row[TS_METRICS_COMPUTE_S] = ts_metrics_median(r->times, r->timed, 3, 1);
  row[TS_METRICS_WAIT_S] = ts_metrics_median(r->times, r->timed, 3, 2);
  /* Each rank fills its own row, the rest are zero: the sum is a gather
   * (exact: x + 0 is x). */
  ts_status st = ts_comm_all_reduce_f64(r->world, mem, n, TS_COMM_SUM);
  if (st == TS_OK &&
      !ts_metrics_straggler(mem, r->world_size, TS_TRAIN_STRAGGLER_RATIO, &res->slowest_rank,
                            &res->slowest_compute_s, &res->ranks_compute_median_s))
    res->slowest_rank = -1;
  ts_device_report dev;
  if (st == TS_OK && r->eo.device != TS_DEVICE_CPU) st = ts_engine_device_report(r->engine, &dev);
  if (st == TS_OK && r->wrank == 0) {
    ts_metrics_summary s = {
        .params_unpadded = res->num_params,
        .params_padded = res->padded_params,
        .world_size = r->world_size,
        .dp_size = r->dp_size,
        .split = r->split,
        .opts = &r->eo,
        .activation_bytes_predicted = ts_engine_activation_bytes(&r->model, &r->eo),
        .skipped_steps = res->skipped_steps,
        .loss_scale = ts_engine_loss_scale(r->engine),
        .global_batch = r->global_batch,
        .last = &r->last,
        .mem = mem,
        .device = r->eo.device != TS_DEVICE_CPU ? &dev : NULL,
        .host = r->eo.device != TS_DEVICE_CPU ? ts_engine_host_memory(r->engine) : NULL,
        .slowest_rank = res->slowest_rank,
        .straggler_ratio = TS_TRAIN_STRAGGLER_RATIO,
    };
    st = ts_metrics_write_summary(r->metrics, &s);
  }
  free(mem);
  return st;
}

/* The step's batch source (ts_engine_batch_fn): micro-batch mb of this dp
 * rank's share of the global batch of step `step`, the same on every
 * pipeline stage. */
typedef struct feed {
  run *r;
  size_t step; /* 1-based */
} feed;

static ts_status fill_micro_batch(void *user, int mb, int32_t *inputs, int32_t *targets) {
  const feed *f = user;
  const ts_engine_opts *eo = &f->r->eo;
  uint64_t k = ts_loader_sample_index(f->step - 1, (size_t)mb, eo->grad_accum,
                                      (size_t)f->r->rank, (size_t)f->r->dp_size, eo->micro_batch);
  return fill(f->r, f->r->train_ld, eo->seed, inputs, targets, k);
}

/* Commits the asynchronous save in flight, waiting for its writers
 * (collective), then keeps the newest cfg->keep. None in flight: TS_OK. */
static ts_status finish_pending(run *r, ts_train_result *res) {
  if (!r->pending) return TS_OK;
  ts_checkpoint_pending *p = r->pending;
  r->pending = NULL;
  ts_status st = ts_checkpoint_finish(p);
  TS_CHECK(save_failed(r, st, ts_checkpoint_failed_rank(), res));
  snprintf(res->saved, sizeof res->saved, "%s", r->pending_dir);
  return agree_save(r, r->wrank == 0 ? ts_checkpoint_prune(r->cfg->save_dir, r->cfg->keep) : TS_OK,
                    res, "to prune the checkpoints");
}

/* At a step boundary: commits the save in flight once every rank's writer
 * is done (a MIN all-reduce of one flag, only while a save is in flight),
 * so no rank waits on another's disk. */
static ts_status poll_pending(run *r, ts_train_result *res) {
  if (!r->pending) return TS_OK;
  double done = ts_checkpoint_written(r->pending);
  TS_CHECK(ts_comm_all_reduce_f64(r->world, &done, 1, TS_COMM_MIN));
  return done > 0 ? finish_pending(r, res) : TS_OK;
}

/* Saves the state after `step` into save_dir/step-NNNNNNNN, then keeps the
 * newest cfg->keep. Collective over the world. Asynchronous (eo.async_save):
 * the previous save is committed first (waiting for its writers if they
 * are not done), then this rank's state is staged and written in the
 * background; poll_pending or finish_pending commits it. Training waits
 * (res->save_seconds) for the whole save when synchronous, for the staging
 * copy (on the CPU only if the next optimizer step comes before it is
 * done, see checkpoint.h) and any unfinished previous write when
 * asynchronous. */
static ts_status save(run *r, size_t step, ts_train_result *res) {
  const ts_train_config *cfg = r->cfg;
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/step-%08zu", cfg->save_dir, step);
  char *tj = NULL;
  ts_status st = TS_OK;
  if (r->wrank == 0) {
    if (mkdir(cfg->save_dir, 0777) != 0 && errno != EEXIST)
      st = ts_set_error(TS_ERR_IO, "`save_dir` %s: cannot create the folder: %s", cfg->save_dir,
                        strerror(errno));
    else if (!(tj = ts_trainer_state_json(r->cfg, &r->eo, step, r->global_batch, r->world_size,
                                          r->last.loss, ts_engine_loss_scale(r->engine),
                                          ts_token_file_num_tokens(r->train))))
      st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "trainer.json");
  }
  TS_CHECK(agree_save(r, st, res, "to save a checkpoint"));
  ts_checkpoint_extra ex[2] = {{"trainer.json", tj, tj ? strlen(tj) : 0},
                               {"config.json", r->model_text, r->model_len}};
  size_t n_extra = r->wrank == 0 ? 2 : 0;
  double t0 = now_s();
  if (r->eo.async_save) {
    st = finish_pending(r, res);
    res->save_wait_seconds += now_s() - t0;
    if (st == TS_OK)
      st = ts_checkpoint_save_async(r->engine, r->world, dir, ex, n_extra, &r->pending);
    if (st == TS_OK) snprintf(r->pending_dir, sizeof r->pending_dir, "%s", dir);
  } else {
    st = ts_checkpoint_save(r->engine, r->world, dir, ex, n_extra);
  }
  res->save_seconds += now_s() - t0;
  res->saves++;
  free(tj);
  TS_CHECK(save_failed(r, st, ts_checkpoint_failed_rank(), res));
  if (r->eo.async_save) return TS_OK;
  snprintf(res->saved, sizeof res->saved, "%s", dir);
  return agree_save(r, r->wrank == 0 ? ts_checkpoint_prune(cfg->save_dir, cfg->keep) : TS_OK, res,
                    "to prune the checkpoints");
}

/* save_dir/progress.json, {"step": N}: the last step this run finished,
 * so that a restart can say how many steps it redoes (trainer_resume.c).
 * Written by rename without a flush to the disk (it is a hint, every
 * step: a crash may leave an older step in it); failures are ignored. */
static void write_progress(const char *save_dir, size_t step) {
  char path[4200], tmp[4220];
  snprintf(path, sizeof path, "%s/" TS_TRAIN_PROGRESS, save_dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return;
  int ok = fprintf(f, "{\"step\": %zu}\n", step) > 0;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) unlink(tmp);
}

/* Whether any rank was asked to stop (cfg->stop), agreed over the world:
 * the largest ts_train_stop kind any rank holds, else 0. */
static ts_status stop_requested(run *r, int *stop) {
  *stop = 0;
  if (!r->cfg->stop) return TS_OK;
  double f = __atomic_load_n(r->cfg->stop, __ATOMIC_ACQUIRE); /* another thread sets it */
  TS_CHECK(ts_comm_all_reduce_f64(r->world, &f, 1, TS_COMM_MAX));
  *stop = (int)f;
  return TS_OK;
}

/* cfg->sample at `step`: every rank gathers the weights (engine/host_weights.h),
 * rank 0 keeps them and calls the sample. */
static ts_status sample(run *r, size_t step) {
  ts_host_weights w;
  ts_status st = ts_host_weights_alloc(&w, &r->model, r->wrank == 0);
  st = agree(r, st, NULL, "sample"); /* every rank gathers, or none */
  if (st == TS_OK) st = ts_host_weights_gather(&w, r->engine);
  if (st == TS_OK && r->wrank == 0)
    st = r->cfg->sample(r->cfg->sample_user, step, &r->model, ts_host_weights_read, &w);
  st = agree(r, st, NULL, "sample");
  ts_host_weights_free(&w);
  return st;
}

static ts_status train(run *r, ts_train_callback cb, void *user, ts_train_result *res) {
  const ts_train_config *cfg = r->cfg;
  const ts_engine_opts *eo = &r->eo;
  size_t tokens_per_step = r->global_batch * eo->seq;
  double flops_per_token = ts_model_flops_per_token(&r->model, eo->seq);
  double t_loop = now_s(), tok_s_sum = 0;
  size_t timed = 0;
  res->resumed_from = r->start;
  snprintf(res->notes, sizeof res->notes, "%s", r->notes);
  if (r->ck) { /* the load's time (the slowest rank) and bytes (all ranks) */
    ts_checkpoint_info info;
    ts_checkpoint_get_info(r->ck, &info);
    double t = r->load_seconds, b = (double)info.bytes_read;
    TS_CHECK(ts_comm_all_reduce_f64(r->world, &t, 1, TS_COMM_MAX));
    TS_CHECK(ts_comm_all_reduce_f64(r->world, &b, 1, TS_COMM_SUM));
    res->load_seconds = t;
    res->load_bytes = b;
  }
  size_t bad_in_a_row = 0; /* fp32/bf16 steps skipped for non-finite values */
  r->times = calloc(3 * (cfg->steps - r->start) + 3, sizeof *r->times);
  if (!r->times) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "step times: %zu steps", cfg->steps);
  double ops_t0 = 0; /* where the op times start (step 2; kernels.h ts_k_op_times) */
  for (size_t step = r->start + 1; step <= cfg->steps; step++) {
    double t0 = now_s(), w0 = ts_comm_wait_seconds();
    if (step == r->start + 2) ts_k_op_times_reset(), ops_t0 = t0;
    float lr = ts_train_lr(step, cfg->steps, cfg->warmup, cfg->lr, cfg->min_lr_ratio);
    ts_step_stats st;
    feed f = {r, step};
    ts_comm_context ctx = {(long long)step, -1, -1, -1}; /* the watchdog's line */
    ts_comm_set_context(&ctx);
    ts_status sst = ts_engine_step(r->engine, fill_micro_batch, &f, lr, &st);
    ts_comm_set_context(&ctx); /* the saves and evaluations after it: no unit */
    /* TS_ERR_NUMERIC (fp16 overflow at the minimum loss scale) is agreed by
     * every rank: the step's line is still written, then training stops. */
    if (sst != TS_OK && sst != TS_ERR_NUMERIC) return sst;
    r->last = st;
    res->skipped_steps += (size_t)st.skipped;
    double dt = now_s() - t0, wait = ts_comm_wait_seconds() - w0;
    double *row = r->times + 3 * r->timed++;
    row[0] = dt;
    row[1] = dt > wait ? dt - wait : 0; /* compute: the step less its waits */
    row[2] = wait;
    double tok_s = (double)tokens_per_step / dt;
    if (step > r->start + 1 || cfg->steps == r->start + 1) {
      tok_s_sum += tok_s;
      timed++;
    }
    if (step == r->start + 1) res->first_loss = st.loss;
    res->final_loss = st.loss;
    if (r->wrank == 0) {
      ts_metrics_step ms = {step,   lr,     tok_s, tok_s * flops_per_token / 1e9,
                            dt,     row[1], row[2], ts_engine_memory(r->engine),
                            cfg->peak_flops};
      TS_CHECK(ts_metrics_write_step(r->metrics, &ms, &st));
      if (cb) {
        ts_train_event ev;
        memset(&ev, 0, sizeof ev);
        ev.step = step;
        ev.steps = cfg->steps;
        ev.loss = st.loss;
        ev.grad_norm = st.grad_norm;
        ev.lr = st.lr;
        ev.tokens_per_s = tok_s;
        ev.gflops = tok_s * flops_per_token / 1e9;
        ev.loss_scale = st.loss_scale;
        ev.next_loss_scale = st.next_loss_scale;
        ev.skipped = st.skipped;
        ev.overflow_tensor = st.overflow_tensor;
        cb(&ev, user);
      }
    }
    /* A run that diverged: every rank saw the same skip (the decision is
     * agreed), so every rank stops here, before any save. */
    int bad = st.skipped && eo->dtype != TS_FP16;
    bad_in_a_row = bad ? bad_in_a_row + 1 : 0;
    if (sst == TS_OK && cfg->max_bad_steps && bad_in_a_row >= cfg->max_bad_steps)
      sst = ts_set_error(TS_ERR_NUMERIC,
                         "step %zu: %zu steps in a row with a non-finite loss or gradient "
                         "(`max_bad_steps` %zu), the last in %s: training stopped, nothing saved "
                         "after step %zu",
                         step, bad_in_a_row, cfg->max_bad_steps, st.overflow_tensor,
                         step - bad_in_a_row);
    if (sst != TS_OK) {
      res->failed_together = 1;
      res->failed_elsewhere = r->wrank != 0; /* rank 0 reports */
      return sst;
    }
    int stop;
    TS_CHECK(stop_requested(r, &stop));
    TS_CHECK(poll_pending(r, res));
    /* a skipped bad step changed nothing: no checkpoint of it */
    if (cfg->save_dir && !bad &&
        (stop || step == cfg->steps || (cfg->save_every && step % cfg->save_every == 0)))
      TS_CHECK(save(r, step, res));
    if (cfg->save_dir && r->wrank == 0) write_progress(cfg->save_dir, step);
    const ts_engine_hooks *h = ts_engine_get_hooks(); /* the test seam */
    if (h && h->after_step) h->after_step(h->user, step, r->wrank);
    if (stop && step < cfg->steps) { /* at the last step the run ends as finished */
      double t0 = now_s();
      TS_CHECK(finish_pending(r, res));
      res->save_tail_seconds += now_s() - t0;
      res->save_seconds += ts_checkpoint_staging_wait_seconds(r->engine);
      res->stopped_at = step;
      res->stop_kind = stop;
      res->seconds = now_s() - t_loop;
      res->memory = *ts_engine_memory(r->engine);
      res->disk = *ts_engine_disk(r->engine);
      res->host = *ts_engine_host_memory(r->engine);
      return TS_OK;
    }
    double val, acc;
    if (cfg->eval_every && step % cfg->eval_every == 0 && step != cfg->steps)
      TS_CHECK(eval_and_log(r, step, cb, user, &val, &acc));
    if (cfg->sample && cfg->sample_every && step % cfg->sample_every == 0 && step != cfg->steps)
      TS_CHECK(sample(r, step));
  }
  res->seconds = now_s() - t_loop;
  if (ops_t0 > 0) ts_k_op_times(res->op_seconds), res->op_wall_seconds = now_s() - ops_t0;
  res->tokens_per_s = timed ? tok_s_sum / (double)timed : 0;
  res->gflops = res->tokens_per_s * flops_per_token / 1e9;
  res->comm_bytes_per_step = r->last.comm_bytes;
  res->comm_remote_bytes_per_step = r->last.comm_remote_bytes;
  ts_engine_set_trace(r->engine, NULL); /* the final evaluation is not traced */
  TS_CHECK(eval_and_log(r, cfg->steps, cb, user, &res->final_val_loss,
                        &res->final_val_accuracy));
  if (cfg->sample && cfg->sample_every) TS_CHECK(sample(r, cfg->steps));
  double t0 = now_s(); /* the last save's write, overlapped with the evaluation */
  TS_CHECK(finish_pending(r, res));
  res->save_tail_seconds += now_s() - t0;
  /* the optimizer steps' waits for the copies (CPU: made beside forward and backward) */
  res->save_seconds += ts_checkpoint_staging_wait_seconds(r->engine);
  res->memory = *ts_engine_memory(r->engine);
  res->disk = *ts_engine_disk(r->engine);
  res->host = *ts_engine_host_memory(r->engine);
  if (r->trace) TS_CHECK(ts_trace_write(r->trace, r->world, cfg->trace_path));
  return write_summary(r, res);
}

/* Checks of cfg alone, before any rank does work. */
static ts_status check_config(const ts_train_config *cfg) {
  if (!cfg->model || !cfg->data_dir)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "train: `model` and `data_dir` are required");
  if (cfg->steps == 0) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "`steps` 0: expected >= 1");
  if (cfg->eval_batches == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "`eval_batches` 0: expected >= 1");
  if (cfg->sample_every && cfg->engine.pipeline_stages > 1)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`sample_every` with `pipeline_stages` %d: not supported yet (a sample "
                        "needs every stage's weights on rank 0), expected `pipeline_stages` 1",
                        cfg->engine.pipeline_stages);
  const char *paths[] = {cfg->save_dir, cfg->trace_path, cfg->metrics_path};
  const char *names[] = {"save_dir", "trace_path", "metrics_path"};
  for (int i = 0; i < 3; i++)
    if (paths[i] && !paths[i][0])
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "`%s` \"\": expected a path", names[i]);
  return TS_OK;
}

ts_status ts_train_parse_recompute(const char *s, size_t *every) {
  char *end;
  if (!strcmp(s, "none")) *every = 0;
  else if (!strcmp(s, "all")) *every = 1;
  else if (!strncmp(s, "every:", 6) && s[6] >= '1' && s[6] <= '9' &&
           (*every = strtoull(s + 6, &end, 10), *end == '\0'))
    ;
  else
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "activation checkpointing %s: expected none, all or every:K with K >= 1",
                        s);
  return TS_OK;
}

void ts_train_recompute_name(size_t every, char *buf, size_t cap) {
  if (every == 0) snprintf(buf, cap, "none");
  else if (every == 1) snprintf(buf, cap, "all");
  else snprintf(buf, cap, "every:%zu", every);
}

ts_status ts_train_run(const ts_train_config *cfg, ts_train_callback cb, void *user,
                       ts_train_result *result) {
  memset(result, 0, sizeof *result);
  ts_status cst = check_config(cfg);
  if (cst != TS_OK) { /* every rank fails alike: agreed without a collective */
    result->setup_failed = 1;
    result->failed_elsewhere = cfg->dp && ts_comm_rank(cfg->dp) != 0; /* rank 0 reports */
    return cst;
  }
  run r;
  memset(&r, 0, sizeof r);
  r.cfg = cfg;
  r.eo = cfg->engine;
  r.eo.async_save = cfg->save_dir && cfg->save_async; /* the staging only where saves happen */
  r.global_batch = cfg->global_batch;
  ts_status st = cfg->dp ? TS_OK : ts_comm_self(&r.own_comm);
  ts_comm_context setup = {0, -1, -1, -1}; /* the watchdog's line: "during setup" */
  ts_comm_set_context(&setup);
  result->slowest_rank = -1;
  if (st == TS_OK) {
    r.world = r.dp = cfg->dp ? cfg->dp : r.own_comm;
    r.wrank = r.rank = ts_comm_rank(r.dp);
    r.world_size = r.dp_size = ts_comm_size(r.dp);
    result->world_size = r.world_size;
    st = setup_agreed(&r, result);
  }
  if (st == TS_OK) {
    result->num_params = r.model.num_params;
    result->global_batch = r.global_batch;
    for (int u = 0; u < r.model.n_units && st == TS_OK; u++) {
      ts_flat_layout l; /* whichever pipeline stage holds the unit */
      st = ts_engine_unit_layout(&r.model, u, (size_t)r.dp_size, &l);
      if (st == TS_OK) result->padded_params += l.padded;
    }
    int P = r.eo.pipeline_stages * (r.eo.pipeline_stages > 1 ? ts_engine_opts_chunks(&r.eo) : 1);
    memcpy(result->pipeline_split, r.split, (size_t)(P + 1) * sizeof(int));
    if (st == TS_OK) st = train(&r, cb, user, result);
  }
  run_free(&r);
  return st;
}
