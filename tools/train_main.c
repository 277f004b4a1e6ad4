/* train_main.c — `tessera train`: flags → ts_train_config, progress on the
 * terminal, a summary at the end. Prints and exits; the library does not. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/trainer.h"
#include "tools/tools.h"

static const char *USAGE =
    "usage: tessera train --model CONFIG --data DIR [--steps N] [--micro-batch B] [--seq T]\n"
    "                     [--lr LR] [--seed S] [--grad-accum K] [--warmup N]\n"
    "                     [--eval-every N] [--eval-batches N] [--metrics FILE]\n"
    "                     [--weight-decay WD] [--grad-clip C] [--dtype fp32] [--log-every N]\n";

typedef struct progress {
  int tty;          /* stdout is a terminal */
  size_t log_every; /* steps between permanent lines */
} progress;

static void on_event(const ts_train_event *ev, void *user) {
  const progress *p = user;
  if (ev->is_eval) {
    printf("%sstep %5zu/%zu | val loss %.4f\n", p->tty ? "\r\033[K" : "", ev->step, ev->steps,
           ev->loss);
    fflush(stdout);
    return;
  }
  int permanent = ev->step == 1 || ev->step % p->log_every == 0 || ev->step == ev->steps;
  if (!permanent && !p->tty) return;
  printf("%sstep %5zu/%zu | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | %.2f GFLOP/s%s",
         p->tty ? "\r\033[K" : "", ev->step, ev->steps, ev->loss, ev->lr, ev->grad_norm,
         ev->tokens_per_s, ev->gflops, permanent ? "\n" : "");
  fflush(stdout);
}

/* The unigram baseline `tessera prepare` wrote to DIR/meta.json, or < 0. */
static double unigram_baseline(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/meta.json", dir);
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  char buf[65536];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  cJSON *root = cJSON_Parse(buf);
  const cJSON *u = cJSON_GetObjectItemCaseSensitive(root, "unigram_val_loss");
  double v = cJSON_IsNumber(u) ? u->valuedouble : -1;
  cJSON_Delete(root);
  return v;
}

int ts_tool_train(int argc, char **argv) {
  ts_train_config cfg = ts_train_default_config();
  size_t log_every = 0;
  int warmup_set = 0;
  for (int i = 1; i < argc; i++) {
    const char *flag = argv[i];
    if (!strcmp(flag, "-h") || !strcmp(flag, "--help")) {
      fputs(USAGE, stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "tessera train: %s needs a value\n%s", flag, USAGE);
      return 2;
    }
    const char *v = argv[++i];
    int ok = 1;
    if (!strcmp(flag, "--model")) cfg.model = v;
    else if (!strcmp(flag, "--data")) cfg.data_dir = v;
    else if (!strcmp(flag, "--metrics")) cfg.metrics_path = v;
    else if (!strcmp(flag, "--steps")) ok = ts_parse_size(flag, v, 1, &cfg.steps);
    else if (!strcmp(flag, "--micro-batch")) ok = ts_parse_size(flag, v, 1, &cfg.engine.micro_batch);
    else if (!strcmp(flag, "--seq")) ok = ts_parse_size(flag, v, 1, &cfg.engine.seq);
    else if (!strcmp(flag, "--grad-accum")) ok = ts_parse_size(flag, v, 1, &cfg.engine.grad_accum);
    else if (!strcmp(flag, "--eval-every")) ok = ts_parse_size(flag, v, 0, &cfg.eval_every);
    else if (!strcmp(flag, "--eval-batches")) ok = ts_parse_size(flag, v, 1, &cfg.eval_batches);
    else if (!strcmp(flag, "--log-every")) ok = ts_parse_size(flag, v, 1, &log_every);
    else if (!strcmp(flag, "--warmup")) ok = warmup_set = ts_parse_size(flag, v, 0, &cfg.warmup);
    else if (!strcmp(flag, "--lr")) ok = ts_parse_float(flag, v, &cfg.lr);
    else if (!strcmp(flag, "--weight-decay")) ok = ts_parse_float(flag, v, &cfg.engine.weight_decay);
    else if (!strcmp(flag, "--grad-clip")) ok = ts_parse_float(flag, v, &cfg.engine.grad_clip);
    else if (!strcmp(flag, "--seed")) {
      size_t s;
      ok = ts_parse_size(flag, v, 0, &s);
      cfg.engine.seed = s;
    } else if (!strcmp(flag, "--dtype")) {
      if (ts_dtype_parse(v, &cfg.engine.dtype) != TS_OK) {
        fprintf(stderr, "tessera train: %s\n", ts_last_error());
        return 2;
      }
    } else {
      fprintf(stderr, "tessera train: unknown flag %s\n%s", flag, USAGE);
      return 2;
    }
    if (!ok) return 2;
  }
  if (!cfg.model || !cfg.data_dir) {
    fprintf(stderr, "tessera train: --model and --data are required\n%s", USAGE);
    return 2;
  }
  if (!warmup_set) cfg.warmup = cfg.steps / 10;
  progress p = {isatty(STDOUT_FILENO), log_every ? log_every : (cfg.steps + 19) / 20};
  ts_train_result res;
  ts_status st = ts_train_run(&cfg, on_event, &p, &res);
  if (st != TS_OK) {
    fprintf(stderr, "tessera train: %s\n", ts_last_error());
    return 1;
  }
  printf("trained %s (%.2fM parameters) for %zu steps in %.1f s: loss %.4f -> %.4f, "
         "%.0f tok/s, %.2f GFLOP/s\n",
         cfg.model, (double)res.num_params / 1e6, cfg.steps, res.seconds, res.first_loss,
         res.final_loss, res.tokens_per_s, res.gflops);
  double uni = unigram_baseline(cfg.data_dir);
  if (uni > 0)
    printf("validation loss %.4f (unigram baseline %.4f)\n", res.final_val_loss, uni);
  else
    printf("validation loss %.4f\n", res.final_val_loss);
  return 0;
}
