/* simulate_main.c — `tessera simulate`: a step's predicted time on a
 * cluster (engine/simulate.h): the engine's own step replayed on the plan
 * device with a clock, for ZeRO stages 0-3 side by side (hybrid sharding
 * with --shard-group), links from presets (NVLink 4, InfiniBand NDR, 100
 * GbE) or given, compute from a FLOP-rate model or measured per unit from
 * a `train --trace` file. No MPI, nothing large allocated. Output: a
 * Markdown table or one JSON object (--json). Bad usage prints one line on
 * stderr and exits 2. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/atomic_file.h"
#include "engine/simulate.h"
#include "engine/trainer.h"
#include "models/model.h"
#include "tools/flags.h"
#include "tools/tools.h"

static const char *USAGE =
    "usage: tessera simulate --model CONFIG -n N [flags]\n"
    "  Predicted step time, exposed communication, bytes per link class, tokens/s per\n"
    "  rank and MFU of N ranks (nodes of --ranks-per-node) at ZeRO stages 0-3: the\n"
    "  engine's step replayed with an alpha-beta model of each collective. No MPI.\n";

/* A link preset: its name, bandwidth (bytes/s) and latency (s). Bandwidths
 * per direction: NVLink 4 on an H100 SXM is 900 GB/s both ways (NVIDIA's
 * H100 datasheet); a DGX H100 node has 8 ConnectX-7 at 400 Gb/s (NDR) =
 * 400 GB/s; 100 GbE is 12.5 GB/s per node. Latencies are the model's
 * assumptions (NCCL's per-hop order of magnitude), settable. */
typedef struct link_preset {
  const char *name;
  double bandwidth, latency;
} link_preset;

static const link_preset LINKS[] = {
    {"nvlink4", 450e9, 3e-6},
    {"ib-ndr", 400e9, 10e-6},
    {"100gbe", 12.5e9, 30e-6},
};

/* --intra / --inter: a preset name or "GB/s,us". */
static ts_status parse_link(const char *v, void *dest) {
  ts_sim_link *l = dest;
  for (size_t i = 0; i < sizeof LINKS / sizeof *LINKS; i++)
    if (!strcmp(v, LINKS[i].name)) {
      l->bandwidth = LINKS[i].bandwidth;
      l->latency = LINKS[i].latency;
      return TS_OK;
    }
  char *end;
  double gb = strtod(v, &end), us;
  if (end != v && *end == ',') {
    const char *rest = end + 1;
    us = strtod(rest, &end);
    if (end != rest && !*end && isfinite(gb) && gb > 0 && isfinite(us) && us >= 0) {
      l->bandwidth = gb * 1e9;
      l->latency = us * 1e-6;
      return TS_OK;
    }
  }
  return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                      "expected nvlink4, ib-ndr, 100gbe or GB/s,us (bandwidth > 0, latency >= 0; "
                      "e.g. 25,2)");
}

static const char *const ALGORITHMS[] = {"direct", "ring", "tree", "best", NULL};
static const char *const OVERLAP[] = {"off", "on", NULL};
static const char *const RESHARD[] = {"true", "false", NULL};

/* Medians of a --trace file's compute spans on rank 0, per unit: forward,
 * backward, recompute (seconds per micro-batch) and the optimizer step's
 * spans less their all-gather waits (< 0: the FLOP model's). A trace of
 * a shallower twin of the model (the same config with fewer blocks: units
 * embedding, K < n - 2 blocks, head) stands for it: every block of the
 * model costs the median of the twin's block spans, pooled; the optimizer
 * step, measured on the twin's parameters, is left to the model. */
typedef struct profile {
  double *fwd, *bwd, *rec, opt;
  int trace_units; /* units in the trace: the model's, or the twin's */
} profile;

/* A compute span of the trace: kind (forward, backward, recompute,
 * optimizer step), its unit in the trace, its key and seconds. */
