/* train_main.c — `tessera train`: flags → ts_train_config, progress on the
 * terminal, a summary at the end. Prints and exits; the library does not.
 * Under mpirun every rank runs this; rank 0 prints progress and the summary,
 * usage errors print once (on the lead rank), and an error in one rank
 * during training aborts the job so no rank waits in a collective. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "engine/trainer.h"
#include "tools/tools.h"

static const char *USAGE =
    "usage: tessera train --model CONFIG --data DIR [--steps N] [--micro-batch B] [--seq T]\n"
    "                     [--lr LR] [--seed S] [--grad-accum K] [--warmup N]\n"
    "                     [--eval-every N] [--eval-batches N] [--metrics FILE]\n"
    "                     [--weight-decay WD] [--grad-clip C] [--log-every N]\n"
    "                     [--zero 0|1|2|3] [--global-batch G] [--dtype fp32|bf16|fp16]\n"
    "                     [--loss-scale dynamic|S] [--loss-scale-window N] [--min-loss-scale S]\n"
    "                     [--activation-checkpointing none|all|every:K]\n"
    "  --micro-batch is per rank; --global-batch = ranks x micro-batch x grad-accum\n"
    "  (give two of --global-batch, --grad-accum and the rank count fixes the third).\n"
    "  Several ranks: tessera launch -n N train ...\n";

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
  if (ev->skipped) { /* always a permanent line */
    printf("%sstep %5zu/%zu | loss %.4f | skipped: fp16 overflow in %s, loss scale %g -> %g\n",
           p->tty ? "\r\033[K" : "", ev->step, ev->steps, ev->loss, ev->overflow_tensor,
           (double)ev->loss_scale, (double)ev->next_loss_scale);
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

/* Whether progress may redraw one line: stdout is a terminal. Under mpirun
 * a rank's stdout is a pseudo-terminal even when the job's output goes to a
 * file, so there TESSERA_TTY (set by tools/launch.sh from its own stdout)
 * decides, and without it the answer is no. */
