/* compare_main.c — `tessera compare`: one training configuration at several
 * ZeRO stages (and dtypes, checkpointing settings, pipeline layouts and
 * schedules) on N ranks, each run
 * through tools/launch.sh for a few steps, then per run: every rank's
 * ledger peaks by category beside the engine's own plan (ts_engine_plan)
 * and the difference, the model states between steps beside the ZeRO
 * formula, the process's peak RSS, tokens/s and bytes sent per step with
 * their ratios to the group's first stage, and the losses, checked to be
 * identical across stages and checkpointing at every step (and across
 * schedules of one pipeline layout). Per-rank memory differs by pipeline
 * stage: the plan is each stage's, the table has every rank, the chart a
 * bar per stage, and each pipelined run's timeline of one step is drawn
 * (tools/timeline.h). Writes compare.md, compare.csv (each whole or not at
 * all: written to a temporary name and renamed), compare.png and
 * timeline-RUN.png (gnuplot). Exit status 0
 * when every check passes, 1 when one fails or a run fails, 2 bad usage. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "engine/engine.h"
#include "engine/trainer.h"
#include "tools/flags.h"
#include "tools/timeline.h"
#include "tools/tools.h"

static const char *USAGE =
    "usage: tessera compare --model CONFIG -n N [flags]\n"
    "  Trains CONFIG for K steps on N ranks at each ZeRO stage, for each dtype and\n"
    "  checkpointing setting (and --pipeline layout and --schedule), and writes\n"
    "  OUT/compare.md, compare.csv and compare.png\n"
    "  (run logs and metrics go to OUT/compare_runs/). `./tessera compare` prepares\n"
    "  the default --data first.\n";

#define MAX_LIST 8
#define W (TS_MEM_NUM_CATEGORIES + 3) /* per rank: categories, total, peak_rss, model_states */
#define M_TOTAL TS_MEM_NUM_CATEGORIES
#define M_RSS (TS_MEM_NUM_CATEGORIES + 1)
#define M_STATES (TS_MEM_NUM_CATEGORIES + 2)

typedef struct run {
  ts_dtype dt;
  size_t recompute; /* ts_engine_opts.recompute_every */
  int stage;
  int pipeline;    /* P pipeline stages (1: none) */
  ts_schedule_kind schedule; /* when P > 1 */
  char name[96];   /* "fp32 recompute:none ZeRO-2", "... P2 1f1b ZeRO-2" */
  char file[96];   /* "fp32-none-zero2", "fp32-none-p2-1f1b-zero2" (metrics .jsonl, log .log) */
  size_t n_loss;
  double loss[4096];
  double tok_s;    /* mean over steps 2.. (all steps when only one) */
  double comm;     /* bytes sent per step, rank 0, last step */
  double psi;      /* padded parameter count */
  double *mem;     /* [N][W] measured, from the summary */
  ts_mem_account est[TS_ENGINE_MAX_STAGES]; /* the plan of each pipeline stage */
  int split[TS_ENGINE_MAX_STAGES + 1];      /* first unit of each stage, then n_units */
  double bubble;   /* P > 1: the measured bubble of the drawn step (busiest rank) */
  int base;        /* the run its ratios compare against: the first of its dtype,
                      checkpointing and pipeline layout */
  int loss_base;   /* the run its losses must equal: the first of its dtype and P */
} run;

/* The plan of rank q's pipeline stage (ranks q = stage * dp + dp_rank). */
static const ts_mem_account *est_of(const run *r, size_t q, size_t n) {
  return &r->est[q / (n / (size_t)r->pipeline)];
}

typedef struct compare {
  const char *model, *data, *out;
  size_t n, steps, micro_batch, seq;
  float lr;
  int stages[MAX_LIST], n_stages; /* more than 4 refused after parsing */
  ts_dtype dts[MAX_LIST];
  int n_dts;
  size_t recomputes[MAX_LIST];
  int n_recomputes;
  int pipelines[MAX_LIST], n_pipelines; /* --pipeline P list */
  ts_schedule_kind schedules[MAX_LIST]; /* --schedule list (pipelined runs) */
  int n_schedules;
  size_t grad_accum; /* micro-batches per step; 0: 1, or 2 x the largest P */
  int reuse;
  int device;      /* --device choice (tools.h), passed to every run */
  ts_device dev;   /* what it resolves to here, for the plans */
  ts_model arch;   /* the model --model names, loaded */
  run *runs;
  int n_runs;
} compare;

static const double MiB = 1024.0 * 1024.0;

/* Formats into a char array, exiting with a one-line error when it does
 * not fit (a path too long). */
#define FMT(buf, ...) fits(snprintf(buf, sizeof buf, __VA_ARGS__), sizeof buf, buf)
static void fits(int n, size_t cap, const char *buf) {
  if (n < 0 || (size_t)n >= cap) {
    fprintf(stderr, "tessera compare: a path is too long (over %zu bytes): %.60s...\n", cap, buf);
    exit(2);
  }
}

/* Splits the comma list v into at most MAX_LIST items, each parsed by
 * `item` into out[i]; *count gets their number. An item's error ends with
 * "(not ITEM)" when v holds more than that item. */
static ts_status parse_list(const char *v, int *count,
                            ts_status (*item)(const char *item, int i, void *out), void *out) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", v);
  *count = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (*count >= MAX_LIST)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "expected at most %d values", MAX_LIST);
    if (item(t, (*count)++, out) == TS_OK) continue;
    if (!strcmp(t, v)) return TS_ERR_INVALID_ARGUMENT;
    char why[512];
    snprintf(why, sizeof why, "%s", ts_last_error());
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s (not %s)", why, t);
  }
  if (*count == 0) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "expected a list");
  return TS_OK;
}

