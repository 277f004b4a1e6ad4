/*
 * compare.h — private to `tessera compare`: what its two files share.
 * compare_main.c plans the runs (dtype x checkpointing x pipeline layout x
 * ZeRO stage), trains them through tools/launch.sh and reads their
 * metrics; compare_report.c checks them and writes compare.md, compare.csv
 * and compare.png.
 */
#ifndef TS_TOOLS_COMPARE_H
#define TS_TOOLS_COMPARE_H

#include <stdio.h>
#include <stdlib.h>

#include "engine/engine.h"

#define TS_COMPARE_MAX_LIST 8
#define TS_COMPARE_COLUMNS \
  (TS_MEM_NUM_CATEGORIES + 3) /* per rank: categories, total, peak_rss, model_states */
#define TS_COMPARE_TOTAL TS_MEM_NUM_CATEGORIES
#define TS_COMPARE_RSS (TS_MEM_NUM_CATEGORIES + 1)
#define TS_COMPARE_STATES (TS_MEM_NUM_CATEGORIES + 2)

typedef struct ts_compare_run {
  ts_dtype dt;
  size_t recompute; /* ts_engine_opts.recompute_every */
  int stage;
  int pipeline;    /* P pipeline stages (1: none) */
  ts_schedule_kind schedule; /* when P > 1 */
  int v;           /* model chunks per stage (interleaved: --virtual-stages; else 1) */
  char name[96];   /* "fp32 recompute:none ZeRO-2", "... P2 1f1b ZeRO-2" */
  char file[96];   /* "fp32-none-zero2", "fp32-none-p2-1f1b-zero2" (metrics .jsonl, log .log) */
  size_t n_loss;
  double loss[4096];
  double tok_s;    /* mean over steps 2.. (all steps when only one) */
  double comm;     /* bytes sent per step, rank 0, last step */
  double comm_remote; /* of them to ranks on other nodes (hosts) */
  double psi;      /* padded parameter count */
  double *mem;     /* [N][TS_COMPARE_COLUMNS] measured, from the summary */
  ts_mem_account est[TS_ENGINE_MAX_STAGES]; /* the plan of each pipeline stage */
  int split[TS_ENGINE_MAX_STAGES + 1];      /* first unit of each (virtual) stage, then n_units */
  double bubble;   /* P > 1: the measured bubble of the drawn step (busiest rank) */
  int base;        /* the run its ratios compare against: the first of its dtype,
                      checkpointing and pipeline layout */
  int loss_base;   /* the run its losses must equal: the first of its dtype and P */
} ts_compare_run;

/* The plan of rank q's pipeline stage (ranks q = stage * dp + dp_rank). */
static inline const ts_mem_account *est_of(const ts_compare_run *r, size_t q, size_t n) {
  return &r->est[q / (n / (size_t)r->pipeline)];
}

typedef struct ts_compare {
  const char *model, *data, *out;
  size_t n, steps, micro_batch, seq;
  float lr;
  int stages[TS_COMPARE_MAX_LIST], n_stages; /* more than 4 refused after parsing */
  ts_dtype dts[TS_COMPARE_MAX_LIST];
  int n_dts;
  size_t recomputes[TS_COMPARE_MAX_LIST];
  int n_recomputes;
  int pipelines[TS_COMPARE_MAX_LIST], n_pipelines; /* --pipeline P list */
  ts_schedule_kind schedules[TS_COMPARE_MAX_LIST]; /* --schedule list (pipelined runs) */
  int n_schedules;
  size_t virtual_stages; /* --virtual-stages v of the interleaved runs (default 2) */
  size_t grad_accum; /* micro-batches per step; 0: 1, or 2 x the largest P */
  size_t shard_group; /* --shard-group S: hybrid sharding in every run (0: plain ZeRO) */
  int reuse;
  int no_chart;    /* --no-chart: no compare.png or timeline pictures (no gnuplot) */
  int device;      /* --device choice (tools.h), passed to every run */
  ts_device dev;   /* what it resolves to here, for the plans */
  ts_model arch;   /* the model --model names, loaded */
  ts_compare_run *runs;
  int n_runs;
} ts_compare;

static const double MiB = 1024.0 * 1024.0;

/* The plotter of compare.png (tools/timeline.c draws with the same). */
#define TS_COMPARE_GNUPLOT "/usr/bin/gnuplot"

/* Formats into a char array, exiting with a one-line error when it does
 * not fit (a path too long). */
#define TS_COMPARE_FMT(buf, ...) fits(snprintf(buf, sizeof buf, __VA_ARGS__), sizeof buf, buf)
static inline void fits(int n, size_t cap, const char *buf) {
  if (n < 0 || (size_t)n >= cap) {
    fprintf(stderr, "tessera compare: a path is too long (over %zu bytes): %.60s...\n", cap, buf);
    exit(2);
  }
}


/* Prints the last lines of a failed run's (or gnuplot's) log to stderr
 * (compare_main.c). */
void ts_compare_print_tail(const char *log);

/* ---- compare_report.c ---------------------------------------------------- */

/* The three checks over c's runs (model states = plan = formula on every
 * rank; model states falling with the ZeRO stage; identical losses) as
 * "- PASS: ..." / "- FAIL: ..." lines with their details into *text (free
 * it), and each run's loss verdict into loss_ok (n_runs). Returns 1 when
 * every check passes, 0 when one fails, -1 out of memory (*text NULL). */
int ts_compare_checks(const ts_compare *c, char **text, int *loss_ok);

/* compare.md (the checks' text, the tables, the pictures), compare.csv (a
 * row per run and rank) and compare.png (dir holds gnuplot's data and
 * script): each written whole or not at all. 0 after printing why one
 * failed, else 1. */
int ts_compare_write_md(const ts_compare *c, const char *path, const char *checks);
int ts_compare_write_csv(const ts_compare *c, const char *path, const int *loss_ok);
int ts_compare_write_chart(const ts_compare *c, const char *dir, const char *png);

#endif /* TS_TOOLS_COMPARE_H */