typedef struct span {
  int kind, unit, key;
  double seconds;
} span;

static int cmp_span(const void *a, const void *b) {
  const span *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->seconds < y->seconds ? -1 : x->seconds > y->seconds;
}

static void profile_free(profile *p) {
  free(p->fwd);
  free(p->bwd);
  free(p->rec);
  p->fwd = p->bwd = p->rec = NULL; /* freed again by the caller after a failed read */
}

/* Whether model m is embedding, blocks, head: a twin's blocks can stand
 * for its blocks. */
static int chain_of_blocks(const ts_model *m) {
  if (m->n_units < 3 || m->units[0].role != TS_UNIT_EMBEDDING ||
      m->units[m->n_units - 1].role != TS_UNIT_HEAD)
    return 0;
  for (int u = 1; u < m->n_units - 1; u++)
    if (m->units[u].role != TS_UNIT_BLOCK) return 0;
  return 1;
}

/* Reads the spans of pid 0 from path into p for model m. TS_ERR_IO,
 * TS_ERR_FORMAT naming the file and what is missing or does not fit. */
static ts_status read_profile(const char *path, const ts_model *m, profile *p) {
  memset(p, 0, sizeof *p);
  int n = m->n_units;
  char *text;
  TS_CHECK(ts_read_file(path, &text, NULL));
  cJSON *root = cJSON_Parse(text);
  free(text);
  cJSON *events = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
  if (!cJSON_IsArray(events)) {
    cJSON_Delete(root);
    return ts_set_error(TS_ERR_FORMAT, "%s: field traceEvents: expected a train --trace file",
                        path);
  }
  int cap = cJSON_GetArraySize(events), count = 0, top = -1, top_any = -1;
  span *sp = malloc(((size_t)cap + 1) * sizeof *sp);
  p->fwd = malloc((size_t)n * sizeof(double));
  p->bwd = malloc((size_t)n * sizeof(double));
  p->rec = malloc((size_t)n * sizeof(double));
  ts_status st = TS_OK;
  if (!sp || !p->fwd || !p->bwd || !p->rec)
    st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: %d spans", path, cap);
  static const char *const NAMES[4] = {"forward", "backward", "recompute", "optimizer_step"};
  const cJSON *ev;
  cJSON_ArrayForEach(ev, events) {
    if (st != TS_OK) break;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(ev, "name");
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(ev, "pid");
    const cJSON *dur = cJSON_GetObjectItemCaseSensitive(ev, "dur");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(ev, "args");
    const cJSON *unit = cJSON_GetObjectItemCaseSensitive(args, "unit");
    if (cJSON_IsNumber(unit) && unit->valueint > top_any) top_any = unit->valueint;
    if (!cJSON_IsString(name) || !cJSON_IsNumber(pid) || pid->valuedouble != 0 ||
        !cJSON_IsNumber(dur))
      continue;
    for (int k = 0; k < 4; k++) {
      if (strcmp(name->valuestring, NAMES[k])) continue;
      int u = k == 3 ? 0 : cJSON_IsNumber(unit) ? unit->valueint : -1;
      if (u < 0 || u >= n) {
        st = ts_set_error(TS_ERR_FORMAT, "%s: a %s span of unit %d: expected units 0..%d", path,
                          NAMES[k], u, n - 1);
        break;
      }
      if (k < 3 && u > top) top = u;
      sp[count++] = (span){.kind = k, .unit = u, .seconds = dur->valuedouble * 1e-6};
    }
  }
  /* The trace's units: the model's (slots = units), or a twin's (slots 0
   * embedding, 1 every block, 2 head). */
  p->trace_units = top + 1;
  int twin = st == TS_OK && p->trace_units < n;
  if (twin && top_any > top) /* rank 0 held a part: a pipeline stage's trace */
    st = ts_set_error(TS_ERR_FORMAT,
                      "%s: rank 0 ran units 0..%d of the trace's %d (a pipeline stage): "
                      "expected a trace of one rank running every unit",
                      path, top, top_any + 1);
  if (twin && (p->trace_units < 3 || !chain_of_blocks(m)))
    st = ts_set_error(TS_ERR_FORMAT,
                      "%s: spans of %d unit%s for a model of %d: expected this model's trace, "
                      "or a twin's (embedding, one block or more, head) for a model of "
                      "embedding, blocks and head",
                      path, p->trace_units, p->trace_units == 1 ? "" : "s", n);
  twin = twin && st == TS_OK;
  int slots = twin ? 3 : n;
  for (int i = 0; i < count && st == TS_OK; i++) {
    int u = sp[i].unit, slot = !twin ? u : u == 0 ? 0 : u == p->trace_units - 1 ? 2 : 1;
    sp[i].key = sp[i].kind == 3 ? 3 * slots : sp[i].kind * slots + slot;
  }
  if (st == TS_OK) qsort(sp, (size_t)count, sizeof *sp, cmp_span);
  double *med = st == TS_OK ? malloc(((size_t)3 * (size_t)slots + 1) * sizeof *med) : NULL;
  if (st == TS_OK && !med) st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: %d medians", path, slots);
  for (int key = 0, i = 0; st == TS_OK && key <= 3 * slots; key++) {
    int first = i;
    while (i < count && sp[i].key == key) i++;
    med[key] = -1.0; /* the run's median, or -1: none */
    if (i > first)
      med[key] = (i - first) % 2 ? sp[first + (i - first) / 2].seconds
                                 : 0.5 * (sp[first + (i - first) / 2 - 1].seconds +
                                          sp[first + (i - first) / 2].seconds);
  }
  for (int u = 0; st == TS_OK && u < n; u++) {
    int slot = !twin ? u : u == 0 ? 0 : u == n - 1 ? 2 : 1;
    p->fwd[u] = med[slot];
    p->bwd[u] = med[slots + slot];
    p->rec[u] = med[2 * slots + slot];
    if (p->fwd[u] < 0 || p->bwd[u] < 0)
      st = ts_set_error(TS_ERR_FORMAT,
                        "%s: no forward or backward span of unit %d on rank 0: expected a "
                        "trace of this model",
                        path, twin ? slot : u);
  }
  if (st == TS_OK) p->opt = twin ? -1.0 : med[3 * slots];
  free(med);
  free(sp);
  cJSON_Delete(root);
  if (st != TS_OK) profile_free(p);
  return st;
}

