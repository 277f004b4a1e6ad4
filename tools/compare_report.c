/* compare_report.c — `tessera compare`'s verdicts and outputs (compare.h):
 * the checks (every rank's model states against the plan and the ZeRO
 * formula, model states falling with the stage, identical losses), then
 * compare.md, compare.csv and compare.png, each written whole or not at
 * all. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "engine/trainer.h"
#include "tools/compare.h"
#include "tools/flags.h"
#include "tools/tools.h"

/* The ZeRO paper's model states per rank (§5.1; fp32 keeps no master
 * copy: engine.h's table) for padded Ψ on N ranks. */
/* The ranks each tensor is sharded over: --shard-group S, or N. */
static double sharded_over(const ts_compare *c) {
  return c->shard_group ? (double)c->shard_group : (double)c->n;
}

static double formula(const ts_compare_run *r, double psi, double n) {
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
static int check_model_states(const ts_compare *c, FILE *md, int *per_run) {
  (void)per_run;
  int ok = 1;
  for (int i = 0; i < c->n_runs; i++) {
    const ts_compare_run *r = &c->runs[i];
    for (size_t q = 0; q < c->n; q++) {
      const double *m = r->mem + q * TS_COMPARE_COLUMNS;
      const ts_mem_account *e = est_of(r, q, c->n);
      /* the ZeRO formula covers the whole model on one pipeline stage */
      double f = r->pipeline == 1 ? formula(r, r->psi, sharded_over(c)) : m[TS_COMPARE_STATES];
      int same =
          m[TS_COMPARE_STATES] == (double)ts_mem_model_state_bytes(e) && m[TS_COMPARE_STATES] == f;
      for (int k = TS_MEM_PARAMS; k <= TS_MEM_OPTIM; k++) same &= m[k] == (double)e->peak[k];
      if (!same) {
        fprintf(md,
                "  - %s, rank %zu: measured model states %.0f B, estimate %.0f B, formula %.0f B\n",
                r->name, q, m[TS_COMPARE_STATES], (double)ts_mem_model_state_bytes(e), f);
        ok = 0;
      }
    }
  }
  return ok;
}

/* Check 2: the losses of every run equal, step for step and to the bit,
 * those of its base run (the first run of its dtype and pipeline layout
 * and, with accumulation, reduction: loss_base). */
static int check_losses(const ts_compare *c, FILE *md, int *per_run) {
  int ok = 1;
  for (int i = 0; i < c->n_runs; i++) {
    const ts_compare_run *r = &c->runs[i], *b = &c->runs[r->loss_base];
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
static int check_falling(const ts_compare *c, FILE *md, int *per_run) {
  int ok = 1;
  (void)per_run;
  for (int i = 1; i < c->n_runs; i++) {
    const ts_compare_run *r = &c->runs[i], *p = &c->runs[i - 1];
    if (c->n / (size_t)r->pipeline > 1 && r->dt == p->dt && r->recompute == p->recompute &&
        r->pipeline == p->pipeline && r->schedule == p->schedule && r->stage > p->stage &&
        !(r->mem[TS_COMPARE_STATES] < p->mem[TS_COMPARE_STATES])) {
      fprintf(md, "  - %s holds %.0f B of model states, %s %.0f B\n", r->name,
              r->mem[TS_COMPARE_STATES], p->name, p->mem[TS_COMPARE_STATES]);
      ok = 0;
    }
  }
  return ok;
}

/* Runs one check and writes "- PASS: what" or "- FAIL: what" to ck, then
 * the check's detail lines. Returns the check's result. */
static int report(FILE *ck, const ts_compare *c, int (*check)(const ts_compare *, FILE *, int *),
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

int ts_compare_checks(const ts_compare *c, char **text, int *loss_ok) {
  size_t len = 0;
  *text = NULL;
  FILE *ck = open_memstream(text, &len);
  if (!ck) return -1;
  int states = report(ck, c, check_model_states, NULL,
                      "model states (params, grads, master, optim: peaks and bytes between "
                      "steps) measured = estimate = formula on every rank of every run "
                      "(the formula where one stage holds the whole model)");
  int falling = report(ck, c, check_falling, NULL,
                       "model states per rank fall as the ZeRO stage rises");
  char what[512];
  snprintf(what, sizeof what,
           "loss identical at every step across ZeRO stages%s%s (bitwise, per dtype and "
           "pipeline layout%s)",
           c->n_recomputes > 1 ? ", checkpointing settings" : "",
           c->n_schedules > 1 ? ", schedules" : "",
           c->grad_accum > 1 ? "; with --grad-accum > 1 stages 0-1 and 2-3 apart, as stages "
                               "2-3 reduce every micro-batch" : "");
  int losses = report(ck, c, check_losses, loss_ok, what);
  if (fclose(ck) != 0 || !*text) {
    free(*text);
    *text = NULL;
    return -1;
  }
  return states && falling && losses;
}

/* Opens path for an atomic write (base/atomic_file.h: path.tmp, renamed by
 * finish); the stream to print to, or NULL after printing why. */
static FILE *start(ts_atomic_file **af, const char *path) {
  if (ts_atomic_file_open(af, path) == TS_OK) return ts_atomic_file_stream(*af);
  fprintf(stderr, "tessera compare: %s\n", ts_flags_last_error());
  return NULL;
}

/* Commits a file from start; 0 after printing why it failed. */
static int finish(ts_atomic_file *af) {
  if (ts_atomic_file_commit(af) == TS_OK) return 1;
  fprintf(stderr, "tessera compare: %s\n", ts_flags_last_error());
  return 0;
}

/* A cell "measured / estimate (difference)" in MiB. */
static void cell(FILE *md, double meas, double est) {
  double d = meas - est;
  if (d == 0) fprintf(md, " %.2f / %.2f (0) |", meas / MiB, est / MiB);
  else fprintf(md, " %.2f / %.2f (%+.3f) |", meas / MiB, est / MiB, d / MiB);
}

int ts_compare_write_md(const ts_compare *c, const char *path, const char *checks) {
  ts_atomic_file *af;
  FILE *md = start(&af, path);
  if (!md) return 0;
  const ts_compare_run *r0 = &c->runs[0];
  fprintf(md, "# tessera compare: %s on %zu ranks\n\n", c->arch.name, c->n);
  if (c->shard_group)
    fprintf(md,
            "Hybrid sharding (--shard-group %zu): ZeRO within groups of %zu consecutive ranks, "
            "replicated across them; the ZeRO formula's N is %zu.\n\n",
            c->shard_group, c->shard_group, c->shard_group);
  fprintf(md, "%zu steps, micro-batch %zu x seq %zu per rank, Ψ = %.0f parameters (%.0f padded), "
              "%ld cores. Memory is per rank in MiB (2^20 bytes): measured by each rank's "
              "ledger, estimated by `tessera estimate` (the engine's allocation plan); speed and communication ratios (vs base) are against the first "
              "stage of the same dtype and checkpointing; the ZeRO formula is Rajbhandari et al. "
              "2020 §5.1 for the padded Ψ (fp32 keeps no master copy). Peak RSS is each rank "
              "process's, ledger and all else (MPI, OpenBLAS, code). %s\n\n",
          c->steps, c->micro_batch, c->seq, (double)c->arch.num_params, r0->psi,
          sysconf(_SC_NPROCESSORS_ONLN),
          c->dev == TS_DEVICE_CUDA
              ? "On GPUs (--device cuda) the ledger counts each rank's device memory (ranks "
                "sharing a GPU count their own); what the device holds outside it (CUDA "
                "context, library workspaces) is each run's device_bytes.overhead in "
                "compare_runs/."
              : "Device memory: none (CPU ranks).");
  fputs(checks, md);
  fprintf(md,
          "\n| run | model states between steps: measured | estimate | ZeRO formula "
          "| peak total: measured | estimate | peak RSS (max over ranks) | tokens/s | vs base "
          "| MB sent/step | vs base | of them across nodes |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (int i = 0; i < c->n_runs; i++) {
    const ts_compare_run *r = &c->runs[i], *b = &c->runs[r->base];
    double rss = 0;
    for (size_t q = 0; q < c->n; q++)
      rss = fmax(rss, r->mem[q * TS_COMPARE_COLUMNS + TS_COMPARE_RSS]);
    fprintf(md, "| %s | %.2f | %.2f |", r->name, r->mem[TS_COMPARE_STATES] / MiB,
            (double)ts_mem_model_state_bytes(&r->est[0]) / MiB);
    if (r->pipeline == 1)
      fprintf(md, " %.2f |", formula(r, r->psi, sharded_over(c)) / MiB);
    else fprintf(md, " - |");
    fprintf(md, " %.2f | %.2f |", r->mem[TS_COMPARE_TOTAL] / MiB,
            (double)r->est[0].peak_total / MiB);
    fprintf(md, " %.1f | %.0f | %.2f | %.3f |", rss / MiB, r->tok_s, r->tok_s / b->tok_s,
            r->comm / 1e6);
    if (b->comm > 0)
      fprintf(md, " %.2f |", r->comm / b->comm);
    else
      fprintf(md, " - |");
    fprintf(md, " %.3f |\n", r->comm_remote / 1e6);
  }
  fprintf(md, "\nPeak bytes per ledger category, rank 0: measured / estimate (difference), MiB\n\n"
              "| run |");
  for (int k = 0; k < TS_MEM_NUM_CATEGORIES; k++)
    fprintf(md, " %s |", ts_mem_category_name((ts_mem_category)k));
  fprintf(md, "\n| --- |");
  for (int k = 0; k < TS_MEM_NUM_CATEGORIES; k++) fprintf(md, " --- |");
  fprintf(md, "\n");
  for (int i = 0; i < c->n_runs; i++) {
    const ts_compare_run *r = &c->runs[i];
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
    const ts_compare_run *r = &c->runs[i];
    fprintf(md, "| %s |", r->name);
    for (size_t q = 0; q < c->n; q++) {
      size_t st = q / (c->n / (size_t)r->pipeline);
      if (r->pipeline > 1) { /* virtual stage j on stage j mod P */
        fprintf(md, " s%zu (", st);
        for (int ch = 0; ch < r->v; ch++) {
          size_t j = (size_t)ts_schedule_vstage(r->schedule, r->pipeline, (int)st, ch);
          fprintf(md, "%s%d..%d", ch ? "," : "", r->split[j], r->split[j + 1] - 1);
        }
        fprintf(md, "):");
      }
      cell(md, r->mem[q * TS_COMPARE_COLUMNS + TS_COMPARE_TOTAL],
           (double)est_of(r, q, c->n)->peak_total);
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
  if (!c->no_chart) fprintf(md, "\n![per-rank memory by category](compare.png)\n");
  for (int i = 0; i < c->n_runs; i++)
    if (c->runs[i].pipeline > 1)
      fprintf(md, "\n%s: step %zu's timeline, measured bubble %.1f%% on the busiest rank, "
                  "%.1f%% in theory (its schedule's formula, ts_schedule_bubble_theory)\n%s%s%s",
              c->runs[i].name, c->steps, 100.0 * c->runs[i].bubble,
              100.0 * ts_schedule_bubble_theory(c->runs[i].schedule, c->runs[i].pipeline,
                                                c->runs[i].v, (int)c->grad_accum),
              c->no_chart ? "" : "\n![timeline](timeline-", c->no_chart ? "" : c->runs[i].file,
              c->no_chart ? "" : ".png)\n");
  return finish(af);
}

int ts_compare_write_csv(const ts_compare *c, const char *path, const int *loss_ok) {
  ts_atomic_file *af;
  FILE *f = start(&af, path);
  if (!f) return 0;
  fprintf(f, "run,dtype,activation_checkpointing,zero_stage,pipeline,schedule,world_size,rank,"
             "pipeline_stage");
  for (int k = 0; k < TS_MEM_NUM_CATEGORIES; k++)
    fprintf(f, ",%s_measured,%s_estimate", ts_mem_category_name((ts_mem_category)k),
            ts_mem_category_name((ts_mem_category)k));
  fprintf(f,
          ",total_measured,total_estimate,model_states_measured,model_states_estimate,"
          "model_states_formula,peak_rss,tokens_per_s,tokens_per_s_ratio,comm_bytes_per_step,"
          "comm_ratio,comm_bytes_across_nodes_per_step,losses_identical,losses\n");
  for (int i = 0; i < c->n_runs; i++) {
    const ts_compare_run *r = &c->runs[i], *b = &c->runs[r->base];
    char ck[32];
    ts_train_recompute_name(r->recompute, ck, sizeof ck);
    for (size_t q = 0; q < c->n; q++) {
      const double *m = r->mem + q * TS_COMPARE_COLUMNS;
      const ts_mem_account *e = est_of(r, q, c->n);
      fprintf(f, "%s,%s,%s,%d,%d,%s,%zu,%zu,%zu", r->file, ts_dtype_name(r->dt), ck, r->stage,
              r->pipeline, r->pipeline > 1 ? ts_schedule_kind_name(r->schedule) : "", c->n, q,
              q / (c->n / (size_t)r->pipeline));
      for (int k = 0; k < TS_MEM_NUM_CATEGORIES; k++) fprintf(f, ",%.0f,%zu", m[k], e->peak[k]);
      fprintf(f, ",%.0f,%zu,%.0f,%.0f,", m[TS_COMPARE_TOTAL], e->peak_total, m[TS_COMPARE_STATES],
              (double)ts_mem_model_state_bytes(e));
      if (r->pipeline == 1) fprintf(f, "%.0f", formula(r, r->psi, sharded_over(c)));
      fprintf(f, ",%.0f,%.1f,%.4f,%.0f,", m[TS_COMPARE_RSS], r->tok_s, r->tok_s / b->tok_s,
              r->comm);
      if (b->comm > 0) fprintf(f, "%.4f", r->comm / b->comm);
      fprintf(f, ",%.0f,%s,", r->comm_remote, loss_ok[i] ? "yes" : "no");
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
int ts_compare_write_chart(const ts_compare *c, const char *dir, const char *png) {
  char dat[4200], gp[4200], tmp[4200], log[4200];
  TS_COMPARE_FMT(dat, "%s/chart.dat", dir);
  TS_COMPARE_FMT(gp, "%s/chart.gp", dir);
  TS_COMPARE_FMT(log, "%s/gnuplot.log", dir);
  TS_COMPARE_FMT(tmp, "%s.tmp", png);
  FILE *f = fopen(dat, "w");
  if (!f) return fprintf(stderr, "tessera compare: %s: %s\n", dat, strerror(errno)), 0;
  fprintf(f, "run");
  for (int k = 0; k < TS_MEM_NUM_CATEGORIES; k++)
    fprintf(f, " %s", ts_mem_category_name((ts_mem_category)k));
  fprintf(f, " estimate\n");
  int bars = 0;
  for (int i = 0; i < c->n_runs; i++)
    for (int st = 0; st < c->runs[i].pipeline; st++, bars++) {
      const ts_compare_run *r = &c->runs[i];
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
      for (int k = 0; k < TS_MEM_NUM_CATEGORIES; k++)
        fprintf(f, " %.4f", r->mem[q * TS_COMPARE_COLUMNS + k] / MiB);
      fprintf(f, " %.4f\n", est / MiB);
    }
  fclose(f);
  f = fopen(gp, "w");
  if (!f) return fprintf(stderr, "tessera compare: %s: %s\n", gp, strerror(errno)), 0;
  fprintf(f,
          "set terminal pngcairo size %d,560 font 'sans,10'\n"
          "set output '%s'\n"
          "set title \"%s on %zu ranks: peak bytes per ledger category\\nrank 0 or each "
          "pipeline stage's first rank (measured, stacked)\"\n"
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
  char *argv[] = {TS_COMPARE_GNUPLOT, gp, NULL};
  if (access(argv[0], X_OK) != 0)
    return fprintf(stderr, "tessera compare: " TS_COMPARE_GNUPLOT " not found: install "
                           "gnuplot-nox (tools/setup.sh does)\n"), 0;
  int rc = ts_tool_spawn(argv, log);
  if (rc != 0 || ts_atomic_rename(tmp, png) != TS_OK) {
    fprintf(stderr, "tessera compare: gnuplot failed (exit %d); the end of %s:\n", rc, log);
    ts_compare_print_tail(log);
    remove(tmp);
    return 0;
  }
  return 1;
}
