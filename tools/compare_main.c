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
 * timeline-RUN.png (gnuplot, checked for before any run; --no-chart
 * leaves the pictures out; the checks and the files are
 * compare_report.c's). Exit status 0 when every check passes, 1 when one
 * fails or a run fails, 2 bad usage. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

#include "tools/compare.h"

/* Splits the comma list v into at most TS_COMPARE_MAX_LIST items, each parsed by
 * `item` into out[i]; *count gets their number. An item's error ends with
 * "(not ITEM)" when v holds more than that item. */
static ts_status parse_list(const char *v, int *count,
                            ts_status (*item)(const char *item, int i, void *out), void *out) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", v);
  *count = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (*count >= TS_COMPARE_MAX_LIST)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "expected at most %d values",
                          TS_COMPARE_MAX_LIST);
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
  return parse_list(v, &((ts_compare *)c)->n_stages, stage_item, ((ts_compare *)c)->stages);
}
/* (see parse_stages) */
static ts_status parse_dtypes(const char *v, void *c) {
  return parse_list(v, &((ts_compare *)c)->n_dts, dtype_item, ((ts_compare *)c)->dts);
}
/* (see parse_stages) */
static ts_status parse_pipelines(const char *v, void *c) {
  return parse_list(v, &((ts_compare *)c)->n_pipelines, pipeline_item,
                    ((ts_compare *)c)->pipelines);
}
/* (see parse_stages) */
static ts_status parse_schedules(const char *v, void *c) {
  return parse_list(v, &((ts_compare *)c)->n_schedules, schedule_item,
                    ((ts_compare *)c)->schedules);
}
/* (see parse_stages) */
static ts_status parse_recomputes(const char *v, void *c) {
  return parse_list(v, &((ts_compare *)c)->n_recomputes, recompute_item,
                    ((ts_compare *)c)->recomputes);
}

void ts_compare_print_tail(const char *log) {
  char cmd[4200];
  TS_COMPARE_FMT(cmd, "tail -n 5 '%s' >&2", log);
  if (system(cmd) != 0) fprintf(stderr, "  (see %s)\n", log);
}

/* Trains run r through tools/launch.sh into OUT/compare_runs/. */
static int launch_run(const ts_compare *c, const ts_compare_run *r, const char *dir) {
  const char *home = getenv("TESSERA_HOME");
  char launch[4096], self[4096], metrics[4200], log[4200], zero[8], steps[32], b[32], t[32], lr[32],
      ck[32], n[32], pp[16], accum[32], trace[4200], sg[32];
  TS_COMPARE_FMT(launch, "%s/tools/launch.sh", home ? home : ".");
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) return fprintf(stderr, "tessera compare: cannot find its own binary\n"), 0;
  self[len] = '\0';
  TS_COMPARE_FMT(metrics, "%s/%s.jsonl", dir, r->file);
  TS_COMPARE_FMT(log, "%s/%s.log", dir, r->file);
  snprintf(zero, sizeof zero, "%d", r->stage);
  snprintf(steps, sizeof steps, "%zu", c->steps);
  snprintf(b, sizeof b, "%zu", c->micro_batch);
  snprintf(t, sizeof t, "%zu", c->seq);
  snprintf(lr, sizeof lr, "%g", (double)c->lr);
  snprintf(n, sizeof n, "%zu", c->n);
  snprintf(pp, sizeof pp, "%d", r->pipeline);
  snprintf(accum, sizeof accum, "%zu", c->grad_accum);
  TS_COMPARE_FMT(trace, "%s/%s.trace.json", dir, r->file);
  ts_train_recompute_name(r->recompute, ck, sizeof ck);
  snprintf(sg, sizeof sg, "%zu", c->shard_group);
  char *argv[] = {launch,
                  "-n",
                  n,
                  self,
                  "train",
                  "--model",
                  (char *)c->model,
                  "--data",
                  (char *)c->data,
                  "--zero",
                  zero,
                  "--dtype",
                  (char *)ts_dtype_name(r->dt),
                  "--activation-checkpointing",
                  ck,
                  "--steps",
                  steps,
                  "--micro-batch",
                  b,
                  "--seq",
                  t,
                  "--lr",
                  lr,
                  "--warmup",
                  "1",
                  "--eval-batches",
                  "1",
                  "--log-every",
                  steps,
                  "--metrics",
                  metrics,
                  "--device",
                  (char *)ts_tool_device_choice_name(c->device),
                  "--grad-accum",
                  accum,
                  "--pipeline",
                  pp,
                  "--schedule",
                  (char *)ts_schedule_kind_name(r->schedule),
                  NULL,
                  NULL,
                  NULL,
                  NULL,
                  NULL,
                  NULL,
                  NULL};
  /* the optional flags fill the NULLs at the end, leaving one */
  size_t k = sizeof argv / sizeof *argv - 7;
  char vs[24];
  snprintf(vs, sizeof vs, "%d", r->v);
  if (r->v > 1) argv[k++] = "--virtual-stages", argv[k++] = vs;
  if (c->shard_group) argv[k++] = "--shard-group", argv[k++] = sg;
  if (r->pipeline > 1) argv[k++] = "--trace", argv[k++] = trace;
  int rc = ts_tool_spawn(argv, log);
  if (rc != 0) {
    fprintf(stderr, "tessera compare: run %s failed (exit %d); the end of %s:\n", r->name, rc, log);
    ts_compare_print_tail(log);
    return 0;
  }
  return 1;
}

