/* metrics.c — the JSON Lines records of a training run (metrics.h), built
 * with cJSON. Numbers print with enough digits to round-trip (cJSON's
 * %1.15g, then %1.17g when that loses bits), so a run's losses compare
 * bitwise from its file. */
#include "engine/metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tensorboard.h"
#include "engine/trainer.h"

struct ts_metrics {
  FILE *f;            /* NULL: the sink */
  char *path;         /* for messages (owned) */
  ts_tensorboard *tb; /* the event file, or NULL */
};

ts_status ts_metrics_open(ts_metrics **out, const char *path, int append,
                          const char *tensorboard_dir) {
  *out = NULL;
  ts_metrics *m = calloc(1, sizeof *m);
  if (!m) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "metrics: cannot allocate");
  if (tensorboard_dir) {
    ts_status st = ts_tensorboard_open(&m->tb, tensorboard_dir);
    if (st != TS_OK) {
      free(m);
      return st;
    }
  }
  if (path) {
    m->path = strdup(path);
    m->f = m->path ? fopen(path, append ? "a" : "w") : NULL;
    if (!m->f) {
      ts_status st = ts_set_error(TS_ERR_IO, "%s: cannot open for writing: %s", path,
                                  strerror(m->path ? errno : ENOMEM));
      free(m->path);
      ts_tensorboard_close(m->tb);
      free(m);
      return st;
    }
  }
  *out = m;
  return TS_OK;
}

void ts_metrics_close(ts_metrics *m) {
  if (!m) return;
  if (m->f) fclose(m->f);
  ts_tensorboard_close(m->tb);
  free(m->path);
  free(m);
}

/* Appends obj (consumed) as one flushed line; the sink drops it. */
static ts_status write_line(ts_metrics *m, cJSON *obj) {
  if (!m->f) {
    cJSON_Delete(obj);
    return TS_OK;
  }
  char *s = cJSON_PrintUnformatted(obj);
  cJSON_Delete(obj);
  if (!s) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot format a metrics line", m->path);
  int bad = fprintf(m->f, "%s\n", s) < 0 || fflush(m->f) != 0;
  free(s);
  if (bad) return ts_set_error(TS_ERR_IO, "%s: write failed: %s", m->path, strerror(errno));
  return TS_OK;
}

/* The step's TensorBoard scalars, flushed (metrics.h). */
static ts_status tensorboard_step(ts_tensorboard *tb, const ts_metrics_step *s,
                                  const ts_step_stats *st) {
  int64_t k = (int64_t)s->step;
  TS_CHECK(ts_tensorboard_scalar(tb, "train/loss", k, st->loss));
  TS_CHECK(ts_tensorboard_scalar(tb, "train/lr", k, s->lr));
  if (!st->skipped) TS_CHECK(ts_tensorboard_scalar(tb, "train/grad_norm", k, st->grad_norm));
  TS_CHECK(ts_tensorboard_scalar(tb, "train/loss_scale", k, st->loss_scale));
  TS_CHECK(ts_tensorboard_scalar(tb, "perf/tokens_per_s", k, s->tokens_per_s));
  TS_CHECK(ts_tensorboard_scalar(tb, "perf/gflops", k, s->gflops));
  if (s->peak_flops > 0)
    TS_CHECK(ts_tensorboard_scalar(tb, "perf/mfu", k, s->gflops * 1e9 / s->peak_flops));
  if (s->memory) {
    char tag[64];
    for (int c = 0; c < TS_MEM_NUM_CATEGORIES; c++) {
      snprintf(tag, sizeof tag, "memory/%s_MiB", ts_mem_category_name((ts_mem_category)c));
      TS_CHECK(ts_tensorboard_scalar(tb, tag, k, (double)s->memory->current[c] / 1048576.0));
    }
    TS_CHECK(ts_tensorboard_scalar(tb, "memory/peak_MiB", k,
                                   (double)s->memory->peak_total / 1048576.0));
  }
  return ts_tensorboard_flush(tb);
}