/* One item of each list, into element i of its array. */
static ts_status stage_item(const char *item, int i, void *out) {
  if (strlen(item) != 1 || item[0] < '0' || item[0] > '3')
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "expected ZeRO stages 0, 1, 2 or 3");
  ((int *)out)[i] = item[0] - '0';
  return TS_OK;
}

/* (a dtype name) */
static ts_status dtype_item(const char *item, int i, void *out) {
  return ts_dtype_parse(item, &((ts_dtype *)out)[i]);
}

/* (a pipeline stage count >= 1) */
static ts_status pipeline_item(const char *item, int i, void *out) {
  char *end;
  long p = strtol(item, &end, 10);
  if (end == item || *end || p < 1 || p > TS_ENGINE_MAX_STAGES)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "expected pipeline stage counts 1 to %d",
                        TS_ENGINE_MAX_STAGES);
  ((int *)out)[i] = (int)p;
  return TS_OK;
}

/* (gpipe or 1f1b) */
static ts_status schedule_item(const char *item, int i, void *out) {
  return ts_schedule_kind_parse(item, &((ts_schedule_kind *)out)[i]);
}

/* (none, all or every:K) */
static ts_status recompute_item(const char *item, int i, void *out) {
  return ts_train_parse_recompute(item, &((size_t *)out)[i]);
}

/* --zero, --dtype, --activation-checkpointing: lists into a compare. */
static ts_status parse_stages(const char *v, void *c) {
  return parse_list(v, &((compare *)c)->n_stages, stage_item, ((compare *)c)->stages);
}
/* (see parse_stages) */
static ts_status parse_dtypes(const char *v, void *c) {
  return parse_list(v, &((compare *)c)->n_dts, dtype_item, ((compare *)c)->dts);
}
/* (see parse_stages) */
static ts_status parse_pipelines(const char *v, void *c) {
  return parse_list(v, &((compare *)c)->n_pipelines, pipeline_item, ((compare *)c)->pipelines);
}
/* (see parse_stages) */
static ts_status parse_schedules(const char *v, void *c) {
  return parse_list(v, &((compare *)c)->n_schedules, schedule_item, ((compare *)c)->schedules);
}
/* (see parse_stages) */
static ts_status parse_recomputes(const char *v, void *c) {
  return parse_list(v, &((compare *)c)->n_recomputes, recompute_item, ((compare *)c)->recomputes);
}

/* Prints the last lines of a failed run's log to stderr. */
static void print_tail(const char *log) {
  char cmd[4200];
  FMT(cmd, "tail -n 5 '%s' >&2", log);
  if (system(cmd) != 0) fprintf(stderr, "  (see %s)\n", log);
}

/* Trains run r through tools/launch.sh into OUT/compare_runs/. */
static int launch_run(const compare *c, const run *r, const char *dir) {
  const char *home = getenv("TESSERA_HOME");
  char launch[4096], self[4096], metrics[4200], log[4200], zero[8], steps[32], b[32], t[32],
      lr[32], ck[32], n[32], pp[16], accum[32], trace[4200];
  FMT(launch, "%s/tools/launch.sh", home ? home : ".");
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) return fprintf(stderr, "tessera compare: cannot find its own binary\n"), 0;
  self[len] = '\0';
  FMT(metrics, "%s/%s.jsonl", dir, r->file);
  FMT(log, "%s/%s.log", dir, r->file);
  snprintf(zero, sizeof zero, "%d", r->stage);
  snprintf(steps, sizeof steps, "%zu", c->steps);
  snprintf(b, sizeof b, "%zu", c->micro_batch);
  snprintf(t, sizeof t, "%zu", c->seq);
  snprintf(lr, sizeof lr, "%g", (double)c->lr);
  snprintf(n, sizeof n, "%zu", c->n);
  snprintf(pp, sizeof pp, "%d", r->pipeline);
  snprintf(accum, sizeof accum, "%zu", c->grad_accum);
  FMT(trace, "%s/%s.trace.json", dir, r->file);
  ts_train_recompute_name(r->recompute, ck, sizeof ck);
  char *argv[] = {launch, "-n", n, self, "train", "--model", (char *)c->model, "--data", (char *)c->data,
                  "--zero", zero, "--dtype", (char *)ts_dtype_name(r->dt),
                  "--activation-checkpointing", ck, "--steps", steps, "--micro-batch", b, "--seq",
                  t, "--lr", lr, "--warmup", "1", "--eval-batches", "1", "--log-every", steps,
                  "--metrics", metrics, "--device", (char *)ts_tool_device_choice_name(c->device),
                  "--grad-accum", accum, "--pipeline", pp, "--schedule",
                  (char *)ts_schedule_kind_name(r->schedule),
                  r->pipeline > 1 ? "--trace" : NULL, trace, NULL};
  int rc = ts_tool_spawn(argv, log);
  if (rc != 0) {
    fprintf(stderr, "tessera compare: run %s failed (exit %d); the end of %s:\n", r->name, rc, log);
    print_tail(log);
    return 0;
  }
  return 1;
}

