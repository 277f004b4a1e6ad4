/* estimate_main.c — `tessera estimate`: bytes per rank by ledger category
 * for a training configuration, at one ZeRO stage or stages 0-3 side by
 * side, and with --pipeline P for every pipeline stage (ranks of different
 * stages hold different units and micro-batches in flight). The numbers
 * are the engine's own allocation plan (ts_engine_plan_stage: create and
 * one step replayed on a plan ledger) or, given Ψ alone,
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
#include "tools/flags.h"
#include "tools/tools.h"

static const char *USAGE =
    "usage: tessera estimate (--model CONFIG | --params PSI) [flags]\n"
    "  Bytes per rank of N ranks by ledger category, from the engine's allocation\n"
    "  plan; no MPI, nothing large allocated. With --pipeline P the N ranks are P\n"
    "  stages x N/P data-parallel ranks and each stage gets its own column.\n";

/* One --units choice (named by UNIT_NAMES at the same index): bytes per
 * unit and how the header names it. */
typedef struct unit_choice {
  double bytes;     /* bytes per unit; 1 prints exact integers */
  const char *what; /* header text */
} unit_choice;

static const char *const UNIT_NAMES[] = {"GiB", "GB", "MiB", "MB", "bytes", NULL};
/* --reshard-after-forward: the index is ts_engine_opts.keep_gathered. */
static const char *const RESHARD[] = {"true", "false", NULL};
/* --comm: the index is ts_engine_opts.comm (ts_engine_comm_kind). */
static const char *const COMM[] = {"auto", "mpi", "staged", "nccl", NULL};
/* --overlap: the index is ts_engine_opts.overlap. */
static const char *const OVERLAP[] = {"off", "on", NULL};
static const unit_choice UNITS[] = {
    {1073741824.0, "GiB (2^30 bytes), 3 significant figures"},
    {1e9, "GB (10^9 bytes), 3 significant figures"},
    {1048576.0, "MiB (2^20 bytes), 3 significant figures"},
    {1e6, "MB (10^6 bytes), 3 significant figures"},
    {1.0, "bytes (exact)"},
};
_Static_assert(sizeof UNITS / sizeof *UNITS + 1 == sizeof UNIT_NAMES / sizeof *UNIT_NAMES,
               "one name per unit");

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

/* --params: a finite integer value in [1, MAX_PSI], "7.5e9" or
 * "7500000000", into a size_t. */
static ts_status parse_psi(const char *v, void *psi) {
  char *end;
  double d = strtod(v, &end);
  if (end == v || *end || !isfinite(d) || d != floor(d) || d < 1 || d > (double)MAX_PSI)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "expected a parameter count from 1 to 2^48, an integer such as "
                        "7500000000 or 7.5e9");
  *(size_t *)psi = (size_t)d;
  return TS_OK;
}

ts_status ts_tool_parse_zero_stages(const char *v, void *stage) {
  if (!strcmp(v, "all")) *(int *)stage = -1;
  else if (strlen(v) == 1 && v[0] >= '0' && v[0] <= '3') *(int *)stage = v[0] - '0';
  else return ts_set_error(TS_ERR_INVALID_ARGUMENT, "expected a ZeRO stage 0, 1, 2, 3 or all");
  return TS_OK;
}

ts_status ts_tool_parse_dtype(const char *v, void *dtype) { return ts_dtype_parse(v, dtype); }

ts_status ts_tool_parse_recompute(const char *v, void *every) {
  return ts_train_parse_recompute(v, every);
}

ts_status ts_tool_parse_fp8(const char *v, void *scaling) {
  for (int s = TS_FP8_OFF; s <= TS_FP8_ROWWISE; s++)
    if (!strcmp(v, ts_fp8_scaling_name((ts_fp8_scaling)s))) {
      *(ts_fp8_scaling *)scaling = (ts_fp8_scaling)s;
      return TS_OK;
    }
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "expected off, tensorwise or rowwise");
}

ts_status ts_tool_parse_schedule(const char *v, void *kind) {
  return ts_schedule_kind_parse(v, kind);
}

ts_status ts_tool_parse_offload(const char *v, void *opts) {
  ts_engine_opts *o = opts;
  int level = !strcmp(v, "none") ? 0 : !strcmp(v, "optimizer") ? 1 : !strcmp(v, "params") ? 2 : -1;
  if (level < 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--offload %s: expected none, optimizer or params",
                        v);
  o->offload_optimizer = level >= 1;
  o->offload_params = level == 2;
  return TS_OK;
}