static int stdout_is_terminal(void) {
  const char *t = getenv("TESSERA_TTY");
  if (t) return strcmp(t, "1") == 0;
  if (getenv("OMPI_COMM_WORLD_RANK") || getenv("PMIX_RANK")) return 0;
  return isatty(STDOUT_FILENO);
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

/* Rank 0's closing lines: loss, speed, validation, communication, memory. */
static void print_summary(const ts_train_config *cfg, const ts_train_result *res) {
  printf("trained %s (%.2fM parameters) for %zu steps in %.1f s: loss %.4f -> %.4f, "
         "%.0f tok/s, %.2f GFLOP/s\n",
         cfg->model, (double)res->num_params / 1e6, cfg->steps, res->seconds, res->first_loss,
         res->final_loss, res->tokens_per_s, res->gflops);
  double uni = unigram_baseline(cfg->data_dir);
  if (uni > 0)
    printf("validation loss %.4f (unigram baseline %.4f)\n", res->final_val_loss, uni);
  else
    printf("validation loss %.4f\n", res->final_val_loss);
  const ts_mem_account *l = &res->memory;
  const double MiB = 1024.0 * 1024.0;
  if (cfg->engine.dtype == TS_FP16)
    printf("fp16: %zu step%s skipped for overflow\n", res->skipped_steps,
           res->skipped_steps == 1 ? "" : "s");
  printf("ZeRO stage %d on %d rank%s, global batch %zu: %.3f MB sent per step per rank; rank 0 "
         "peak %.2f MiB (",
         cfg->engine.zero_stage, res->world_size, res->world_size > 1 ? "s" : "",
         res->global_batch, (double)res->comm_bytes_per_step / 1e6, (double)l->peak_total / MiB);
  for (int c = 0; c < TS_MEM_NUM_CATEGORIES; c++)
    printf("%s%s %.2f", c ? ", " : "", ts_mem_category_name((ts_mem_category)c),
           (double)l->peak[c] / MiB);
  printf(")\n");
}

int ts_tool_train(int argc, char **argv) {
  ts_train_config cfg = ts_train_default_config();
  size_t log_every = 0, zero = 0;
  int warmup_set = 0, accum_set = 0;
  const char *scale_flag = NULL; /* a loss-scaling flag given (fp16 only) */
  int lead = ts_tool_is_lead();
  for (int i = 1; i < argc; i++) {
    const char *flag = argv[i];
    if (!strcmp(flag, "-h") || !strcmp(flag, "--help")) {
      fputs(USAGE, stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      if (lead) fprintf(stderr, "tessera train: %s needs a value\n%s", flag, USAGE);
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
    else if (!strcmp(flag, "--grad-accum")) ok = accum_set = ts_parse_size(flag, v, 1, &cfg.engine.grad_accum);
    else if (!strcmp(flag, "--global-batch")) ok = ts_parse_size(flag, v, 1, &cfg.global_batch);
    else if (!strcmp(flag, "--zero")) ok = ts_parse_size(flag, v, 0, &zero);
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
    } else if (!strcmp(flag, "--loss-scale")) {
      scale_flag = flag;
      if (strcmp(v, "dynamic") != 0) {
        ok = ts_parse_float(flag, v, &cfg.engine.loss_scale);
        if (ok && !(cfg.engine.loss_scale > 0)) {
          if (lead) fprintf(stderr, "tessera train: --loss-scale %s: expected dynamic or a scale > 0\n", v);
          return 2;
        }
      }
    } else if (!strcmp(flag, "--loss-scale-window")) {
      scale_flag = flag;
      ok = ts_parse_size(flag, v, 1, &cfg.engine.loss_scale_window);
    } else if (!strcmp(flag, "--min-loss-scale")) {
      scale_flag = flag;
      ok = ts_parse_float(flag, v, &cfg.engine.min_loss_scale);
    } else if (!strcmp(flag, "--activation-checkpointing")) {
      if (ts_train_parse_recompute(v, &cfg.engine.recompute_every) != TS_OK) {
        if (lead) fprintf(stderr, "tessera train: %s\n", ts_last_error());
        return 2;
      }
    } else if (!strcmp(flag, "--dtype")) {
      if (ts_dtype_parse(v, &cfg.engine.dtype) != TS_OK) {
        if (lead) fprintf(stderr, "tessera train: %s\n", ts_last_error());
        return 2;
      }
    } else {
      if (lead) fprintf(stderr, "tessera train: unknown flag %s\n%s", flag, USAGE);
      return 2;
    }
    if (!ok) return 2;
  }
  if (!cfg.model || !cfg.data_dir) {
    if (lead) fprintf(stderr, "tessera train: --model and --data are required\n%s", USAGE);
    return 2;
  }
  if (zero > 3) {
    if (lead) fprintf(stderr, "tessera train: --zero %zu: expected a ZeRO stage 0, 1, 2 or 3\n", zero);
    return 2;
  }
  cfg.engine.zero_stage = (int)zero;
  if (scale_flag && cfg.engine.dtype != TS_FP16) {
    if (lead)
      fprintf(stderr, "tessera train: %s applies to --dtype fp16 only (got --dtype %s)\n",
              scale_flag, ts_dtype_name(cfg.engine.dtype));
    return 2;
  }
  if (cfg.global_batch && !accum_set) cfg.engine.grad_accum = 0; /* derived */
  if (!warmup_set) cfg.warmup = cfg.steps / 10;
  progress p = {stdout_is_terminal(), log_every ? log_every : (cfg.steps + 19) / 20};
  ts_comm *world = NULL;
  ts_status st = ts_comm_init(&argc, &argv);
  if (st == TS_OK) st = ts_comm_world(&world);
  if (st != TS_OK) {
    fprintf(stderr, "tessera train: %s\n", ts_last_error());
    return 1;
  }
  int rank = ts_comm_rank(world), n = ts_comm_size(world);
  cfg.dp = world;
  ts_train_result res;
  st = ts_train_run(&cfg, on_event, &p, &res);
  ts_comm_free(world);
  if (st != TS_OK) {
    if (!res.failed_elsewhere) {
      if (n > 1) fprintf(stderr, "tessera train: rank %d of %d: %s\n", rank, n, ts_last_error());
      else fprintf(stderr, "tessera train: %s\n", ts_last_error());
    }
    /* Setup errors are agreed by every rank; a failure during training is
     * one rank's, and its peers would wait for it in the next collective. */
    if (n > 1 && !res.setup_failed && !res.failed_together) ts_comm_abort(1);
    ts_comm_finalize();
    return 1;
  }
  if (rank == 0) print_summary(&cfg, &res);
  ts_comm_finalize();
  return 0;
}
