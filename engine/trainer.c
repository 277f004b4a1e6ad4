/* trainer.c — the training loop around the engine: data, schedule, eval,
 * metrics (JSON Lines through cJSON). */
#include "engine/trainer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/data.h"

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

/* Appends one JSON object as a line to the metrics file, if any. */
static ts_status write_line(FILE *f, const char *path, cJSON *obj) {
  if (!f) {
    cJSON_Delete(obj);
    return TS_OK;
  }
  char *s = cJSON_PrintUnformatted(obj);
  cJSON_Delete(obj);
  if (!s) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot format a metrics line", path);
  int bad = fprintf(f, "%s\n", s) < 0 || fflush(f) != 0;
  free(s);
  if (bad) return ts_set_error(TS_ERR_IO, "%s: write failed: %s", path, strerror(errno));
  return TS_OK;
}

typedef struct run {
  const ts_train_config *cfg;
  ts_llama_config mcfg;
  ts_llama model;
  int model_ok;
  ts_token_shard *train, *val;
  ts_loader *train_ld, *val_ld;
  ts_engine *engine;
  int32_t *inputs, *targets; /* (B, T) host, the engine's own buffers */
  FILE *metrics;
} run;

static void run_free(run *r) {
  if (r->metrics) fclose(r->metrics);
  ts_engine_free(r->engine);
  ts_loader_free(r->train_ld);
  ts_loader_free(r->val_ld);
  ts_shard_close(r->train);
  ts_shard_close(r->val);
  if (r->model_ok) ts_llama_free(&r->model);
}

/* Mean validation loss over the first eval_batches micro-batches. */
static ts_status evaluate(run *r, double *val_loss) {
  size_t B = r->cfg->engine.micro_batch;
  size_t windows = ts_loader_num_windows(r->val_ld);
  size_t batches = r->cfg->eval_batches;
  if (batches * B > windows) batches = windows / B ? windows / B : 1;
  double sum = 0;
  size_t count = 0;
  for (size_t i = 0; i < batches; i++) {
    double s;
    size_t c;
    TS_CHECK(ts_loader_fill(r->val_ld, r->inputs, r->targets, (uint64_t)i * B, B));
    TS_CHECK(ts_engine_eval(r->engine, r->inputs, r->targets, &s, &c));
    sum += s;
    count += c;
  }
  *val_loss = count ? sum / (double)count : 0.0;
  return TS_OK;
}

static ts_status setup(run *r) {
  const ts_train_config *cfg = r->cfg;
  char path[4096];
  TS_CHECK(ts_llama_config_resolve(cfg->model, path, sizeof path));
  TS_CHECK(ts_llama_config_load(path, &r->mcfg));
  TS_CHECK(ts_llama_init(&r->model, &r->mcfg));
  r->model_ok = 1;
  size_t V = r->mcfg.vocab_size, T = cfg->engine.seq;
  snprintf(path, sizeof path, "%s/train.bin", cfg->data_dir);
  TS_CHECK(ts_shard_open(&r->train, path, V));
  snprintf(path, sizeof path, "%s/val.bin", cfg->data_dir);
  TS_CHECK(ts_shard_open(&r->val, path, V));
  TS_CHECK(ts_loader_init(&r->train_ld, r->train, T, cfg->engine.seed, 1));
  TS_CHECK(ts_loader_init(&r->val_ld, r->val, T, 0, 0));
  if (ts_loader_num_windows(r->val_ld) < cfg->engine.micro_batch)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s/val.bin: %zu windows of --seq %zu: expected at least --micro-batch "
                        "%zu",
                        cfg->data_dir, ts_loader_num_windows(r->val_ld), T,
                        cfg->engine.micro_batch);
  TS_CHECK(ts_engine_create(&r->engine, &r->model, &cfg->engine));
  ts_engine_batch(r->engine, &r->inputs, &r->targets);
  if (cfg->metrics_path) {
    r->metrics = fopen(cfg->metrics_path, "w");
    if (!r->metrics)
      return ts_set_error(TS_ERR_IO, "%s: cannot open for writing: %s", cfg->metrics_path,
                          strerror(errno));
  }
  return TS_OK;
}