static double num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Reads run r's metrics: losses and speed per step, and the summary. */
static int read_run(const compare *c, run *r, const char *dir) {
  char path[4200], line[1 << 16];
  FMT(path, "%s/%s.jsonl", dir, r->file);
  FILE *f = fopen(path, "r");
  if (!f) return fprintf(stderr, "tessera compare: %s: %s\n", path, strerror(errno)), 0;
  double tok_sum = 0, tok_first = NAN;
  int have_summary = 0;
  while (fgets(line, sizeof line, f)) {
    cJSON *o = cJSON_Parse(line);
    const cJSON *sm = cJSON_GetObjectItemCaseSensitive(o, "summary");
    if (sm) {
      const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(sm, "mem_by_rank");
      r->comm = num(sm, "comm_bytes_per_step");
      r->psi = num(cJSON_GetObjectItemCaseSensitive(sm, "params"), "padded");
      have_summary = (size_t)cJSON_GetArraySize(ranks) == c->n;
      for (size_t q = 0; have_summary && q < c->n; q++) {
        const cJSON *e = cJSON_GetArrayItem(ranks, (int)q);
        for (int k = 0; k < TS_MEM_NUM_CATEGORIES; k++)
          r->mem[q * W + k] = num(e, ts_mem_category_name((ts_mem_category)k));
        r->mem[q * W + M_TOTAL] = num(e, "total");
        r->mem[q * W + M_RSS] = num(e, "peak_rss");
        r->mem[q * W + M_STATES] = num(e, "model_states");
      }
    } else if (cJSON_GetObjectItemCaseSensitive(o, "tokens_per_s") &&
               r->n_loss < sizeof r->loss / sizeof r->loss[0]) {
      double tok = num(o, "tokens_per_s");
      if (r->n_loss == 0) tok_first = tok;
      else tok_sum += tok;
      r->loss[r->n_loss++] = num(o, "loss");
    }
    cJSON_Delete(o);
  }
  fclose(f);
  if (!have_summary || r->n_loss == 0)
    return fprintf(stderr, "tessera compare: %s: expected step lines and a summary of %zu ranks\n",
                   path, c->n), 0;
  r->tok_s = r->n_loss > 1 ? tok_sum / (double)(r->n_loss - 1) : tok_first;
  return 1;
}

/* The ZeRO paper's model states per rank (§5.1; fp32 keeps no master
 * copy: engine.h's table) for padded Ψ on N ranks. */
static double formula(const run *r, double psi, double n) {
  int half = r->dt != TS_FP32;
  switch (r->stage) {
    case 0: return 16 * psi;
    case 1: return half ? 4 * psi + 12 * psi / n : 8 * psi + 8 * psi / n;
    case 2: return half ? 2 * psi + 14 * psi / n : 4 * psi + 12 * psi / n;
    default: return 16 * psi / n;
  }
}

/* Check 1: every rank's model-state peaks and between-step bytes equal the
 * plan, and the formula. */
static int check_model_states(const compare *c, FILE *md, int *per_run) {
  (void)per_run;
  int ok = 1;
  for (int i = 0; i < c->n_runs; i++) {
    const run *r = &c->runs[i];
    for (size_t q = 0; q < c->n; q++) {
      const double *m = r->mem + q * W;
      const ts_mem_account *e = est_of(r, q, c->n);
      /* the ZeRO formula covers the whole model on one pipeline stage */
      double f = r->pipeline == 1 ? formula(r, r->psi, (double)c->n) : m[M_STATES];
      int same = m[M_STATES] == (double)ts_mem_model_state_bytes(e) && m[M_STATES] == f;
      for (int k = TS_MEM_PARAMS; k <= TS_MEM_OPTIM; k++) same &= m[k] == (double)e->peak[k];
      if (!same) {
        fprintf(md, "  - %s, rank %zu: measured model states %.0f B, estimate %.0f B, formula %.0f B\n",
                r->name, q, m[M_STATES], (double)ts_mem_model_state_bytes(e), f);
        ok = 0;
      }
    }
  }
  return ok;
}

/* Check 2: the losses of every run equal, step for step and to the bit,
 * those of its base run (the first run of its dtype and pipeline layout
 * and, with accumulation, reduction: loss_base). */
static int check_losses(const compare *c, FILE *md, int *per_run) {
  int ok = 1;
  for (int i = 0; i < c->n_runs; i++) {
    const run *r = &c->runs[i], *b = &c->runs[r->loss_base];
    per_run[i] = 0;
    if (r->n_loss != b->n_loss) {
      fprintf(md, "  - %s: %zu steps, %s: %zu\n", r->name, r->n_loss, b->name, b->n_loss);
      ok = 0;
      continue;
    }
    per_run[i] = 1;
    for (size_t s = 0; s < r->n_loss && per_run[i]; s++)
      if (memcmp(&r->loss[s], &b->loss[s], sizeof(double)) != 0) {
        fprintf(md, "  - %s, step %zu: loss %.17g, %s: %.17g\n", r->name, s + 1, r->loss[s],
                b->name, b->loss[s]);
        ok = per_run[i] = 0;
      }
  }
  return ok;
}

/* Check 3: within each dtype and checkpointing group, the model states
 * fall strictly as the stage rises (N > 1). */
static int check_falling(const compare *c, FILE *md, int *per_run) {
  int ok = 1;
  (void)per_run;
  for (int i = 1; i < c->n_runs; i++) {
    const run *r = &c->runs[i], *p = &c->runs[i - 1];
    if (c->n / (size_t)r->pipeline > 1 && r->dt == p->dt && r->recompute == p->recompute &&
        r->pipeline == p->pipeline && r->schedule == p->schedule && r->stage > p->stage &&
        !(r->mem[M_STATES] < p->mem[M_STATES])) {
      fprintf(md, "  - %s holds %.0f B of model states, %s %.0f B\n", r->name, r->mem[M_STATES],
              p->name, p->mem[M_STATES]);
      ok = 0;
    }
  }
  return ok;
}