ts_status ts_metrics_write_step(ts_metrics *m, const ts_metrics_step *s, const ts_step_stats *st) {
  if (m->tb) TS_CHECK(tensorboard_step(m->tb, s, st));
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "step", (double)s->step);
  cJSON_AddNumberToObject(o, "loss", st->loss);
  cJSON_AddNumberToObject(o, "lr", s->lr);
  cJSON_AddNumberToObject(o, "grad_norm", st->grad_norm);
  cJSON_AddNumberToObject(o, "tokens_per_s", s->tokens_per_s);
  cJSON_AddNumberToObject(o, "gflops", s->gflops);
  cJSON_AddNumberToObject(o, "step_seconds", s->seconds);
  cJSON_AddNumberToObject(o, "compute_seconds", s->compute_seconds);
  cJSON_AddNumberToObject(o, "wait_seconds", s->wait_seconds);
  cJSON_AddNumberToObject(o, "comm_bytes", (double)st->comm_bytes);
  cJSON_AddNumberToObject(o, "comm_bytes_across_nodes", (double)st->comm_remote_bytes);
  cJSON_AddNumberToObject(o, "loss_scale", st->loss_scale);
  cJSON_AddNumberToObject(o, "skipped", st->skipped);
  if (st->skipped) {
    cJSON *ov = cJSON_AddObjectToObject(o, "overflow");
    cJSON_AddNumberToObject(ov, "unit", st->overflow_unit);
    cJSON_AddStringToObject(ov, "tensor", st->overflow_tensor);
    cJSON_AddNumberToObject(ov, "loss_scale_before", st->loss_scale);
    cJSON_AddNumberToObject(ov, "loss_scale_after", st->next_loss_scale);
  }
  return write_line(m, o);
}

ts_status ts_metrics_write_eval(ts_metrics *m, size_t step, double val_loss, double accuracy) {
  if (m->tb) {
    TS_CHECK(ts_tensorboard_scalar(m->tb, "val/loss", (int64_t)step, val_loss));
    if (accuracy >= 0)
      TS_CHECK(ts_tensorboard_scalar(m->tb, "val/accuracy", (int64_t)step, accuracy));
    TS_CHECK(ts_tensorboard_flush(m->tb));
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "step", (double)step);
  cJSON_AddNumberToObject(o, "val_loss", val_loss);
  if (accuracy >= 0) cJSON_AddNumberToObject(o, "val_accuracy", accuracy);
  return write_line(m, o);
}

ts_status ts_metrics_write_resume(ts_metrics *m, size_t step, const char *checkpoint) {
  cJSON *o = cJSON_CreateObject(), *r = cJSON_AddObjectToObject(o, "resume");
  cJSON_AddNumberToObject(r, "step", (double)step);
  cJSON_AddStringToObject(r, "checkpoint", checkpoint);
  return write_line(m, o);
}

double ts_metrics_median(const double *rows, size_t n, size_t stride, size_t col) {
  if (n == 0) return 0;
  double *v = malloc(n * sizeof *v);
  if (!v) return rows[col]; /* out of memory: the first row's */
  for (size_t i = 0; i < n; i++) v[i] = rows[stride * i + col];
  for (size_t i = 1; i < n; i++) /* insertion sort: a run's steps, a job's ranks */
    for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
      double t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  double med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  free(v);
  return med;
}

int ts_metrics_straggler(const double *mem, int world_size, double ratio, int *slowest,
                         double *slowest_s, double *median_s) {
  if (world_size < 2) return 0;
  const size_t W = TS_METRICS_RANK_FIELDS;
  int q_max = 0;
  for (int q = 1; q < world_size; q++)
    if (mem[q * W + TS_METRICS_COMPUTE_S] > mem[q_max * W + TS_METRICS_COMPUTE_S]) q_max = q;
  *slowest = q_max;
  *slowest_s = mem[q_max * W + TS_METRICS_COMPUTE_S];
  *median_s = ts_metrics_median(mem, (size_t)world_size, W, TS_METRICS_COMPUTE_S);
  return *median_s > 0 && *slowest_s > ratio * *median_s;
}