static ts_status eval_and_log(run *r, size_t step, ts_train_callback cb, void *user,
                              double *val) {
  TS_CHECK(evaluate(r, val));
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "step", (double)step);
  cJSON_AddNumberToObject(o, "val_loss", *val);
  TS_CHECK(write_line(r->metrics, r->cfg->metrics_path, o));
  if (cb) {
    ts_train_event ev = {1, step, r->cfg->steps, *val, 0, 0, 0, 0};
    cb(&ev, user);
  }
  return TS_OK;
}

static ts_status train(run *r, ts_train_callback cb, void *user, ts_train_result *res) {
  const ts_train_config *cfg = r->cfg;
  const ts_engine_opts *eo = &cfg->engine;
  size_t tokens_per_step = eo->micro_batch * eo->seq * eo->grad_accum;
  double flops_per_token = ts_llama_flops_per_token(&r->mcfg, eo->seq);
  double t_loop = now_s(), tok_s_sum = 0;
  size_t timed = 0;
  for (size_t step = 1; step <= cfg->steps; step++) {
    double t0 = now_s();
    for (size_t a = 0; a < eo->grad_accum; a++) {
      uint64_t k = ts_loader_sample_index(step - 1, a, eo->grad_accum, 0, 1, eo->micro_batch);
      double loss;
      TS_CHECK(ts_loader_fill(r->train_ld, r->inputs, r->targets, k, eo->micro_batch));
      TS_CHECK(ts_engine_micro_step(r->engine, r->inputs, r->targets, &loss));
    }
    float lr = ts_train_lr(step, cfg->steps, cfg->warmup, cfg->lr, cfg->min_lr_ratio);
    ts_step_stats st;
    TS_CHECK(ts_engine_optimizer_step(r->engine, lr, &st));
    double dt = now_s() - t0;
    double tok_s = (double)tokens_per_step / dt;
    if (step > 1 || cfg->steps == 1) {
      tok_s_sum += tok_s;
      timed++;
    }
    if (step == 1) res->first_loss = st.loss;
    res->final_loss = st.loss;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", (double)step);
    cJSON_AddNumberToObject(o, "loss", st.loss);
    cJSON_AddNumberToObject(o, "lr", lr);
    cJSON_AddNumberToObject(o, "grad_norm", st.grad_norm);
    cJSON_AddNumberToObject(o, "tokens_per_s", tok_s);
    cJSON_AddNumberToObject(o, "gflops", tok_s * flops_per_token / 1e9);
    cJSON_AddNumberToObject(o, "step_seconds", dt);
    TS_CHECK(write_line(r->metrics, cfg->metrics_path, o));
    if (cb) {
      ts_train_event ev = {0,  step, cfg->steps, st.loss, st.grad_norm,
                           lr, tok_s, tok_s * flops_per_token / 1e9};
      cb(&ev, user);
    }
    double val;
    if (cfg->eval_every && step % cfg->eval_every == 0 && step != cfg->steps)
      TS_CHECK(eval_and_log(r, step, cb, user, &val));
  }
  res->seconds = now_s() - t_loop;
  res->tokens_per_s = timed ? tok_s_sum / (double)timed : 0;
  res->gflops = res->tokens_per_s * flops_per_token / 1e9;
  return eval_and_log(r, cfg->steps, cb, user, &res->final_val_loss);
}

ts_status ts_train_run(const ts_train_config *cfg, ts_train_callback cb, void *user,
                       ts_train_result *result) {
  memset(result, 0, sizeof *result);
  if (!cfg->model || !cfg->data_dir)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "train: --model and --data are required");
  if (cfg->steps == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--steps 0: expected >= 1");
  if (cfg->eval_batches == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--eval-batches 0: expected >= 1");
  run r;
  memset(&r, 0, sizeof r);
  r.cfg = cfg;
  ts_status st = setup(&r);
  if (st == TS_OK) {
    result->num_params = ts_llama_num_params(&r.mcfg);
    st = train(&r, cb, user, result);
  }
  run_free(&r);
  return st;
}