/* Runs one check and writes "- PASS: what" or "- FAIL: what" to ck, then
 * the check's detail lines. Returns the check's result. */
static int report(FILE *ck, const compare *c, int (*check)(const compare *, FILE *, int *),
                  int *per_run, const char *what) {
  char *detail = NULL;
  size_t len = 0;
  FILE *d = open_memstream(&detail, &len);
  int ok = d ? check(c, d, per_run) : 0;
  if (d) fclose(d);
  fprintf(ck, "- %s: %s\n%s", ok ? "PASS" : "FAIL", what, detail ? detail : "");
  free(detail);
  return ok;
}

/* Opens path for an atomic write (base/atomic_file.h: path.tmp, renamed by
 * finish); the stream to print to, or NULL after printing why. */
static FILE *start(ts_atomic_file **af, const char *path) {
  if (ts_atomic_file_open(af, path) == TS_OK) return ts_atomic_file_stream(*af);
  fprintf(stderr, "tessera compare: %s\n", ts_last_error());
  return NULL;
}

/* Commits a file from start; 0 after printing why it failed. */
static int finish(ts_atomic_file *af) {
  if (ts_atomic_file_commit(af) == TS_OK) return 1;
  fprintf(stderr, "tessera compare: %s\n", ts_last_error());
  return 0;
}

/* A cell "measured / estimate (difference)" in MiB. */
static void cell(FILE *md, double meas, double est) {
  double d = meas - est;
  if (d == 0) fprintf(md, " %.2f / %.2f (0) |", meas / MiB, est / MiB);
  else fprintf(md, " %.2f / %.2f (%+.3f) |", meas / MiB, est / MiB, d / MiB);
}