static double num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Reads run r's metrics: losses and speed per step, and the summary. */
static int read_run(const ts_compare *c, ts_compare_run *r, const char *dir) {
  char path[4200], line[1 << 16];
  TS_COMPARE_FMT(path, "%s/%s.jsonl", dir, r->file);
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
      r->comm_remote = num(sm, "comm_bytes_across_nodes_per_step");
      r->psi = num(cJSON_GetObjectItemCaseSensitive(sm, "params"), "padded");
      have_summary = (size_t)cJSON_GetArraySize(ranks) == c->n;
      for (size_t q = 0; have_summary && q < c->n; q++) {
        const cJSON *e = cJSON_GetArrayItem(ranks, (int)q);
        for (int k = 0; k < TS_MEM_NUM_CATEGORIES; k++)
          r->mem[q * TS_COMPARE_COLUMNS + k] = num(e, ts_mem_category_name((ts_mem_category)k));
        r->mem[q * TS_COMPARE_COLUMNS + TS_COMPARE_TOTAL] = num(e, "total");
        r->mem[q * TS_COMPARE_COLUMNS + TS_COMPARE_RSS] = num(e, "peak_rss");
        r->mem[q * TS_COMPARE_COLUMNS + TS_COMPARE_STATES] = num(e, "model_states");
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

/* Parses the flags into c: TS_FLAGS_OK, TS_FLAGS_HELP (usage printed) or
 * TS_FLAGS_BAD_USAGE (the error printed). */
static int parse_flags(ts_compare *c, int argc, char **argv) {
  const ts_flag flags[] = {
      TS_FLAG_STRING("--model", NULL, &c->model, "CONFIG",
                     "a preset (llama-tiny, ...) or a Hugging Face config.json; required", NULL),
      TS_FLAG_SIZE("-n", NULL, &c->n, 1, "N", "ranks of every run; required", NULL),
      TS_FLAG_STRING("--data", NULL, &c->data, "DIR",
                     "token shards (default $TESSERA_HOME/data/kjv, data/kjv-mlm for a masked LM)",
                     NULL),
      TS_FLAG_CUSTOM("--zero", NULL, c, parse_stages, "0,1,2,3",
                     "ZeRO stages to run (default 0,1,2,3)", NULL),
      TS_FLAG_CUSTOM("--dtype", NULL, c, parse_dtypes, "fp32[,bf16,fp16]",
                     "compute dtypes to run (default fp32)", NULL),
      TS_FLAG_CUSTOM("--activation-checkpointing", NULL, c, parse_recomputes, "none[,all,every:K]",
                     "checkpointing settings to run (default none)", NULL),
      TS_FLAG_CUSTOM("--pipeline", NULL, c, parse_pipelines, "1[,2,...]",
                     "pipeline stage counts to run, each dividing N (default 1)", NULL),
      TS_FLAG_CUSTOM("--schedule", NULL, c, parse_schedules, "1f1b[,gpipe,interleaved,zb-h1,zbv]",
                     "schedules of the pipelined runs (default 1f1b)", NULL),
      TS_FLAG_SIZE("--virtual-stages", NULL, &c->virtual_stages, 2, "v",
                   "model chunks per stage of the interleaved runs (default 2)", NULL),
      TS_FLAG_SIZE("--grad-accum", NULL, &c->grad_accum, 1, "M",
                   "micro-batches per step (default 1, or twice the largest --pipeline)", NULL),
      TS_FLAG_SIZE("--shard-group", NULL, &c->shard_group, 1, "S",
                   "hybrid sharding in every run: ZeRO within groups of S consecutive "
                   "data-parallel ranks (default: all)",
                   NULL),
      TS_FLAG_SIZE("--steps", NULL, &c->steps, 1, "K", "steps per run (default 5)", NULL),
      TS_FLAG_SIZE("--micro-batch", NULL, &c->micro_batch, 1, "B",
                   "sequences per micro-batch per rank (default 4)", NULL),
      TS_FLAG_SIZE("--seq", NULL, &c->seq, 1, "T", "tokens per sequence (default 128)", NULL),
      TS_FLAG_FLOAT("--lr", NULL, &c->lr, "LR", "peak learning rate (default 1e-3)", NULL),
      TS_FLAG_STRING("--out", NULL, &c->out, "DIR", "where the three files go (default .)", NULL),
      TS_FLAG_SWITCH("--reuse", NULL, &c->reuse,
                     "read the metrics of an earlier compare in OUT instead of training"),
      TS_FLAG_SWITCH("--no-chart", NULL, &c->no_chart,
                     "write compare.md and compare.csv only, without compare.png and the "
                     "timelines (a machine without gnuplot)"),
      TS_FLAG_CUSTOM("--device", NULL, &c->device, ts_tool_parse_device, "cpu|cuda|auto",
                     "where every run trains, and whose bytes the plans count (default cpu)", NULL),
  };
  int r = ts_flags_parse("compare", flags, sizeof flags / sizeof *flags, argc, argv, USAGE);
  if (r != TS_FLAGS_OK) return r;
  if (!c->model) return ts_flags_error("compare", "--model is required " TS_FLAGS_HINT);
  if (c->n_stages > 4)
    return ts_flags_error("compare", "--zero: at most the four stages 0, 1, 2, 3");
  if (c->n == 0) return ts_flags_error("compare", "-n N (ranks) is required " TS_FLAGS_HINT);
  int cores = ts_tool_cores(); /* launch's bound: the runs are on this node */
  size_t most_ranks = 16 * (size_t)cores;
  if (c->n > most_ranks)
    return ts_flags_error("compare",
                          "-n %zu: expected at most 16 ranks per core of this node (16 x %d = %zu)",
                          c->n, cores, most_ranks);
  int most = 1;
  for (int i = 0; i < c->n_pipelines; i++) {
    if (c->n % (size_t)c->pipelines[i])
      return ts_flags_error("compare", "--pipeline %d: expected a number of stages dividing -n %zu",
                            c->pipelines[i], c->n);
    if (c->pipelines[i] > most) most = c->pipelines[i];
  }
  if (!c->grad_accum) c->grad_accum = most > 1 ? 2 * (size_t)most : 1;
  for (int i = 0; c->shard_group && i < (c->n_pipelines ? c->n_pipelines : 1); i++) {
    size_t dp = c->n / (size_t)(c->n_pipelines ? c->pipelines[i] : 1);
    if (c->shard_group > dp || dp % c->shard_group)
      return ts_flags_error("compare",
                            "--shard-group %zu: expected a divisor of the %zu data-parallel ranks "
                            "of -n %zu",
                            c->shard_group, dp, c->n);
  }
  int index;
  if (ts_tool_resolve_device(c->device, !c->reuse, &c->dev, &index) != TS_OK)
    return ts_flags_error("compare", "%s", ts_last_error());
  if (!c->no_chart && access(TS_COMPARE_GNUPLOT, X_OK) != 0) /* before any run, not after */
    return ts_flags_error("compare",
                          TS_COMPARE_GNUPLOT " not found: install gnuplot-nox (tools/setup.sh "
                          "does), or pass --no-chart");
  return TS_FLAGS_OK;
}

/* Loads the model config and lists the runs: dtype, then checkpointing,
 * then stage; each with its plan. */
static int plan_runs(ts_compare *c) {
  char path[4096];
  ts_status st = ts_model_resolve(c->model, path, sizeof path);
  if (st == TS_OK) st = ts_model_load(path, &c->arch);
  if (st != TS_OK) return fprintf(stderr, "tessera compare: %s\n", ts_flags_last_error()), 0;
  /* the layouts: (P, schedule) pairs, one for P = 1 */
  int lp[TS_COMPARE_MAX_LIST * TS_COMPARE_MAX_LIST], n_layouts = 0;
  ts_schedule_kind ls[TS_COMPARE_MAX_LIST * TS_COMPARE_MAX_LIST];
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
          ts_compare_run *r = &c->runs[i];
          r->dt = c->dts[d];
          r->recompute = c->recomputes[k];
          r->stage = c->stages[s];
          r->pipeline = lp[l];
          r->schedule = ls[l];
          r->v = r->pipeline > 1 && r->schedule == TS_SCHEDULE_INTERLEAVED
                     ? (int)c->virtual_stages
                 : r->pipeline > 1 && r->schedule == TS_SCHEDULE_ZBV ? 2
                                                                     : 1;
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
          char v[16] = "";
          if (r->v > 1 && r->schedule == TS_SCHEDULE_INTERLEAVED)
            snprintf(v, sizeof v, "-v%d", r->v);
          if (r->pipeline > 1) {
            snprintf(layout, sizeof layout, " P%d %s%s", r->pipeline,
                     ts_schedule_kind_name(r->schedule), v);
            snprintf(file_layout, sizeof file_layout, "-p%d-%s%s", r->pipeline,
                     ts_schedule_kind_name(r->schedule), v);
          }
          snprintf(r->name, sizeof r->name, "%s recompute:%s%s ZeRO-%d", ts_dtype_name(r->dt), ck,
                   layout, r->stage);
          snprintf(r->file, sizeof r->file, "%s-%s%s-zero%d", ts_dtype_name(r->dt), file_ck,
                   file_layout, r->stage);
          r->mem = calloc(c->n * TS_COMPARE_COLUMNS, sizeof *r->mem);
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
          o.virtual_stages = r->v;
          o.shard_group = (int)c->shard_group;
          size_t dp = c->n / (size_t)r->pipeline;
          ts_status st = ts_engine_pipeline_split(&c->arch, &o, r->split);
          for (int q = 0; q < r->pipeline && st == TS_OK; q++)
            st = ts_engine_plan_stage(&c->arch, &o, dp, q, &r->est[q]);
          if (st != TS_OK)
            return fprintf(stderr, "tessera compare: %s\n", ts_flags_last_error()), 0;
        }
  return 1;
}

/* Each pipelined run's step `step` as a timeline picture in OUT, and its
 * measured bubble. */
static int draw_timelines(ts_compare *c, const char *dir) {
  for (int i = 0; i < c->n_runs; i++) {
    ts_compare_run *r = &c->runs[i];
    if (r->pipeline == 1) continue;
    char trace[4200], png[4200], title[256];
    TS_COMPARE_FMT(trace, "%s/%s.trace.json", dir, r->file);
    TS_COMPARE_FMT(png, "%s/timeline-%s.png", c->out, r->file);
    ts_timeline t;
    if (ts_timeline_load(trace, (int)c->steps, &t) != TS_OK)
      return fprintf(stderr, "tessera compare: %s\n", ts_flags_last_error()), 0;
    r->bubble = t.bubble_busiest;
    if (c->no_chart) {
      ts_timeline_free(&t);
      continue;
    }
    snprintf(title, sizeof title, "%s, step %zu: bubble %.1f%% on the busiest rank (measured)",
             r->name, c->steps, 100.0 * t.bubble_busiest);
    ts_status st = ts_timeline_draw(&t, title, dir, png);
    ts_timeline_free(&t);
    if (st != TS_OK) return fprintf(stderr, "tessera compare: %s\n", ts_flags_last_error()), 0;
  }
  return 1;
}

int ts_tool_compare(int argc, char **argv) {
  ts_compare c;
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
  c.virtual_stages = 2;
  int r = parse_flags(&c, argc, argv);
  if (r != TS_FLAGS_OK) return r == TS_FLAGS_HELP ? 0 : 2;
  char data[4096], dir[4200];
  if (!plan_runs(&c)) return 2;
  if (!c.data) { /* a masked LM reads the corpus of `prepare --mlm` */
    const char *home = getenv("TESSERA_HOME");
    TS_COMPARE_FMT(data, "%s/data/kjv%s", home ? home : ".",
                   c.arch.objective == TS_OBJECTIVE_MASKED_LM ? "-mlm" : "");
    c.data = data;
  }
  for (int k = 0; k < 2 && !c.reuse; k++) { /* the data before any run starts */
    char shard[4200];
    TS_COMPARE_FMT(shard, "%s/%s", c.data, k ? "val.bin" : "train.bin");
    if (access(shard, R_OK) != 0)
      return fprintf(stderr,
                     "tessera compare: --data %s: cannot read %s: expected a folder of token "
                     "shards (tessera prepare)\n",
                     c.data, shard),
             1;
  }
  TS_COMPARE_FMT(dir, "%s/compare_runs", c.out);
  if (!c.reuse && mkdir(c.out, 0755) != 0 && errno != EEXIST)
    return fprintf(stderr, "tessera compare: --out %s: %s\n", c.out, strerror(errno)), 2;
  if (!c.reuse && mkdir(dir, 0755) != 0 && errno != EEXIST)
    return fprintf(stderr, "tessera compare: %s: %s\n", dir, strerror(errno)), 2;
  int rc = 0;
  for (int i = 0; i < c.n_runs && rc == 0; i++) {
    ts_compare_run *r = &c.runs[i];
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
    int *loss_ok = calloc((size_t)c.n_runs, sizeof *loss_ok);
    int passed = loss_ok ? ts_compare_checks(&c, &checks, loss_ok) : -1;
    if (passed < 0) return fprintf(stderr, "tessera compare: out of memory\n"), 1;
    char md[4200], csv[4200], png[4200];
    TS_COMPARE_FMT(md, "%s/compare.md", c.out);
    TS_COMPARE_FMT(csv, "%s/compare.csv", c.out);
    TS_COMPARE_FMT(png, "%s/compare.png", c.out);
    if (!ts_compare_write_md(&c, md, checks) || !ts_compare_write_csv(&c, csv, loss_ok) ||
        (!c.no_chart && !ts_compare_write_chart(&c, dir, png)))
      rc = 1;
    if (rc == 0) {
      char *text; /* the report, on the terminal too */
      if (ts_read_file(md, &text, NULL) == TS_OK) fputs(text, stdout);
      free(text);
      printf("\nwrote %s, %s%s%s\n", md, csv, c.no_chart ? "" : ", ", c.no_chart ? "" : png);
      if (!passed) rc = 1;
    }
    free(checks);
    free(loss_ok);
  }
  for (int i = 0; c.runs && i < c.n_runs; i++) free(c.runs[i].mem);
  free(c.runs);
  ts_model_free(&c.arch);
  return rc;
}