/* Prints ts_last_error() as the one-line usage error; returns 0. */
static int report(void) {
  fprintf(stderr, "tessera estimate: %s\n", ts_flags_last_error());
  return 0;
}

/* Exit status for a library failure: 1 for resources or a bug, 2 for bad
 * input (config, flags) named in the message. */
static int exit_for(ts_status st) {
  return st == TS_ERR_OUT_OF_MEMORY || st == TS_ERR_INTERNAL ? 1 : 2;
}

int ts_tool_estimate(int argc, char **argv) {
  const char *model = NULL, *psi_arg = NULL, *act_flag = NULL;
  size_t world = 1, psi = 0, pipeline = 1, shard_group = 0, per_node = 0, virtual_stages = 1;
  int stage = -1, unit_index = 0, json = 0, device = TS_TOOL_DEVICE_CPU, save_async = 0;
  ts_fp8_scaling fp8 = TS_FP8_OFF;
  ts_engine_opts opts = ts_engine_default_opts();
  const ts_flag flags[] = {
      TS_FLAG_STRING(
          "--model", NULL, &model, "CONFIG",
          "a preset (llama-tiny, llama-small, llama-124m, llama-1.1b, llama-2-7b/13b/70b) "
          "or a Hugging Face config.json",
          NULL),
      TS_FLAG_CUSTOM("--params", NULL, &psi, parse_psi, "PSI",
                     "a parameter count (e.g. 7.5e9) instead of a model: model states only",
                     &psi_arg),
      TS_FLAG_SIZE("--world-size", "-n", &world, 1, "N",
                   "ranks: data-parallel, or P pipeline stages x N/P (default 1)", NULL),
      TS_FLAG_CUSTOM("--zero", NULL, &stage, ts_tool_parse_zero_stages, "0|1|2|3|all",
                     "one ZeRO stage, or all four side by side (default all)", NULL),
      TS_FLAG_SIZE("--shard-group", NULL, &shard_group, 1, "S",
                   "hybrid sharding: ZeRO within groups of S consecutive data-parallel ranks, "
                   "replicated across them (default: all)",
                   NULL),
      TS_FLAG_SIZE("--ranks-per-node", NULL, &per_node, 1, "L",
                   "ranks per node, for the bytes per link class (default S with "
                   "--shard-group, else all N on one node)",
                   NULL),
      TS_FLAG_CUSTOM("--dtype", NULL, &opts.dtype, ts_tool_parse_dtype, "fp32|bf16|fp16",
                     "compute dtype (default fp32)", NULL),
      TS_FLAG_CUSTOM("--fp8", NULL, &fp8, ts_tool_parse_fp8, "off|tensorwise|rowwise",
                     "llama, --dtype bf16: plan the blocks' linear layers with fp8 products "
                     "(their casts' workspace) (default off)",
                     &act_flag),
      TS_FLAG_SIZE("--micro-batch", NULL, &opts.micro_batch, 1, "B",
                   "sequences per micro-batch (default 8)", &act_flag),
      TS_FLAG_SIZE("--seq", NULL, &opts.seq, 1, "T", "tokens per sequence (default 128)",
                   &act_flag),
      TS_FLAG_CUSTOM("--activation-checkpointing", NULL, &opts.recompute_every,
                     ts_tool_parse_recompute, "none|all|every:K",
                     "blocks recomputed in backward (default none)", &act_flag),
      TS_FLAG_CHOICE("--reshard-after-forward", NULL, &opts.keep_gathered, RESHARD,
                     "ZeRO-3: false plans each unit's gathered parameters kept through the step "
                     "(default true)",
                     &act_flag),
      TS_FLAG_CHOICE("--overlap", NULL, &opts.overlap, OVERLAP,
                     "plan communication overlap: ZeRO-3's prefetched unit, stages 2/3's second "
                     "full gradient in flight (default on)",
                     &act_flag),
      TS_FLAG_CHOICE("--comm", NULL, &opts.comm, COMM,
                     "transport of the data-parallel and pipeline groups: mpi (host memory), "
                     "staged (device -> page-locked host -> MPI -> device, in chunks; on the CPU "
                     "the same staging of host memory), nccl (one GPU per rank: NCCL on a "
                     "communication stream; pipeline sends staged); auto: mpi on the CPU, on GPUs "
                     "nccl, or staged where ranks share a GPU (default auto)",
                     &act_flag),
      TS_FLAG_SIZE("--comm-chunk", NULL, &opts.comm_chunk_bytes, 64, "BYTES",
                   "staged: bytes of each rank's part of a chunk (default 1048576); the host "
                   "staging is 4 x ranks x this",
                   &act_flag),
      TS_FLAG_SIZE("--grad-accum", NULL, &opts.grad_accum, 1, "M",
                   "micro-batches per step: a pipeline's micro-batches in flight (default 1)",
                   &act_flag),
      TS_FLAG_SIZE("--pipeline", NULL, &pipeline, 1, "P",
                   "pipeline stages; P divides N (default 1)", &act_flag),
      TS_FLAG_CUSTOM("--schedule", NULL, &opts.schedule, ts_tool_parse_schedule,
                     "gpipe|1f1b|interleaved|zb-h1|zbv", "pipeline schedule (default 1f1b)",
                     &act_flag),
      TS_FLAG_SIZE("--virtual-stages", NULL, &virtual_stages, 1, "v",
                   "model chunks per stage with --schedule interleaved (default 1)", &act_flag),
      TS_FLAG_STRING("--pipeline-split", NULL, &opts.pipeline_split, "auto|a,b,...",
                     "units per pipeline stage (default auto)", &act_flag),
      TS_FLAG_CUSTOM("--device", NULL, &device, ts_tool_parse_device, "cpu|cuda|auto",
                     "device whose bytes to plan: the GPU's kernels keep other state and "
                     "workspace (default cpu; cuda needs no GPU here)",
                     NULL),
      TS_FLAG_SWITCH("--save-async", NULL, &save_async,
                     "plan the host staging of asynchronous checkpoint saves (train --save's "
                     "default): the category staging, one rank file"),
      TS_FLAG_STRING("--offload-dir", NULL, &opts.offload_dir, "DIR",
                     "plan train --offload-dir: the optimizer state (master, optim) on a disk, "
                     "three pieces of it in memory; the disk's bytes in rows of their own (the "
                     "folder is not touched)",
                     &act_flag),
      TS_FLAG_SIZE("--offload-piece", NULL, &opts.offload_piece, 1024, "ELEMENTS",
                   "--offload-dir: elements per streamed piece; --offload optimizer: per copy "
                   "(default 4194304)",
                   &act_flag),
      TS_FLAG_CUSTOM("--offload", NULL, &opts, ts_tool_parse_offload, "none|optimizer|params",
                     "plan train --offload: the optimizer state (master, optim) in host memory "
                     "beside a GPU; params (ZeRO-3): the parameter shards too (default none)",
                     &act_flag),
      TS_FLAG_CHOICE("--units", NULL, &unit_index, UNIT_NAMES, "unit of the table (default GiB)",
                     NULL),
      TS_FLAG_SWITCH("--json", NULL, &json,
                     "one JSON object with exact integer bytes instead of the table"),
  };
  int r = ts_flags_parse("estimate", flags, sizeof flags / sizeof *flags, argc, argv, USAGE);
  if (r != TS_FLAGS_OK) return r == TS_FLAGS_HELP ? 0 : 2;
  if (!model == !psi_arg)
    return ts_flags_error("estimate", "expected exactly one of --model CONFIG and --params PSI%s",
                          model ? " (got both)" : "");
  if (psi_arg && act_flag)
    return ts_flags_error("estimate", "%s applies to --model only: --params plans model states, "
                                      "no activations", act_flag);
  if (psi_arg && save_async)
    return ts_flags_error("estimate",
                          "--save-async applies to --model only: --params plans "
                          "model states, no checkpoint layout");
  opts.async_save = save_async;
  if (ts_tool_resolve_device(device, 0, &opts.device, &opts.device_index) != TS_OK)
    return ts_flags_error("estimate", "%s", ts_last_error());
  if (pipeline > TS_ENGINE_MAX_STAGES || world % pipeline)
    return ts_flags_error("estimate", "--pipeline %zu: expected a number of stages up to %d "
                          "dividing -n %zu", pipeline, TS_ENGINE_MAX_STAGES, world);
  opts.pipeline_stages = (int)pipeline;
  if (virtual_stages > TS_ENGINE_MAX_CHUNKS)
    return ts_flags_error("estimate", "--virtual-stages %zu: expected 1 to %d", virtual_stages,
                          TS_ENGINE_MAX_CHUNKS);
  opts.virtual_stages = (int)virtual_stages;
  size_t dp = world / pipeline;
  if (shard_group > INT32_MAX || (shard_group && dp % shard_group))
    return ts_flags_error("estimate",
                          "--shard-group %zu: expected a divisor of the %zu data-parallel rank%s",
                          shard_group, dp, dp == 1 ? "" : "s");
  if (shard_group && !model)
    return ts_flags_error("estimate", "--shard-group applies to --model only");
  opts.shard_group = (int)shard_group;
  if (!per_node) per_node = shard_group;
  if (per_node > INT32_MAX)
    return ts_flags_error("estimate", "--ranks-per-node %zu: expected at most %d", per_node,
                          INT32_MAX);
  int stage_lo = stage < 0 ? 0 : stage, stage_hi = stage < 0 ? 3 : stage;
  const unit_choice *unit = &UNITS[unit_index];

  /* Plan every requested ZeRO stage and pipeline stage: ledgers[i] is ZeRO
   * stage stage_lo + i / P on pipeline stage i % P. */
  int P = (int)pipeline, nstages = (stage_hi - stage_lo + 1) * P;
  ts_mem_account ledgers[4 * TS_ENGINE_MAX_STAGES];
  ts_mem_account hosts[4 * TS_ENGINE_MAX_STAGES]; /* beside a GPU: the host's part */
  ts_mem_account disks[4 * TS_ENGINE_MAX_STAGES]; /* --offload-dir: the disk's part */
  ts_step_stats comms[4 * TS_ENGINE_MAX_STAGES];  /* --model: a step's bytes by link class */
  int split[TS_ENGINE_MAX_STAGES + 1];
  ts_model m;
  memset(&m, 0, sizeof m);
  ts_status st = TS_OK;
  if (model) {
    char path[4096];
    st = ts_model_resolve(model, path, sizeof path);
    if (st == TS_OK) st = ts_model_load(path, &m);
    if (st == TS_OK) st = ts_model_set_fp8(&m, fp8, opts.dtype);
    if (st == TS_OK) psi = m.num_params;
  }
  if (st == TS_OK && model) st = ts_engine_pipeline_split(&m, &opts, split);
  int V = P * (P > 1 ? ts_engine_opts_chunks(&opts) : 1); /* virtual stages */
  for (int i = 0; i < nstages && st == TS_OK; i++) {
    opts.zero_stage = stage_lo + i / P;
    memset(&hosts[i], 0, sizeof hosts[i]);
    memset(&disks[i], 0, sizeof disks[i]);
    st = model ? ts_engine_plan_stage_host(&m, &opts, dp, i % P, &ledgers[i], &hosts[i], &disks[i])
               : ts_engine_plan_params(psi, opts.dtype, opts.zero_stage, dp, &ledgers[i]);
    memset(&comms[i], 0, sizeof comms[i]);
    if (st == TS_OK && model)
      st = ts_engine_plan_comm(&m, &opts, dp, i % P, (int)per_node, &comms[i]);
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
    if (shard_group) add_int(root, "shard_group", shard_group);
    if (model) add_int(root, "ranks_per_node", per_node ? per_node : world);
    if (P > 1) {
      add_int(root, "pipeline", pipeline);
      cJSON_AddStringToObject(root, "schedule", ts_schedule_kind_name(opts.schedule));
      if (V > P) add_int(root, "virtual_stages", (size_t)(V / P));
      add_int(root, "grad_accum", opts.grad_accum);
    }
    cJSON_AddStringToObject(root, "dtype", ts_dtype_name(opts.dtype));
    cJSON_AddStringToObject(root, "device", ts_device_name(opts.device));
    if (model) {
      add_int(root, "micro_batch", opts.micro_batch);
      add_int(root, "seq", opts.seq);
      cJSON_AddStringToObject(root, "activation_checkpointing", recompute);
    }
    for (int i = 0; i < nstages; i++) {
      const ts_mem_account *l = &ledgers[i];
      cJSON *s = cJSON_CreateObject();
      cJSON_AddNumberToObject(s, "zero_stage", stage_lo + i / P);
      if (P > 1) {
        cJSON_AddNumberToObject(s, "pipeline_stage", i % P);
        cJSON *units = cJSON_AddArrayToObject(s, "units"); /* [first, end) of each chunk */
        for (int c = 0; c < V / P; c++) {
          int j = ts_schedule_vstage(opts.schedule, P, i % P, c);
          cJSON_AddItemToArray(units, cJSON_CreateNumber(split[j]));
          cJSON_AddItemToArray(units, cJSON_CreateNumber(split[j + 1]));
        }
      }
      cJSON_AddItemToObject(s, "peak", category_object(l->peak, ncat));
      cJSON_AddItemToObject(s, "between_steps", category_object(l->current, ncat));
      add_int(s, "model_states", ts_mem_model_state_bytes(l));
      add_int(s, "peak_total", l->peak_total);
      if (model) { /* rank 0 of the stage's first shard group, one training step */
        add_int(s, "comm_bytes_per_step", comms[i].comm_bytes);
        add_int(s, "comm_bytes_across_nodes_per_step", comms[i].comm_remote_bytes);
      }
      if (model && opts.device != TS_DEVICE_CPU) { /* the host memory beside the GPU */
        cJSON_AddItemToObject(s, "host_peak", category_object(hosts[i].peak, ncat));
        add_int(s, "host_peak_total", hosts[i].peak_total);
      }
      if (model && opts.offload_dir) { /* the offload folder's file */
        cJSON_AddItemToObject(s, "disk", category_object(disks[i].current, ncat));
        add_int(s, "disk_total", disks[i].current_total);
      }
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
           "activation checkpointing %s, on %s\n",
           model, count, world, world == 1 ? "" : "s", ts_dtype_name(opts.dtype),
           opts.micro_batch, opts.seq, recompute, ts_device_name(opts.device));
  if (model && shard_group && shard_group < dp)
    printf("hybrid sharding: ZeRO within groups of %zu consecutive ranks, %zu replicas\n",
           shard_group, dp / shard_group);
  if (model)
    printf("link classes: %zu ranks per node; sent per step is rank 0's, one training step\n",
           per_node ? per_node : world);
  if (model && P > 1) {
    char chunks[48] = "";
    if (V > P) snprintf(chunks, sizeof chunks, " (%d model chunks per stage)", V / P);
    printf("pipeline: %d stages x %zu data-parallel rank%s, %s%s, %zu micro-batches per step; "
           "column sS is pipeline stage S (units first..last%s)\n",
           P, dp, dp == 1 ? "" : "s", ts_schedule_kind_name(opts.schedule), chunks,
           opts.grad_accum, V > P ? " of each chunk" : "");
  } else if (!model) {
    printf("tessera estimate: Ψ = %s parameters (%zu), N = %zu rank%s, %s, model states only "
           "(Ψ given, no model: no activations, buffers or transients)\n",
           count, psi, world, world == 1 ? "" : "s", ts_dtype_name(opts.dtype));
  }
  printf("bytes per rank in %s: %s\n", unit->what,
         model ? "the peak of each ledger category during a step, and the peak of their sum"
               : "the model states, allocated once and held between steps");
  printf("| category |");
  for (int i = 0; i < nstages; i++) {
    if (P > 1) {
      printf(" ZeRO %d s%d (", stage_lo + i / P, i % P);
      for (int c = 0; c < V / P; c++) {
        int j = ts_schedule_vstage(opts.schedule, P, i % P, c);
        printf("%s%d..%d", c ? "," : "", split[j], split[j + 1] - 1);
      }
      printf(") |");
    } else {
      printf(" stage %d |", stage_lo + i);
    }
  }
  printf("\n| --- |");
  for (int i = 0; i < nstages; i++) printf(" ---: |");
  printf("\n");
  size_t row[4 * TS_ENGINE_MAX_STAGES];
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
  for (int i = 0; i < nstages; i++) row[i] = comms[i].comm_bytes - comms[i].comm_remote_bytes;
  print_row("sent per step: within a node", row, nstages, unit);
  for (int i = 0; i < nstages; i++) row[i] = comms[i].comm_remote_bytes;
  print_row("sent per step: across nodes", row, nstages, unit);
  if (opts.offload_dir) { /* the offload folder's file */
    for (int i = 0; i < nstages; i++) row[i] = disks[i].current[TS_MEM_MASTER];
    print_row("disk: master", row, nstages, unit);
    for (int i = 0; i < nstages; i++) row[i] = disks[i].current[TS_MEM_OPTIM];
    print_row("disk: optim", row, nstages, unit);
  }
  if (opts.device != TS_DEVICE_CPU) { /* the host memory beside the GPU */
    static const ts_mem_category host_cats[] = {TS_MEM_PARAMS, TS_MEM_MASTER,      TS_MEM_OPTIM,
                                                TS_MEM_ACTIVATIONS, TS_MEM_COMM, TS_MEM_STAGING};
    static const char *const host_names[] = {
        "host: params",       "host: master",       "host: optim",
        "host: batch staging", "host: comm staging", "host: staging (checkpoint copy, update pieces)"};
    int first = opts.offload_params ? 0 : opts.offload_optimizer || opts.offload_dir ? 1 : 3;
    for (int k = first; k < 6; k++) {
      for (int i = 0; i < nstages; i++) row[i] = hosts[i].peak[host_cats[k]];
      print_row(host_names[k], row, nstages, unit);
    }
    for (int i = 0; i < nstages; i++) row[i] = hosts[i].peak_total;
    print_row("host: peak total", row, nstages, unit);
  }
  return 0;
}