static int write_md(const compare *c, const char *path, const char *checks) {
  ts_atomic_file *af;
  FILE *md = start(&af, path);
  if (!md) return 0;
  const run *r0 = &c->runs[0];
  fprintf(md, "# tessera compare: %s on %zu ranks\n\n", c->arch.name, c->n);
  fprintf(md, "%zu steps, micro-batch %zu x seq %zu per rank, Ψ = %.0f parameters (%.0f padded), "
              "%ld cores. Memory is per rank in MiB (2^20 bytes): measured by each rank's "
              "ledger, estimated by `tessera estimate` (the engine's allocation plan); speed and communication ratios (vs base) are against the first "
              "stage of the same dtype and checkpointing; the ZeRO formula is Rajbhandari et al. "
              "2020 §5.1 for the padded Ψ (fp32 keeps no master copy). Peak RSS is each rank "
              "process's, ledger and all else (MPI, OpenBLAS, code). Device memory: none (CPU "
              "ranks).\n\n",
          c->steps, c->micro_batch, c->seq, (double)c->arch.num_params, r0->psi,
          sysconf(_SC_NPROCESSORS_ONLN));
  fputs(checks, md);
  fprintf(md, "\n| run | model states between steps: measured | estimate | ZeRO formula "
              "| peak total: measured | estimate | peak RSS (max over ranks) | tokens/s | vs base "
              "| MB sent/step | vs base |\n"
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (int i = 0; i < c->n_runs; i++) {
    const run *r = &c->runs[i], *b = &c->runs[r->base];
    double rss = 0;
    for (size_t q = 0; q < c->n; q++) rss = fmax(rss, r->mem[q * W + M_RSS]);
    fprintf(md, "| %s | %.2f | %.2f |", r->name, r->mem[M_STATES] / MiB,
            (double)ts_mem_model_state_bytes(&r->est[0]) / MiB);
    if (r->pipeline == 1) fprintf(md, " %.2f |", formula(r, r->psi, (double)c->n) / MiB);
    else fprintf(md, " - |");
    fprintf(md, " %.2f | %.2f |", r->mem[M_TOTAL] / MiB, (double)r->est[0].peak_total / MiB);
    fprintf(md, " %.1f | %.0f | %.2f | %.3f |", rss / MiB, r->tok_s, r->tok_s / b->tok_s,
            r->comm / 1e6);
    if (b->comm > 0) fprintf(md, " %.2f |\n", r->comm / b->comm);
    else fprintf(md, " - |\n");
  }
  fprintf(md, "\nPeak bytes per ledger category, rank 0: measured / estimate (difference), MiB\n\n"
              "| run |");
  for (int k = 0; k < TS_MEM_NUM_CATEGORIES; k++)
    fprintf(md, " %s |", ts_mem_category_name((ts_mem_category)k));
  fprintf(md, "\n| --- |");
  for (int k = 0; k < TS_MEM_NUM_CATEGORIES; k++) fprintf(md, " --- |");
  fprintf(md, "\n");
  for (int i = 0; i < c->n_runs; i++) {
    const run *r = &c->runs[i];
    fprintf(md, "| %s |", r->name);
    for (int k = 0; k < TS_MEM_NUM_CATEGORIES; k++) cell(md, r->mem[k], (double)r->est[0].peak[k]);
    fprintf(md, "\n");
  }
  /* Every rank: with pipeline stages, ranks of different stages hold
   * different units and micro-batches in flight. */
  fprintf(md, "\nPeak total per rank: measured / estimate (difference), MiB; sS = its pipeline "
              "stage (units first..last)\n\n| run |");
  for (size_t q = 0; q < c->n; q++) fprintf(md, " rank %zu |", q);
  fprintf(md, "\n| --- |");
  for (size_t q = 0; q < c->n; q++) fprintf(md, " --- |");
  fprintf(md, "\n");
  for (int i = 0; i < c->n_runs; i++) {
    const run *r = &c->runs[i];
    fprintf(md, "| %s |", r->name);
    for (size_t q = 0; q < c->n; q++) {
      size_t st = q / (c->n / (size_t)r->pipeline);
      if (r->pipeline > 1)
        fprintf(md, " s%zu (%d..%d):", st, r->split[st], r->split[st + 1] - 1);
      cell(md, r->mem[q * W + M_TOTAL], (double)est_of(r, q, c->n)->peak_total);
    }
    fprintf(md, "\n");
  }
  fprintf(md, "\nLoss at every step\n\n| run |");
  for (size_t s = 0; s < r0->n_loss; s++) fprintf(md, " %zu |", s + 1);
  fprintf(md, "\n| --- |");
  for (size_t s = 0; s < r0->n_loss; s++) fprintf(md, " ---: |");
  fprintf(md, "\n");
  for (int i = 0; i < c->n_runs; i++) {
    fprintf(md, "| %s |", c->runs[i].name);
    for (size_t s = 0; s < c->runs[i].n_loss; s++) fprintf(md, " %.6f |", c->runs[i].loss[s]);
    fprintf(md, "\n");
  }
  fprintf(md, "\n![per-rank memory by category](compare.png)\n");
  for (int i = 0; i < c->n_runs; i++)
    if (c->runs[i].pipeline > 1)
      fprintf(md, "\n%s: step %zu's timeline, measured bubble %.1f%% on the busiest rank, "
                  "(P-1)/(m+P-1) = %.1f%% in theory\n\n![timeline](timeline-%s.png)\n",
              c->runs[i].name, c->steps, 100.0 * c->runs[i].bubble,
              100.0 * (c->runs[i].pipeline - 1) /
                  ((double)c->grad_accum + c->runs[i].pipeline - 1),
              c->runs[i].file);
  return finish(af);
}

static int write_csv(const compare *c, const char *path, const int *loss_ok) {
  ts_atomic_file *af;
  FILE *f = start(&af, path);
  if (!f) return 0;
  fprintf(f, "run,dtype,activation_checkpointing,zero_stage,pipeline,schedule,world_size,rank,"
             "pipeline_stage");
  for (int k = 0; k < TS_MEM_NUM_CATEGORIES; k++)
    fprintf(f, ",%s_measured,%s_estimate", ts_mem_category_name((ts_mem_category)k),
            ts_mem_category_name((ts_mem_category)k));
  fprintf(f, ",total_measured,total_estimate,model_states_measured,model_states_estimate,"
             "model_states_formula,peak_rss,tokens_per_s,tokens_per_s_ratio,comm_bytes_per_step,"
             "comm_ratio,losses_identical,losses\n");
  for (int i = 0; i < c->n_runs; i++) {
    const run *r = &c->runs[i], *b = &c->runs[r->base];
    char ck[32];
    ts_train_recompute_name(r->recompute, ck, sizeof ck);
    for (size_t q = 0; q < c->n; q++) {
      const double *m = r->mem + q * W;
      const ts_mem_account *e = est_of(r, q, c->n);
      fprintf(f, "%s,%s,%s,%d,%d,%s,%zu,%zu,%zu", r->file, ts_dtype_name(r->dt), ck, r->stage,
              r->pipeline, r->pipeline > 1 ? ts_schedule_kind_name(r->schedule) : "", c->n, q,
              q / (c->n / (size_t)r->pipeline));
      for (int k = 0; k < TS_MEM_NUM_CATEGORIES; k++) fprintf(f, ",%.0f,%zu", m[k], e->peak[k]);
      fprintf(f, ",%.0f,%zu,%.0f,%.0f,", m[M_TOTAL], e->peak_total, m[M_STATES],
              (double)ts_mem_model_state_bytes(e));
      if (r->pipeline == 1) fprintf(f, "%.0f", formula(r, r->psi, (double)c->n));
      fprintf(f, ",%.0f,%.1f,%.4f,%.0f,", m[M_RSS], r->tok_s, r->tok_s / b->tok_s, r->comm);
      if (b->comm > 0) fprintf(f, "%.4f", r->comm / b->comm);
      fprintf(f, ",%s,", loss_ok[i] ? "yes" : "no");
      for (size_t s = 0; s < r->n_loss; s++) fprintf(f, "%s%.17g", s ? ";" : "", r->loss[s]);
      fprintf(f, "\n");
    }
  }
  return finish(af);
}

/* compare.png: the measured peak per category stacked, one bar per run
 * (rank 0) or, for a pipelined run, per pipeline stage (its first rank),
 * the estimate's sum of category peaks marked on each bar. The data
 * and the gnuplot script stay in dir; the png is drawn to a temporary name
 * and renamed. */
static int write_chart(const compare *c, const char *dir, const char *png) {
  char dat[4200], gp[4200], tmp[4200], log[4200];
  FMT(dat, "%s/chart.dat", dir);
  FMT(gp, "%s/chart.gp", dir);
  FMT(log, "%s/gnuplot.log", dir);
  FMT(tmp, "%s.tmp", png);
  FILE *f = fopen(dat, "w");
  if (!f) return fprintf(stderr, "tessera compare: %s: %s\n", dat, strerror(errno)), 0;
  fprintf(f, "run");
  for (int k = 0; k < TS_MEM_NUM_CATEGORIES; k++)
    fprintf(f, " %s", ts_mem_category_name((ts_mem_category)k));
  fprintf(f, " estimate\n");
  int bars = 0;
  for (int i = 0; i < c->n_runs; i++)
    for (int st = 0; st < c->runs[i].pipeline; st++, bars++) {
      const run *r = &c->runs[i];
      size_t q = (size_t)st * (c->n / (size_t)r->pipeline); /* the stage's first rank */
      char ck[32];
      ts_train_recompute_name(r->recompute, ck, sizeof ck);
      double est = 0;
      for (int k = 0; k < TS_MEM_NUM_CATEGORIES; k++) est += (double)r->est[st].peak[k];
      fprintf(f, "\"ZeRO-%d", r->stage);
      if (c->n_dts > 1) fprintf(f, " %s", ts_dtype_name(r->dt));
      if (c->n_recomputes > 1) fprintf(f, " recompute %s", ck);
      if (r->pipeline > 1)
        fprintf(f, " P%d %s s%d", r->pipeline, ts_schedule_kind_name(r->schedule), st);
      fprintf(f, "\"");
      for (int k = 0; k < TS_MEM_NUM_CATEGORIES; k++) fprintf(f, " %.4f", r->mem[q * W + k] / MiB);
      fprintf(f, " %.4f\n", est / MiB);
    }
  fclose(f);
  f = fopen(gp, "w");
  if (!f) return fprintf(stderr, "tessera compare: %s: %s\n", gp, strerror(errno)), 0;
  fprintf(f,
          "set terminal pngcairo size %d,560 font 'sans,10'\n"
          "set output '%s'\n"
          "set title \"%s on %zu ranks: peak bytes per ledger category, rank 0 or each pipeline "
          "stage's first rank (measured, stacked)\"\n"
          "set style data histograms\nset style histogram rowstacked\n"
          "set style fill solid 0.85 border -1\nset boxwidth 0.6\n"
          "set key outside right top autotitle columnhead\nset ylabel 'MiB per rank'\n"
          "set yrange [0:*]\nset grid ytics\n%s"
          "plot for [k=2:%d] '%s' using k:xtic(1), "
          "'' using 0:%d with points pt 9 ps 2.2 lc rgb 'black' title 'estimate (sum of peaks)'\n",
          bars > 6 ? 160 + 110 * bars : 860, tmp, c->arch.name, c->n,
          bars > 4 ? "set xtics rotate by -25\n" : "", TS_MEM_NUM_CATEGORIES + 1, dat,
          TS_MEM_NUM_CATEGORIES + 2);
  fclose(f);
  char *argv[] = {"/usr/bin/gnuplot", gp, NULL};
  if (access(argv[0], X_OK) != 0)
    return fprintf(stderr, "tessera compare: /usr/bin/gnuplot not found: install gnuplot-nox "
                           "(tools/setup.sh does)\n"), 0;
  int rc = ts_tool_spawn(argv, log);
  if (rc != 0 || ts_atomic_rename(tmp, png) != TS_OK) {
    fprintf(stderr, "tessera compare: gnuplot failed (exit %d); the end of %s:\n", rc, log);
    print_tail(log);
    remove(tmp);
    return 0;
  }
  return 1;
}

/* Parses the flags into c: TS_FLAGS_OK, TS_FLAGS_HELP (usage printed) or
 * TS_FLAGS_BAD_USAGE (the error printed). */
static int parse_flags(compare *c, int argc, char **argv) {
  const ts_flag flags[] = {
      TS_FLAG_STRING("--model", NULL, &c->model, "CONFIG",
                     "a preset (llama-tiny, ...) or a Hugging Face config.json; required", NULL),
      TS_FLAG_SIZE("-n", NULL, &c->n, 1, "N", "ranks of every run; required", NULL),
      TS_FLAG_STRING("--data", NULL, &c->data, "DIR",
                     "token shards (default $TESSERA_HOME/data/kjv)", NULL),
      TS_FLAG_CUSTOM("--zero", NULL, c, parse_stages, "0,1,2,3",
                     "ZeRO stages to run (default 0,1,2,3)", NULL),
      TS_FLAG_CUSTOM("--dtype", NULL, c, parse_dtypes, "fp32[,bf16,fp16]",
                     "compute dtypes to run (default fp32)", NULL),
      TS_FLAG_CUSTOM("--activation-checkpointing", NULL, c, parse_recomputes,
                     "none[,all,every:K]",
                     "checkpointing settings to run (default none)", NULL),
      TS_FLAG_CUSTOM("--pipeline", NULL, c, parse_pipelines, "1[,2,...]",
                     "pipeline stage counts to run, each dividing N (default 1)", NULL),
      TS_FLAG_CUSTOM("--schedule", NULL, c, parse_schedules, "1f1b[,gpipe]",
                     "schedules of the pipelined runs (default 1f1b)", NULL),
      TS_FLAG_SIZE("--grad-accum", NULL, &c->grad_accum, 1, "M",
                   "micro-batches per step (default 1, or twice the largest --pipeline)", NULL),
      TS_FLAG_SIZE("--steps", NULL, &c->steps, 1, "K", "steps per run (default 5)", NULL),
      TS_FLAG_SIZE("--micro-batch", NULL, &c->micro_batch, 1, "B",
                   "sequences per micro-batch per rank (default 4)", NULL),
      TS_FLAG_SIZE("--seq", NULL, &c->seq, 1, "T", "tokens per sequence (default 128)", NULL),
      TS_FLAG_FLOAT("--lr", NULL, &c->lr, "LR", "peak learning rate (default 1e-3)", NULL),
      TS_FLAG_STRING("--out", NULL, &c->out, "DIR", "where the three files go (default .)", NULL),
      TS_FLAG_SWITCH("--reuse", NULL, &c->reuse,
                     "read the metrics of an earlier compare in OUT instead of training"),
      TS_FLAG_CUSTOM("--device", NULL, &c->device, ts_tool_parse_device, "cpu|cuda|auto",
                     "where every run trains, and whose bytes the plans count (default cpu)",
                     NULL),
  };
  int r = ts_flags_parse("compare", flags, sizeof flags / sizeof *flags, argc, argv, USAGE);
  if (r != TS_FLAGS_OK) return r;
  if (!c->model) return ts_flags_error("compare", "--model is required " TS_FLAGS_HINT);
  if (c->n_stages > 4)
    return ts_flags_error("compare", "--zero: at most the four stages 0, 1, 2, 3");
  if (c->n == 0) return ts_flags_error("compare", "-n N (ranks) is required " TS_FLAGS_HINT);
  int most = 1;
  for (int i = 0; i < c->n_pipelines; i++) {
    if (c->n % (size_t)c->pipelines[i])
      return ts_flags_error("compare", "--pipeline %d: expected a number of stages dividing -n %zu",
                            c->pipelines[i], c->n);
    if (c->pipelines[i] > most) most = c->pipelines[i];
  }
  if (!c->grad_accum) c->grad_accum = most > 1 ? 2 * (size_t)most : 1;
  int index;
  if (ts_tool_resolve_device(c->device, !c->reuse, &c->dev, &index) != TS_OK)
    return ts_flags_error("compare", "%s", ts_last_error());
  return TS_FLAGS_OK;
}

/* Loads the model config and lists the runs: dtype, then checkpointing,
 * then stage; each with its plan. */
static int plan_runs(compare *c) {
  char path[4096];
  ts_status st = ts_model_resolve(c->model, path, sizeof path);
  if (st == TS_OK) st = ts_model_load(path, &c->arch);
  if (st != TS_OK) return fprintf(stderr, "tessera compare: %s\n", ts_last_error()), 0;
  /* the layouts: (P, schedule) pairs, one for P = 1 */
  int lp[MAX_LIST * MAX_LIST], n_layouts = 0;
  ts_schedule_kind ls[MAX_LIST * MAX_LIST];
  for (int p = 0; p < c->n_pipelines; p++)
    for (int k = 0; k < (c->pipelines[p] > 1 ? c->n_schedules : 1); k++, n_layouts++) {
      lp[n_layouts] = c->pipelines[p];
      ls[n_layouts] = c->schedules[k];
    }
  c->n_runs = c->n_dts * c->n_recomputes * n_layouts * c->n_stages;
  c->runs = calloc((size_t)c->n_runs, sizeof *c->runs);
  if (!c->runs) return fprintf(stderr, "tessera compare: out of memory\n"), 0;
  int i = 0;
  for (int d = 0; d < c->n_dts; d++)
    for (int k = 0; k < c->n_recomputes; k++)
      for (int l = 0; l < n_layouts; l++)
        for (int s = 0; s < c->n_stages; s++, i++) {
          run *r = &c->runs[i];
          r->dt = c->dts[d];
          r->recompute = c->recomputes[k];
          r->stage = c->stages[s];
          r->pipeline = lp[l];
          r->schedule = ls[l];
          r->base = i - s;
          /* the first run of this dtype and P (with accumulation, of its
           * reduction too: stages 2-3 reduce every micro-batch, engine.h) */
          r->loss_base = i;
          for (int j = i - 1; j >= 0; j--)
            if (c->runs[j].dt == r->dt && c->runs[j].pipeline == r->pipeline &&
                (c->grad_accum == 1 || (c->runs[j].stage >= 2) == (r->stage >= 2)))
              r->loss_base = j;
          char ck[32], file_ck[32], layout[48] = "", file_layout[48] = "";
          ts_train_recompute_name(r->recompute, ck, sizeof ck);
          snprintf(file_ck, sizeof file_ck, "%s", ck);
          for (char *p = file_ck; *p; p++)
            if (*p == ':') *p = '-';
          if (r->pipeline > 1) {
            snprintf(layout, sizeof layout, " P%d %s", r->pipeline,
                     ts_schedule_kind_name(r->schedule));
            snprintf(file_layout, sizeof file_layout, "-p%d-%s", r->pipeline,
                     ts_schedule_kind_name(r->schedule));
          }
          snprintf(r->name, sizeof r->name, "%s recompute:%s%s ZeRO-%d", ts_dtype_name(r->dt), ck,
                   layout, r->stage);
          snprintf(r->file, sizeof r->file, "%s-%s%s-zero%d", ts_dtype_name(r->dt), file_ck,
                   file_layout, r->stage);
          r->mem = calloc(c->n * W, sizeof *r->mem);
          if (!r->mem) return fprintf(stderr, "tessera compare: out of memory\n"), 0;
          ts_engine_opts o = ts_engine_default_opts();
          o.micro_batch = c->micro_batch;
          o.seq = c->seq;
          o.grad_accum = c->grad_accum;
          o.dtype = r->dt;
          o.zero_stage = r->stage;
          o.recompute_every = r->recompute;
          o.device = c->dev;
          o.pipeline_stages = r->pipeline;
          o.schedule = r->schedule;
          size_t dp = c->n / (size_t)r->pipeline;
          ts_status st = ts_engine_pipeline_split(&c->arch, &o, r->split);
          for (int q = 0; q < r->pipeline && st == TS_OK; q++)
            st = ts_engine_plan_stage(&c->arch, &o, dp, q, &r->est[q]);
          if (st != TS_OK) return fprintf(stderr, "tessera compare: %s\n", ts_last_error()), 0;
        }
  return 1;
}

/* Each pipelined run's step `step` as a timeline picture in OUT, and its
 * measured bubble. */
static int draw_timelines(compare *c, const char *dir) {
  for (int i = 0; i < c->n_runs; i++) {
    run *r = &c->runs[i];
    if (r->pipeline == 1) continue;
    char trace[4200], png[4200], title[256];
    FMT(trace, "%s/%s.trace.json", dir, r->file);
    FMT(png, "%s/timeline-%s.png", c->out, r->file);
    ts_timeline t;
    if (ts_timeline_load(trace, (int)c->steps, &t) != TS_OK)
      return fprintf(stderr, "tessera compare: %s\n", ts_last_error()), 0;
    r->bubble = t.bubble_busiest;
    snprintf(title, sizeof title, "%s, step %zu: bubble %.1f%% on the busiest rank (measured)",
             r->name, c->steps, 100.0 * t.bubble_busiest);
    ts_status st = ts_timeline_draw(&t, title, dir, png);
    ts_timeline_free(&t);
    if (st != TS_OK) return fprintf(stderr, "tessera compare: %s\n", ts_last_error()), 0;
  }
  return 1;
}

int ts_tool_compare(int argc, char **argv) {
  compare c;
  memset(&c, 0, sizeof c);
  c.out = ".";
  c.n = 0;
  c.steps = 5;
  c.micro_batch = 4;
  c.seq = 128;
  c.lr = 1e-3f;
  c.stages[0] = 0, c.stages[1] = 1, c.stages[2] = 2, c.stages[3] = 3, c.n_stages = 4;
  c.dts[0] = TS_FP32, c.n_dts = 1;
  c.recomputes[0] = 0, c.n_recomputes = 1;
  c.pipelines[0] = 1, c.n_pipelines = 1;
  c.schedules[0] = TS_SCHEDULE_1F1B, c.n_schedules = 1;
  int r = parse_flags(&c, argc, argv);
  if (r != TS_FLAGS_OK) return r == TS_FLAGS_HELP ? 0 : 2;
  char data[4096], dir[4200];
  if (!c.data) {
    const char *home = getenv("TESSERA_HOME");
    FMT(data, "%s/data/kjv", home ? home : ".");
    c.data = data;
  }
  if (!plan_runs(&c)) return 2;
  FMT(dir, "%s/compare_runs", c.out);
  if (!c.reuse && mkdir(c.out, 0755) != 0 && errno != EEXIST)
    return fprintf(stderr, "tessera compare: --out %s: %s\n", c.out, strerror(errno)), 2;
  if (!c.reuse && mkdir(dir, 0755) != 0 && errno != EEXIST)
    return fprintf(stderr, "tessera compare: %s: %s\n", dir, strerror(errno)), 2;
  int rc = 0;
  for (int i = 0; i < c.n_runs && rc == 0; i++) {
    run *r = &c.runs[i];
    if (!c.reuse) {
      struct timespec t0, t1;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      printf("run %d/%d: %s on %zu ranks, %zu steps ... ", i + 1, c.n_runs, r->name, c.n, c.steps);
      fflush(stdout);
      if (!launch_run(&c, r, dir)) rc = 1;
      clock_gettime(CLOCK_MONOTONIC, &t1);
      if (rc == 0)
        printf("%.1f s\n", (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    }
    if (rc == 0 && !read_run(&c, r, dir)) rc = 1;
  }
  if (rc == 0 && !draw_timelines(&c, dir)) rc = 1;
  if (rc == 0) {
    /* The checks, as lines for compare.md and the terminal. */
    char *checks = NULL;
    size_t checks_len = 0;
    FILE *ck = open_memstream(&checks, &checks_len);
    int *loss_ok = calloc((size_t)c.n_runs, sizeof *loss_ok);
    if (!ck || !loss_ok) return fprintf(stderr, "tessera compare: out of memory\n"), 1;
    int states = report(ck, &c, check_model_states, NULL,
                        "model states (params, grads, master, optim: peaks and bytes between "
                        "steps) measured = estimate = formula on every rank of every run "
                        "(the formula where one stage holds the whole model)");
    int falling = report(ck, &c, check_falling, NULL,
                         "model states per rank fall as the ZeRO stage rises");
    char what[512];
    snprintf(what, sizeof what,
             "loss identical at every step across ZeRO stages%s%s (bitwise, per dtype and "
             "pipeline layout%s)",
             c.n_recomputes > 1 ? ", checkpointing settings" : "",
             c.n_schedules > 1 ? ", schedules" : "",
             c.grad_accum > 1 ? "; with --grad-accum > 1 stages 0-1 and 2-3 apart, as stages "
                                "2-3 reduce every micro-batch" : "");
    int losses = report(ck, &c, check_losses, loss_ok, what);
    fclose(ck);
    char md[4200], csv[4200], png[4200];
    FMT(md, "%s/compare.md", c.out);
    FMT(csv, "%s/compare.csv", c.out);
    FMT(png, "%s/compare.png", c.out);
    if (!write_md(&c, md, checks) || !write_csv(&c, csv, loss_ok) || !write_chart(&c, dir, png))
      rc = 1;
    if (rc == 0) {
      FILE *f = fopen(md, "r");
      char buf[4096];
      size_t n;
      while (f && (n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stdout);
      if (f) fclose(f);
      printf("\nwrote %s, %s, %s\n", md, csv, png);
      if (!(states && falling && losses)) rc = 1;
    }
    free(checks);
    free(loss_ok);
  }
  for (int i = 0; c.runs && i < c.n_runs; i++) free(c.runs[i].mem);
  free(c.runs);
  ts_model_free(&c.arch);
  return rc;
}