static int fail(ts_status st) {
  fprintf(stderr, "tessera simulate: %s\n", ts_flags_last_error());
  return st == TS_ERR_OUT_OF_MEMORY || st == TS_ERR_INTERNAL ? 1 : 2;
}

int ts_tool_simulate(int argc, char **argv) {
  const char *model = NULL, *trace = NULL;
  size_t world = 1, shard_group = 0, per_node = 8, pipeline = 1, virtual_stages = 1;
  int stage = -1, json = 0, algorithm = TS_SIM_BEST;
  float peak_tflops = 989.0f, efficiency = 0.48f, mem_gbps = 3350.0f, slowdown = 1.0f,
        overhead = 0.0f, memory_gb = 80.0f, shared_cores = 0.0f, disk_read = 7.0f,
        disk_write = 5.0f, host_link = 55.0f, host_mem = 100.0f;
  ts_engine_opts opts = ts_engine_default_opts();
  opts.dtype = TS_BF16;
  opts.micro_batch = 1;
  opts.seq = 4096;
  ts_sim_cluster cl = {.intra = {450e9, 3e-6}, .inter = {400e9, 10e-6}};
  const ts_flag flags[] = {
      TS_FLAG_STRING("--model", NULL, &model, "CONFIG",
                     "a preset (llama-tiny ... llama-2-7b/13b/70b) or a Hugging Face config.json",
                     NULL),
      TS_FLAG_SIZE("--world-size", "-n", &world, 1, "N", "ranks (devices) (default 1)", NULL),
      TS_FLAG_CUSTOM("--zero", NULL, &stage, ts_tool_parse_zero_stages, "0|1|2|3|all",
                     "one ZeRO stage, or all four side by side (default all)", NULL),
      TS_FLAG_SIZE("--shard-group", NULL, &shard_group, 1, "S",
                   "hybrid sharding: ZeRO within groups of S consecutive ranks (default: all)",
                   NULL),
      TS_FLAG_SIZE("--pipeline", NULL, &pipeline, 1, "P",
                   "pipeline stages; P divides N, world rank = stage x N/P + data-parallel "
                   "rank (default 1)",
                   NULL),
      TS_FLAG_CUSTOM("--schedule", NULL, &opts.schedule, ts_tool_parse_schedule,
                     "gpipe|1f1b|interleaved|zb-h1|zbv", "pipeline schedule (default 1f1b)", NULL),
      TS_FLAG_SIZE("--virtual-stages", NULL, &virtual_stages, 1, "v",
                   "model chunks per stage with --schedule interleaved (default 1)", NULL),
      TS_FLAG_STRING("--pipeline-split", NULL, &opts.pipeline_split, "auto|a,b,...",
                     "units per pipeline stage (default auto)", NULL),
      TS_FLAG_SIZE("--ranks-per-node", NULL, &per_node, 1, "L",
                   "ranks (devices) per node (default 8)", NULL),
      TS_FLAG_CUSTOM("--intra", NULL, &cl.intra, parse_link, "nvlink4|GB/s,us",
                     "the link within a node, per rank (default nvlink4: 450 GB/s, 3 us)", NULL),
      TS_FLAG_CUSTOM("--inter", NULL, &cl.inter, parse_link, "ib-ndr|100gbe|GB/s,us",
                     "the link across nodes, per node (default ib-ndr: 400 GB/s, 10 us)", NULL),
      TS_FLAG_CHOICE("--algorithm", NULL, &algorithm, ALGORITHMS,
                     "collective algorithm (default best: ring or tree, NCCL's; direct: "
                     "tessera's CPU transport)",
                     NULL),
      TS_FLAG_FLOAT("--peak-tflops", NULL, &peak_tflops, "F",
                    "peak dense TFLOP/s per rank, the MFU's denominator (default 989: H100 SXM "
                    "bf16)",
                    NULL),
      TS_FLAG_FLOAT("--efficiency", NULL, &efficiency, "E",
                    "fraction of the peak the units' products reach (default 0.48: tessera's "
                    "llama-1.1b on one H100-class GPU, docs/BENCHMARKS.md)",
                    NULL),
      TS_FLAG_FLOAT("--mem-bandwidth", NULL, &mem_gbps, "GB/s",
                    "memory bandwidth for AdamW (default 3350: H100 SXM HBM3)", NULL),
      TS_FLAG_FLOAT("--slowdown", NULL, &slowdown, "X",
                    "compute and CPU copies x X (a slower core; default 1)", NULL),
      TS_FLAG_FLOAT("--shared-cores", NULL, &shared_cores, "C",
                    "all N ranks on one machine of C cores (this one, its test bed): compute "
                    "and copies slow by the ranks holding a core, all but those waiting for "
                    "another pipeline stage (default 0: a device per rank)",
                    NULL),
      TS_FLAG_FLOAT("--device-memory", NULL, &memory_gb, "GB",
                    "memory per rank; a plan's peak above it is marked (default 80: H100)", NULL),
      TS_FLAG_FLOAT("--step-overhead", NULL, &overhead, "S",
                    "seconds per step outside the units' ops (batch load, norm; default 0)", NULL),
      TS_FLAG_STRING("--profile", NULL, &trace, "TRACE",
                     "compute measured: rank 0's median forward, backward, recompute per unit "
                     "and optimizer step of a `train --trace` file of this model, or of a "
                     "twin with fewer blocks (its blocks' median stands for every block)",
                     NULL),
      TS_FLAG_CUSTOM("--dtype", NULL, &opts.dtype, ts_tool_parse_dtype, "fp32|bf16|fp16",
                     "compute dtype (default bf16)", NULL),
      TS_FLAG_SIZE("--micro-batch", NULL, &opts.micro_batch, 1, "B",
                   "sequences per micro-batch (default 1)", NULL),
      TS_FLAG_SIZE("--seq", NULL, &opts.seq, 1, "T", "tokens per sequence (default 4096)", NULL),
      TS_FLAG_SIZE("--grad-accum", NULL, &opts.grad_accum, 1, "M",
                   "micro-batches per step (default 1)", NULL),
      TS_FLAG_CUSTOM("--activation-checkpointing", NULL, &opts.recompute_every,
                     ts_tool_parse_recompute, "none|all|every-K", "as train's (default none)",
                     NULL),
      TS_FLAG_CHOICE("--reshard-after-forward", NULL, &opts.keep_gathered, RESHARD,
                     "ZeRO-3: false keeps units gathered across the step (default true)", NULL),
      TS_FLAG_CHOICE("--overlap", NULL, &opts.overlap, OVERLAP,
                     "communication overlap as built (default on)", NULL),
      TS_FLAG_STRING("--offload-dir", NULL, &opts.offload_dir, "DIR",
                     "train --offload-dir's step: each unit's optimizer state read from the "
                     "disk ahead of its update and written back behind it, one job at a time "
                     "(the folder is not touched)",
                     NULL),
      TS_FLAG_SIZE("--offload-piece", NULL, &opts.offload_piece, 1024, "ELEMENTS",
                   "--offload-dir: elements per streamed piece (default 4194304)", NULL),
      TS_FLAG_FLOAT("--disk-read", NULL, &disk_read, "GB/s",
                    "--offload-dir: the disk's read rate (default 7: an NVMe SSD on PCIe 4)",
                    NULL),
      TS_FLAG_FLOAT("--disk-write", NULL, &disk_write, "GB/s",
                    "--offload-dir: the disk's write rate (default 5)", NULL),
      TS_FLAG_CUSTOM("--offload", NULL, &opts, ts_tool_parse_offload, "none|optimizer",
                     "optimizer: train --offload optimizer's update: each unit's gradient to "
                     "the host and its parameters back over --host-link, AdamW at "
                     "--host-memory-bandwidth (default none)",
                     NULL),
      TS_FLAG_FLOAT("--host-link", NULL, &host_link, "GB/s",
                    "--offload optimizer: device-host copies each way (default 55: PCIe 5 x16, "
                    "64 GB/s a direction before protocol overhead)",
                    NULL),
      TS_FLAG_FLOAT("--host-memory-bandwidth", NULL, &host_mem, "GB/s",
                    "--offload optimizer: the host's memory rate for AdamW (default 100)", NULL),
      TS_FLAG_SWITCH("--json", NULL, &json, "one JSON object instead of the table"),
  };
  int r = ts_flags_parse("simulate", flags, sizeof flags / sizeof *flags, argc, argv, USAGE);
  if (r != TS_FLAGS_OK) return r == TS_FLAGS_HELP ? 0 : 2;
  if (!model) return ts_flags_error("simulate", "--model is required " TS_FLAGS_HINT);
  if (opts.offload_params)
    return ts_flags_error("simulate",
                          "--offload params: not modelled (each gather's copy to the device); "
                          "expected none or optimizer");
  if (pipeline > TS_ENGINE_MAX_STAGES || world % pipeline)
    return ts_flags_error("simulate",
                          "--pipeline %zu: expected a number of stages up to %d dividing -n %zu",
                          pipeline, TS_ENGINE_MAX_STAGES, world);
  size_t dp = world / pipeline;
  if (shard_group > INT32_MAX || (shard_group && dp % shard_group))
    return ts_flags_error("simulate",
                          "--shard-group %zu: expected a divisor of the %zu data-parallel rank%s",
                          shard_group, dp, dp == 1 ? "" : "s");
  if (per_node > INT32_MAX)
    return ts_flags_error("simulate", "--ranks-per-node %zu: expected at most %d", per_node,
                          INT32_MAX);
  if (!(host_link > 0) || !(host_mem > 0))
    return ts_flags_error("simulate",
                          "--host-link %g, --host-memory-bandwidth %g: expected both > 0 GB/s",
                          (double)host_link, (double)host_mem);
  if (!(disk_read > 0) || !(disk_write > 0))
    return ts_flags_error("simulate", "--disk-read %g, --disk-write %g: expected both > 0 GB/s",
                          (double)disk_read, (double)disk_write);
  if (!(peak_tflops > 0) || !(efficiency > 0 && efficiency <= 1) || !(mem_gbps > 0) ||
      !(slowdown >= 1) || !(overhead >= 0))
    return ts_flags_error("simulate",
                          "--peak-tflops %g, --efficiency %g, --mem-bandwidth %g, --slowdown %g, "
                          "--step-overhead %g: expected > 0, in (0, 1], > 0, >= 1, >= 0",
                          (double)peak_tflops, (double)efficiency, (double)mem_gbps,
                          (double)slowdown, (double)overhead);
  opts.shard_group = (int)shard_group;
  opts.pipeline_stages = (int)pipeline;
  if (virtual_stages > TS_ENGINE_MAX_CHUNKS)
    return ts_flags_error("simulate", "--virtual-stages %zu: expected 1 to %d", virtual_stages,
                          TS_ENGINE_MAX_CHUNKS);
  opts.virtual_stages = (int)virtual_stages;
  cl.ranks_per_node = (int)per_node;
  cl.algorithm = (ts_sim_algorithm)algorithm;
  ts_sim_compute cp = {.peak_flops = peak_tflops * 1e12,
                       .efficiency = efficiency,
                       .mem_bandwidth = mem_gbps * 1e9,
                       .slowdown = slowdown,
                       .optimizer = -1.0,
                       .other = overhead,
                       .shared_cores = shared_cores,
                       .disk_read = disk_read * 1e9,
                       .disk_write = disk_write * 1e9,
                       .host_link = host_link * 1e9,
                       .host_mem_bandwidth = host_mem * 1e9};
  ts_model m;
  memset(&m, 0, sizeof m);
  char path[4096];
  ts_status st = ts_model_resolve(model, path, sizeof path);
  if (st == TS_OK) st = ts_model_load(path, &m);
  profile prof = {0};
  if (st == TS_OK && trace) {
    st = read_profile(trace, &m, &prof);
    cp.forward = prof.fwd;
    cp.backward = prof.bwd;
    cp.recompute = prof.rec;
    cp.optimizer = prof.opt;
  }
  int lo = stage < 0 ? 0 : stage, hi = stage < 0 ? 3 : stage;
  ts_sim_result res[4];
  ts_sim_result *per = calloc(4 * pipeline, sizeof *per); /* [zero][pipeline stage] */
  if (!per) st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "simulate: %zu stages", pipeline);
  for (int z = lo; z <= hi && st == TS_OK; z++) {
    opts.zero_stage = z;
    st = ts_simulate_stages(&m, &opts, dp, &cl, &cp, &res[z], per + (size_t)z * pipeline);
  }
  size_t n_params = m.num_params;
  int n_units = m.n_units, prof_units = prof.trace_units;
  ts_model_free(&m);
  profile_free(&prof);
  if (st != TS_OK) {
    free(per);
    return fail(st);
  }

  if (json) {
    cJSON *root = cJSON_CreateObject(), *rows = cJSON_AddArrayToObject(root, "stages");
    cJSON_AddStringToObject(root, "model", model);
    cJSON_AddNumberToObject(root, "world_size", (double)world);
    cJSON_AddNumberToObject(root, "ranks_per_node", (double)per_node);
    cJSON_AddNumberToObject(root, "shard_group", (double)shard_group);
    cJSON_AddNumberToObject(root, "pipeline_stages", (double)pipeline);
    if (pipeline > 1)
      cJSON_AddStringToObject(root, "schedule", ts_schedule_kind_name(opts.schedule));
    if (pipeline > 1 && virtual_stages > 1)
      cJSON_AddNumberToObject(root, "virtual_stages", (double)virtual_stages);
    cJSON_AddStringToObject(root, "algorithm", ALGORITHMS[algorithm]);
    cJSON_AddStringToObject(root, "compute", trace ? "profile" : "flops");
    if (trace) cJSON_AddNumberToObject(root, "profile_units", prof_units);
    for (int z = lo; z <= hi; z++) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddNumberToObject(o, "zero_stage", z);
      cJSON_AddNumberToObject(o, "step_s", res[z].step_s);
      cJSON_AddNumberToObject(o, "compute_s", res[z].compute_s);
      cJSON_AddNumberToObject(o, "exposed_comm_s", res[z].exposed_comm_s);
      cJSON_AddNumberToObject(o, "pipeline_wait_s", res[z].pipeline_wait_s);
      cJSON_AddNumberToObject(o, "comm_busy_s", res[z].comm_busy_s);
      cJSON_AddNumberToObject(o, "exposed_disk_s", res[z].exposed_io_s);
      cJSON_AddNumberToObject(o, "disk_busy_s", res[z].io_busy_s);
      cJSON_AddNumberToObject(o, "comm_bytes_per_step", (double)res[z].bytes);
      cJSON_AddNumberToObject(o, "comm_bytes_across_nodes_per_step", (double)res[z].remote_bytes);
      cJSON_AddNumberToObject(o, "tokens_per_s_per_rank", res[z].tokens_per_s);
      cJSON_AddNumberToObject(o, "mfu", res[z].mfu);
      cJSON_AddNumberToObject(o, "peak_bytes", (double)res[z].peak_bytes);
      cJSON_AddBoolToObject(o, "fits", (double)res[z].peak_bytes <= memory_gb * 1e9);
      cJSON_AddNumberToObject(o, "ops", res[z].ops);
      cJSON_AddNumberToObject(o, "calls", res[z].calls);
      if (pipeline > 1) { /* each pipeline stage's own figures */
        cJSON *ps = cJSON_AddArrayToObject(o, "pipeline");
        for (size_t q = 0; q < pipeline; q++) {
          const ts_sim_result *x = per + (size_t)z * pipeline + q;
          cJSON *p = cJSON_CreateObject();
          cJSON_AddNumberToObject(p, "step_s", x->step_s);
          cJSON_AddNumberToObject(p, "compute_s", x->compute_s);
          cJSON_AddNumberToObject(p, "exposed_comm_s", x->exposed_comm_s);
          cJSON_AddNumberToObject(p, "pipeline_wait_s", x->pipeline_wait_s);
          cJSON_AddNumberToObject(p, "comm_bytes_per_step", (double)x->bytes);
          cJSON_AddNumberToObject(p, "comm_bytes_across_nodes_per_step", (double)x->remote_bytes);
          cJSON_AddNumberToObject(p, "peak_bytes", (double)x->peak_bytes);
          cJSON_AddItemToArray(ps, p);
        }
      }
      cJSON_AddItemToArray(rows, o);
    }
    free(per);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return fail(ts_set_error(TS_ERR_OUT_OF_MEMORY, "printing JSON"));
    printf("%s\n", text);
    cJSON_free(text);
    return 0;
  }
  printf(
      "tessera simulate: %s (%.2fB parameters), N = %zu in nodes of %zu, %s, micro-batch %zu "
      "x seq %zu x %zu, %s%s\n",
      model, (double)n_params / 1e9, world, per_node, ts_dtype_name(opts.dtype), opts.micro_batch,
      opts.seq, opts.grad_accum, trace ? "compute measured: " : "FLOP model", trace ? trace : "");
  if (shard_group && shard_group < dp)
    printf("hybrid sharding: ZeRO within groups of %zu, %zu replicas\n", shard_group,
           dp / shard_group);
  if (pipeline > 1)
    printf(
        "pipeline: %zu stages of %zu data-parallel rank%s, %s%s; the figures are the slowest "
        "stage's, bytes and memory the largest stage's\n",
        pipeline, dp, dp == 1 ? "" : "s", ts_schedule_kind_name(opts.schedule),
        opts.schedule == TS_SCHEDULE_ZBV ? " (2 model chunks per stage, in a V)"
        : virtual_stages > 1           ? " (--virtual-stages model chunks per stage)"
                                       : "");
  if (trace && prof_units < n_units)
    printf(
        "profile of a twin of %d units: each of the %d blocks costs the median of its %d "
        "blocks' spans; AdamW by the memory model\n",
        prof_units, n_units - 2, prof_units - 2);
  printf(
      "links: within a node %.3g GB/s %.3g us per rank, across %.3g GB/s %.3g us per node; "
      "%s collectives\n",
      cl.intra.bandwidth / 1e9, cl.intra.latency * 1e6, cl.inter.bandwidth / 1e9,
      cl.inter.latency * 1e6, ALGORITHMS[algorithm]);
  int pipe = pipeline > 1, disk = opts.offload_dir != NULL;
  if (disk)
    printf("offload: the optimizer state on a disk of %.3g GB/s read, %.3g GB/s write\n",
           (double)disk_read, (double)disk_write);
  if (opts.offload_optimizer)
    printf("offload: the optimizer state in host memory; %.3g GB/s each way to the host, AdamW "
           "at %.3g GB/s of host memory\n",
           (double)host_link, (double)host_mem);
  printf(
      "| ZeRO | step s | compute s | exposed comm s |%s%s GB within a node | GB across nodes | "
      "tokens/s per rank | MFU | peak GB (plan) |\n"
      "| --- | ---: | ---: | ---: |%s%s ---: | ---: | ---: | ---: | ---: |\n",
      pipe ? " pipeline wait s |" : "", disk ? " exposed disk s |" : "", pipe ? " ---: |" : "",
      disk ? " ---: |" : "");
  for (int z = lo; z <= hi; z++) {
    char wait[32] = "", io[32] = "";
    if (pipe) snprintf(wait, sizeof wait, " %.4g |", res[z].pipeline_wait_s);
    if (disk) snprintf(io, sizeof io, " %.4g |", res[z].exposed_io_s);
    printf("| %d | %.4g | %.4g | %.4g |%s%s %.3g | %.3g | %.4g | %.1f%% | %.3g%s |\n", z,
           res[z].step_s, res[z].compute_s, res[z].exposed_comm_s, wait, io,
           (double)(res[z].bytes - res[z].remote_bytes) / 1e9, (double)res[z].remote_bytes / 1e9,
           res[z].tokens_per_s, 100.0 * res[z].mfu, (double)res[z].peak_bytes / 1e9,
           (double)res[z].peak_bytes > memory_gb * 1e9 ? " (does not fit)" : "");
  }
  for (int z = lo; z <= hi && pipe; z++) {
    printf("ZeRO-%d per pipeline stage (compute / exposed comm / pipeline wait, s):", z);
    for (size_t q = 0; q < pipeline; q++) {
      const ts_sim_result *x = per + (size_t)z * pipeline + q;
      printf("%s %zu: %.4g / %.4g / %.4g", q ? ";" : "", q, x->compute_s, x->exposed_comm_s,
             x->pipeline_wait_s);
    }
    printf("\n");
  }
  free(per);
  return 0;
}
