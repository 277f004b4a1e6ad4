/* estimate_main.c — `tessera estimate`: bytes per rank by ledger category
 * for a training configuration, at one ZeRO stage or stages 0-3 side by
 * side. The numbers are the engine's own allocation plan (ts_engine_plan:
 * create and one micro-step replayed on a plan ledger) or, given Ψ alone,
 * the model states of one flat buffer (ts_engine_plan_params). No MPI, no
 * compute, nothing large allocated. Output: a Markdown table in the unit of
 * --units, or one JSON object (--json) with exact integer bytes. Bad usage
 * and config errors print one line on stderr and exit 2. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/trainer.h"
#include "models/model.h"
#include "tools/tools.h"

static const char *USAGE =
    "usage: tessera estimate (--model CONFIG | --params PSI) [-n N] [--zero 0|1|2|3|all]\n"
    "                        [--dtype fp32|bf16|fp16] [--micro-batch B] [--seq T]\n"
    "                        [--activation-checkpointing none|all|every:K]\n"
    "                        [--units GiB|GB|MiB|MB|bytes] [--json]\n"
    "  Bytes per rank of N data-parallel ranks (-n, --world-size; default 1) by ledger\n"
    "  category, from the engine's allocation plan; no MPI, nothing large allocated.\n"
    "  --model: a preset (llama-tiny, llama-small, llama-2-7b, llama-2-13b, llama-2-70b)\n"
    "  or a Hugging Face config.json. --params PSI (e.g. 7.5e9): model states only.\n"
    "  Defaults: --zero all, fp32, micro-batch 8, seq 128, no checkpointing, GiB.\n";

/* One --units choice: bytes per unit and how the header names it. */
typedef struct unit_choice {
  const char *name; /* as given to --units */
  double bytes;     /* bytes per unit; 1 prints exact integers */
  const char *what; /* header text */
} unit_choice;

static const unit_choice UNITS[] = {
    {"GiB", 1073741824.0, "GiB (2^30 bytes), 3 significant figures"},
    {"GB", 1e9, "GB (10^9 bytes), 3 significant figures"},
    {"MiB", 1048576.0, "MiB (2^20 bytes), 3 significant figures"},
    {"MB", 1e6, "MB (10^6 bytes), 3 significant figures"},
    {"bytes", 1.0, "bytes (exact)"},
};

#define MAX_PSI ((size_t)1 << 48) /* keeps 16 (Ψ + 16 N) bytes far inside size_t */

/* Prints `nbytes` in unit u: an exact integer for bytes, else 3 significant
 * figures (as the ZeRO paper's Table 1) without an exponent. */
static void print_amount(size_t nbytes, const unit_choice *u) {
  if (u->bytes == 1.0) {
    printf(" %zu |", nbytes);
    return;
  }
  double x = (double)nbytes / u->bytes;
  int decimals = x > 0 ? 2 - (int)floor(log10(x)) : 0;
  printf(" %.*f |", decimals < 0 ? 0 : decimals, x);
}

/* A Markdown row: `label` and one value per planned stage. */
static void print_row(const char *label, const size_t *values, int nstages,
                      const unit_choice *u) {
  printf("| %s |", label);
  for (int i = 0; i < nstages; i++) print_amount(values[i], u);
  printf("\n");
}

/* "68.98B", "15.34M" or the integer: a parameter count for headers. */
static void format_count(size_t n, char *buf, size_t cap) {
  if (n >= 1000000000) snprintf(buf, cap, "%.2fB", (double)n / 1e9);
  else if (n >= 1000000) snprintf(buf, cap, "%.2fM", (double)n / 1e6);
  else snprintf(buf, cap, "%zu", n);
}

/* Adds key: n to obj as an exact JSON integer (cJSON numbers are doubles,
 * exact only to 2^53). */
static void add_int(cJSON *obj, const char *key, size_t n) {
  char buf[32];
  snprintf(buf, sizeof buf, "%zu", n);
  cJSON_AddRawToObject(obj, key, buf);
}

/* {"params": ..., ...}: the first ncat categories of bytes[]. */
static cJSON *category_object(const size_t *bytes, int ncat) {
  cJSON *o = cJSON_CreateObject();
  for (int c = 0; c < ncat; c++) add_int(o, ts_mem_category_name((ts_mem_category)c), bytes[c]);
  return o;
}