ts_status ts_metrics_write_summary(ts_metrics *m, const ts_metrics_summary *s) {
  const ts_engine_opts *eo = s->opts;
  cJSON *o = cJSON_CreateObject(), *sm = cJSON_AddObjectToObject(o, "summary");
  cJSON *p = cJSON_AddObjectToObject(sm, "params");
  cJSON_AddNumberToObject(p, "unpadded", (double)s->params_unpadded);
  cJSON_AddNumberToObject(p, "padded", (double)s->params_padded);
  cJSON_AddNumberToObject(sm, "world_size", s->world_size);
  int P = eo->pipeline_stages > 1 ? eo->pipeline_stages : 1;
  if (P > 1) {
    cJSON *pp = cJSON_AddObjectToObject(sm, "pipeline");
    cJSON_AddNumberToObject(pp, "stages", P);
    cJSON_AddStringToObject(pp, "schedule", ts_schedule_kind_name(eo->schedule));
    cJSON_AddNumberToObject(pp, "dp", s->dp_size);
    int v = ts_engine_opts_chunks(eo); /* virtual stages: ts_schedule_vstage */
    if (v > 1) cJSON_AddNumberToObject(pp, "virtual_stages", v);
    cJSON *split = cJSON_AddArrayToObject(pp, "split");
    for (int q = 0; q < P * v; q++) cJSON_AddItemToArray(split, cJSON_CreateNumber(s->split[q]));
    double m = (double)eo->grad_accum;
    cJSON_AddNumberToObject(pp, "bubble_theory",
                            ts_schedule_bubble_theory(eo->schedule, P, v, (int)m));
  }
  cJSON_AddStringToObject(sm, "device", ts_device_name(eo->device));
  if (s->device) {
    const ts_device_report *d = s->device;
    cJSON_AddStringToObject(sm, "gpu_name", d->name);
    cJSON_AddNumberToObject(sm, "gpu_index", d->index);
    cJSON *db = cJSON_AddObjectToObject(sm, "device_bytes");
    cJSON_AddNumberToObject(db, "total", (double)d->total);
    cJSON_AddNumberToObject(db, "ledger_peak", s->mem[TS_METRICS_TOTAL]);
    cJSON_AddNumberToObject(db, "used_at_create", (double)d->used_at_create);
    cJSON_AddNumberToObject(db, "used_now", (double)d->used_now);
    cJSON_AddNumberToObject(db, "reserved", (double)d->reserved);
    cJSON_AddNumberToObject(db, "overhead", (double)d->overhead);
  }
  if (s->host) { /* the host memory beside the GPU: rank 0's ledger */
    cJSON *hb = cJSON_AddObjectToObject(sm, "host_bytes");
    cJSON_AddNumberToObject(hb, "ledger_peak", (double)s->host->peak_total);
    for (int c = 0; c < TS_MEM_NUM_CATEGORIES; c++)
      if (s->host->peak[c])
        cJSON_AddNumberToObject(hb, ts_mem_category_name((ts_mem_category)c),
                                (double)s->host->peak[c]);
  }
  cJSON_AddStringToObject(sm, "offload_optimizer",
                          eo->offload_dir ? "disk" : eo->offload_optimizer ? "host" : "none");
  cJSON_AddNumberToObject(sm, "zero_stage", eo->zero_stage);
  cJSON_AddStringToObject(sm, "dtype", ts_dtype_name(eo->dtype));
  char recompute[32];
  ts_train_recompute_name(eo->recompute_every, recompute, sizeof recompute);
  cJSON_AddStringToObject(sm, "activation_checkpointing", recompute);
  cJSON_AddBoolToObject(sm, "reshard_after_forward", !eo->keep_gathered);
  cJSON_AddBoolToObject(sm, "overlap", eo->overlap);
  cJSON_AddStringToObject(sm, "comm", ts_engine_comm_name(ts_engine_comm_resolve(eo)));
  cJSON_AddStringToObject(sm, "matrix_products", ts_k_matmul_impl(eo->device, eo->dtype));
  cJSON_AddNumberToObject(sm, "activation_bytes_predicted", (double)s->activation_bytes_predicted);
  cJSON_AddNumberToObject(sm, "skipped_steps", (double)s->skipped_steps);
  cJSON_AddNumberToObject(sm, "loss_scale", s->loss_scale);
  cJSON_AddNumberToObject(sm, "micro_batch", (double)eo->micro_batch);
  cJSON_AddNumberToObject(sm, "grad_accum", (double)eo->grad_accum);
  cJSON_AddNumberToObject(sm, "global_batch", (double)s->global_batch);
  cJSON_AddNumberToObject(sm, "seq", (double)eo->seq);
  cJSON_AddNumberToObject(sm, "comm_bytes_per_step", (double)s->last->comm_bytes);
  cJSON_AddNumberToObject(sm, "comm_bytes_across_nodes_per_step",
                          (double)s->last->comm_remote_bytes);
  cJSON *kinds = cJSON_AddObjectToObject(sm, "comm_bytes_by_kind");
  for (int k = 0; k < TS_COMM_NUM_KINDS; k++)
    cJSON_AddNumberToObject(kinds, ts_comm_kind_name((ts_comm_kind)k),
                            (double)s->last->comm.bytes[k]);
  cJSON *ranks = cJSON_AddArrayToObject(sm, "mem_by_rank");
  for (int q = 0; q < s->world_size; q++) {
    const double *row = s->mem + (size_t)q * TS_METRICS_RANK_FIELDS;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "rank", q);
    cJSON_AddNumberToObject(e, "stage", q / (s->dp_size > 0 ? s->dp_size : 1));
    for (int c = 0; c < TS_MEM_NUM_CATEGORIES; c++)
      cJSON_AddNumberToObject(e, ts_mem_category_name((ts_mem_category)c), row[c]);
    cJSON_AddNumberToObject(e, "total", row[TS_METRICS_TOTAL]);
    cJSON_AddNumberToObject(e, "peak_rss", row[TS_METRICS_PEAK_RSS]);
    cJSON_AddNumberToObject(e, "model_states", row[TS_METRICS_MODEL_STATES]);
    cJSON_AddItemToArray(ranks, e);
  }
  cJSON *times = cJSON_AddArrayToObject(sm, "time_by_rank");
  for (int q = 0; q < s->world_size; q++) {
    const double *row = s->mem + (size_t)q * TS_METRICS_RANK_FIELDS;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "rank", q);
    cJSON_AddStringToObject(e, "host", ts_comm_host(q));
    cJSON_AddNumberToObject(e, "step_median_s", row[TS_METRICS_STEP_S]);
    cJSON_AddNumberToObject(e, "compute_median_s", row[TS_METRICS_COMPUTE_S]);
    cJSON_AddNumberToObject(e, "wait_median_s", row[TS_METRICS_WAIT_S]);
    cJSON_AddItemToArray(times, e);
  }
  if (s->slowest_rank >= 0) {
    cJSON *sl = cJSON_AddObjectToObject(sm, "straggler");
    const double *row = s->mem + (size_t)s->slowest_rank * TS_METRICS_RANK_FIELDS;
    cJSON_AddNumberToObject(sl, "rank", s->slowest_rank);
    cJSON_AddStringToObject(sl, "host", ts_comm_host(s->slowest_rank));
    cJSON_AddNumberToObject(sl, "compute_median_s", row[TS_METRICS_COMPUTE_S]);
    cJSON_AddNumberToObject(sl, "threshold_ratio", s->straggler_ratio);
  } else {
    cJSON_AddNullToObject(sm, "straggler");
  }
  return write_line(m, o);
}