/* Parses --params: a finite integer value in [1, MAX_PSI], "7.5e9" or
 * "7500000000"; prints the error and returns 0 otherwise. */
static int parse_psi(const char *v, size_t *out) {
  char *end;
  double d = strtod(v, &end);
  if (end == v || *end || !isfinite(d) || d != floor(d) || d < 1 || d > (double)MAX_PSI) {
    fprintf(stderr,
            "tessera estimate: --params %s: expected a parameter count from 1 to 2^48, an "
            "integer such as 7500000000 or 7.5e9\n",
            v);
    return 0;
  }
  *out = (size_t)d;
  return 1;
}

/* Prints ts_last_error() as the one-line usage error; returns 0. */
static int report(void) {
  fprintf(stderr, "tessera estimate: %s\n", ts_last_error());
  return 0;
}

/* Exit status for a library failure: 1 for resources or a bug, 2 for bad
 * input (config, flags) named in the message. */
static int exit_for(ts_status st) {
  return st == TS_ERR_OUT_OF_MEMORY || st == TS_ERR_INTERNAL ? 1 : 2;
}

int ts_tool_estimate(int argc, char **argv) {
  const char *model = NULL, *psi_arg = NULL, *act_flag = NULL;
  size_t world = 1, psi = 0;
  int stage_lo = 0, stage_hi = 3, json = 0;
  const unit_choice *unit = &UNITS[0];
  ts_engine_opts opts = ts_engine_default_opts();
  for (int i = 1; i < argc; i++) {
    const char *flag = argv[i];
    if (!strcmp(flag, "-h") || !strcmp(flag, "--help")) {
      fputs(USAGE, stdout);
      return 0;
    }
    if (!strcmp(flag, "--json")) {
      json = 1;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "tessera estimate: %s needs a value (--help lists the flags)\n", flag);
      return 2;
    }
    const char *v = argv[++i];
    int ok = 1;
    if (!strcmp(flag, "--model")) model = v;
    else if (!strcmp(flag, "--params")) ok = parse_psi(psi_arg = v, &psi);
    else if (!strcmp(flag, "-n") || !strcmp(flag, "--world-size"))
      ok = ts_parse_size(flag, v, 1, &world);
    else if (!strcmp(flag, "--micro-batch"))
      ok = ts_parse_size(act_flag = flag, v, 1, &opts.micro_batch);
    else if (!strcmp(flag, "--seq")) ok = ts_parse_size(act_flag = flag, v, 1, &opts.seq);
    else if (!strcmp(flag, "--zero")) {
      if (!strcmp(v, "all")) stage_lo = 0, stage_hi = 3;
      else if (strlen(v) == 1 && v[0] >= '0' && v[0] <= '3') stage_lo = stage_hi = v[0] - '0';
      else {
        fprintf(stderr, "tessera estimate: --zero %s: expected a ZeRO stage 0, 1, 2, 3 or all\n",
                v);
        return 2;
      }
    } else if (!strcmp(flag, "--units")) {
      unit = NULL;
      for (size_t k = 0; k < sizeof UNITS / sizeof *UNITS; k++)
        if (!strcmp(v, UNITS[k].name)) unit = &UNITS[k];
      if (!unit) {
        fprintf(stderr, "tessera estimate: --units %s: expected GiB, GB, MiB, MB or bytes\n", v);
        return 2;
      }
    } else if (!strcmp(flag, "--dtype")) {
      ok = ts_dtype_parse(v, &opts.dtype) == TS_OK || report();
    } else if (!strcmp(flag, "--activation-checkpointing")) {
      act_flag = flag;
      ok = ts_train_parse_recompute(v, &opts.recompute_every) == TS_OK || report();
    } else {
      fprintf(stderr, "tessera estimate: unknown flag %s (--help lists the flags)\n", flag);
      return 2;
    }
    if (!ok) return 2;
  }
  if (!model == !psi_arg) {
    fprintf(stderr, "tessera estimate: expected exactly one of --model CONFIG and --params PSI%s\n",
            model ? " (got both)" : "");
    return 2;
  }
  if (psi_arg && act_flag) {
    fprintf(stderr, "tessera estimate: %s applies to --model only: --params plans model states, "
                    "no activations\n", act_flag);
    return 2;
  }

  /* Plan every requested stage: ledgers[i] is stage stage_lo + i. */
  ts_mem_account ledgers[4];
  int nstages = stage_hi - stage_lo + 1;
  ts_model m;
  memset(&m, 0, sizeof m);
  ts_status st = TS_OK;
  if (model) {
    char path[4096];
    st = ts_model_resolve(model, path, sizeof path);
    if (st == TS_OK) st = ts_model_load(path, &m);
    if (st == TS_OK) psi = m.num_params;
  }
  for (int i = 0; i < nstages && st == TS_OK; i++) {
    opts.zero_stage = stage_lo + i;
    st = model ? ts_engine_plan(&m, &opts, world, &ledgers[i])
               : ts_engine_plan_params(psi, opts.dtype, opts.zero_stage, world, &ledgers[i]);
  }
  ts_model_free(&m);
  if (st != TS_OK) {
    report();
    return exit_for(st);
  }

  int ncat = model ? TS_MEM_NUM_CATEGORIES : TS_MEM_ACTIVATIONS; /* params mode: model states */
  char recompute[32];
  ts_train_recompute_name(opts.recompute_every, recompute, sizeof recompute);
  if (json) {
    cJSON *root = cJSON_CreateObject(), *stages = cJSON_CreateArray();
    if (model) cJSON_AddStringToObject(root, "model", model);
    else cJSON_AddNullToObject(root, "model");
    add_int(root, "params", psi);
    add_int(root, "world_size", world);
    cJSON_AddStringToObject(root, "dtype", ts_dtype_name(opts.dtype));
    if (model) {
      add_int(root, "micro_batch", opts.micro_batch);
      add_int(root, "seq", opts.seq);
      cJSON_AddStringToObject(root, "activation_checkpointing", recompute);
    }
    for (int i = 0; i < nstages; i++) {
      const ts_mem_account *l = &ledgers[i];
      cJSON *s = cJSON_CreateObject();
      cJSON_AddNumberToObject(s, "zero_stage", stage_lo + i);
      cJSON_AddItemToObject(s, "peak", category_object(l->peak, ncat));
      cJSON_AddItemToObject(s, "between_steps", category_object(l->current, ncat));
      add_int(s, "model_states", ts_mem_model_state_bytes(l));
      add_int(s, "peak_total", l->peak_total);
      cJSON_AddItemToArray(stages, s);
    }
    cJSON_AddItemToObject(root, "stages", stages);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) {
      fprintf(stderr, "tessera estimate: out of memory printing JSON\n");
      return 1;
    }
    printf("%s\n", text);
    cJSON_free(text);
    return 0;
  }

  char count[32];
  format_count(psi, count, sizeof count);
  if (model)
    printf("tessera estimate: %s (%s parameters), N = %zu rank%s, %s, micro-batch %zu x seq %zu, "
           "activation checkpointing %s\n",
           model, count, world, world == 1 ? "" : "s", ts_dtype_name(opts.dtype),
           opts.micro_batch, opts.seq, recompute);
  else
    printf("tessera estimate: Ψ = %s parameters (%zu), N = %zu rank%s, %s, model states only "
           "(Ψ given, no model: no activations, buffers or transients)\n",
           count, psi, world, world == 1 ? "" : "s", ts_dtype_name(opts.dtype));
  printf("bytes per rank in %s: %s\n", unit->what,
         model ? "the peak of each ledger category during a step, and the peak of their sum"
               : "the model states, allocated once and held between steps");
  printf("| category |");
  for (int i = 0; i < nstages; i++) printf(" stage %d |", stage_lo + i);
  printf("\n| --- |");
  for (int i = 0; i < nstages; i++) printf(" ---: |");
  printf("\n");
  size_t row[4];
  for (int c = 0; c < ncat; c++) {
    if (c == TS_MEM_ACTIVATIONS) {
      for (int i = 0; i < nstages; i++) row[i] = ts_mem_model_state_bytes(&ledgers[i]);
      print_row("model states between steps", row, nstages, unit);
    }
    for (int i = 0; i < nstages; i++) row[i] = ledgers[i].peak[c];
    print_row(ts_mem_category_name((ts_mem_category)c), row, nstages, unit);
  }
  if (!model) {
    for (int i = 0; i < nstages; i++) row[i] = ts_mem_model_state_bytes(&ledgers[i]);
    print_row("model states", row, nstages, unit);
    return 0;
  }
  for (int i = 0; i < nstages; i++) row[i] = ledgers[i].peak_total;
  print_row("peak total", row, nstages, unit);
  return 0;
}
