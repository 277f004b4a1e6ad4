/*
 * plan.c — the memory plan (engine.h: ts_engine_plan, ts_engine_plan_params,
 * ts_engine_activation_bytes): the engine's own create and one micro-step
 * replayed on a plan ledger, which charges every allocation exactly and
 * allocates nothing, so the estimate is the allocation plan itself; and the
 * activation bytes predicted from the units' declared saved bytes alone.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"

int ts_engine_is_recomputed(const ts_model *m, const ts_engine_opts *o, int u) {
  const ts_unit *un = &m->units[u];
  return o->recompute_every > 0 && un->role == TS_UNIT_BLOCK && un->layer >= 0 &&
         (size_t)un->layer % o->recompute_every == 0;
}

size_t ts_engine_recompute_bytes(const ts_model *m, const ts_engine_opts *o, int begin, int end) {
  size_t most = 0;
  for (int u = begin; u < end; u++) {
    size_t saved = ts_unit_saved_bytes(m, u, o->micro_batch, o->seq, o->dtype, o->device);
    if (ts_engine_is_recomputed(m, o, u) && saved > most) most = saved;
  }
  return most;
}

size_t ts_engine_activation_bytes(const ts_model *m, const ts_engine_opts *o) {
  return ts_engine_activation_bytes_stage(m, o, 0);
}

int ts_engine_opts_chunks(const ts_engine_opts *o) {
  if (o->schedule == TS_SCHEDULE_ZBV) return 2; /* its V: two chunks per rank */
  return o->schedule == TS_SCHEDULE_INTERLEAVED && o->virtual_stages > 1 ? o->virtual_stages : 1;
}

size_t ts_engine_activation_bytes_stage(const ts_model *m, const ts_engine_opts *o, int stage) {
  int P = o->pipeline_stages > 1 ? o->pipeline_stages : 1, n = m->n_units;
  int v = P > 1 ? ts_engine_opts_chunks(o) : 1;
  int first[TS_ENGINE_MAX_STAGES + 1];
  if (P * v > TS_ENGINE_MAX_STAGES || stage < 0 || stage >= P) return 0;
  if (P == 1) first[0] = 0, first[1] = n;
  else if (ts_engine_pipeline_split(m, o, first) != TS_OK) return 0;
  ts_schedule sched = {0};
  if (P > 1 && ts_schedule_make(o->schedule, P, v, (int)o->grad_accum, &sched) != TS_OK) return 0;
  size_t B = o->micro_batch, T = o->seq, BTC = B * T * m->hidden_size * ts_dtype_size(o->dtype);
  size_t total = 2 * BTC, recompute = 0; /* once: the two activation-gradient buffers */
  for (int c = 0; c < v; c++) {
    int j = ts_schedule_vstage(o->schedule, P, stage, c), u0 = first[j], u1 = first[j + 1];
    size_t slots = P > 1 ? (size_t)ts_schedule_in_flight_chunk(&sched, stage, c) : 1;
    /* a slot: the batch, the inputs of its units and the chunk's output,
     * the saved bytes, the gradient sent back (all but virtual stage 0) */
    size_t slot = 2 * B * T * 4 + (j > 0 ? BTC : 0);
    for (int u = u0 > 1 ? u0 : 1; u <= (u1 < n ? u1 : n - 1); u++) slot += BTC;
    for (int u = u0; u < u1; u++)
      if (!ts_engine_is_recomputed(m, o, u))
        slot += ts_unit_saved_bytes(m, u, B, T, o->dtype, o->device);
    total += slots * slot;
    size_t rb = ts_engine_recompute_bytes(m, o, u0, u1);
    if (rb > recompute) recompute = rb;
  }
  ts_schedule_free(&sched);
  return total + recompute; /* and once: the recompute buffer */
}

double ts_engine_unit_cost(const ts_model *m, const ts_engine_opts *o, int u) {
  double BT = (double)o->micro_batch * (double)o->seq, C = (double)m->hidden_size;
  double bytes = 4.0 * C * (double)ts_dtype_size(o->dtype); /* x, y, dx, dy per token */
  return (3.0 * ts_unit_forward_flops(m, u, o->seq) + bytes) * BT; /* forward + backward */
}

ts_status ts_engine_pipeline_split(const ts_model *m, const ts_engine_opts *o, int *first) {
  int v = o->pipeline_stages > 1 ? ts_engine_opts_chunks(o) : 1;
  int P = o->pipeline_stages * v, n = m->n_units;
  if (v > 1 && o->schedule == TS_SCHEDULE_ZBV && (P > n || P > TS_ENGINE_MAX_STAGES))
    return ts_set_error(
        TS_ERR_INVALID_ARGUMENT,
        "`pipeline_stages` %d with schedule zbv = %d virtual stages (two per stage): expected "
        "at most %d (the units of %s: embedding, %d blocks, head; every virtual stage needs one)",
        o->pipeline_stages, P, n < TS_ENGINE_MAX_STAGES ? n : TS_ENGINE_MAX_STAGES, m->name, n - 2);
  if (v > 1 && (P < 1 || P > n || P > TS_ENGINE_MAX_STAGES))
    return ts_set_error(
        TS_ERR_INVALID_ARGUMENT,
        "`pipeline_stages` %d x `virtual_stages` %d = %d virtual stages: expected at most %d "
        "(the units of %s: embedding, %d blocks, head; every virtual stage needs one)",
        o->pipeline_stages, v, P, n < TS_ENGINE_MAX_STAGES ? n : TS_ENGINE_MAX_STAGES, m->name,
        n - 2);
  if (P < 1 || P > n)
    return ts_set_error(
        TS_ERR_INVALID_ARGUMENT,
        "`pipeline_stages` %d: expected 1 to %d stages (the units of %s: embedding, %d "
        "blocks, head)",
        P, n, m->name, n - 2);
  first[P] = n;
  if (o->pipeline_split && strcmp(o->pipeline_split, "auto") != 0)
    return ts_pipeline_split_parse(o->pipeline_split, n, P, first);
  double *cost = malloc((size_t)n * sizeof *cost);
  if (!cost) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "pipeline split: %d costs", n);
  for (int u = 0; u < n; u++) cost[u] = ts_engine_unit_cost(m, o, u);
  /* ZB-V: a stage computes pieces s and 2P - 1 - s, whose sum it balances */
  ts_status st = v > 1 && o->schedule == TS_SCHEDULE_ZBV
                     ? ts_pipeline_split_v(cost, n, o->pipeline_stages, first)
                     : ts_pipeline_split_balanced(cost, n, P, first);
  free(cost);
  return st;
}

/* TS_ERR_INVALID_ARGUMENT unless dp_size is 1 .. INT32_MAX. */
static ts_status check_dp_size(size_t dp_size) {
  if (dp_size < 1 || dp_size > (size_t)INT32_MAX)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "-n %zu: expected a number of ranks from 1 to %d", dp_size, INT32_MAX);
  return TS_OK;
}

ts_status ts_engine_plan_params(size_t psi, ts_dtype dtype, int zero_stage, size_t dp_size,
                                ts_mem_account *out) {
  memset(out, 0, sizeof *out);
  TS_CHECK(check_dp_size(dp_size));
  TS_CHECK(ts_engine_check_zero_stage(zero_stage));
  ts_flat_layout l;
  TS_CHECK(ts_flat_layout_init(&l, &psi, 1, dp_size));
  ts_ledger plan;
  ts_ledger_init_plan(&plan);
  unit_state s;
  memset(&s, 0, sizeof s);
  ts_status st = ts_engine_alloc_model_state(&plan, TS_DEVICE_CPU, &l,
                                             ts_zero_policy_of(zero_stage), dtype, TS_STATE_ON_DEVICE, 0,
                                             &s);
  if (st == TS_OK) *out = *ts_ledger_account(&plan, TS_DEVICE_CPU);
  ts_engine_free_model_state(&plan, &s);
  ts_ledger_release(&plan);
  return st;
}

/* The node of each member of a plan group whose member j is world rank
 * first + j * stride, with L ranks per node (L = 0: one node). */
static ts_status plan_nodes(ts_comm *c, size_t first, size_t stride, int L) {
  if (!c || L <= 0) return TS_OK;
  int n = ts_comm_size(c), *node = malloc((size_t)n * sizeof *node);
  if (!node) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "plan: %d members' nodes", n);
  for (int j = 0; j < n; j++) node[j] = (int)((first + (size_t)j * stride) / (size_t)L);
  ts_status st = ts_comm_set_nodes(c, node);
  free(node);
  return st;
}

ts_status ts_engine_plan_build(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                               int stage, int ranks_per_node, ts_engine **out) {
  *out = NULL;
  TS_CHECK(check_dp_size(dp_size));
  ts_engine *e;
  TS_CHECK(ts_engine_new(model, opts, &e));
  /* The plan device: an allocator that charges the ledger and hands out
   * addresses without memory (shard/ledger.h), a kernels context that
   * checks every op and runs none (TS_K_PLAN), groups that count and move
   * nothing (ts_comm_plan). The rest is the engine's own create and step. */
  ts_ledger_init_plan(&e->ledger);
  e->ctx.flags |= TS_K_PLAN;
  e->offload_store = &ts_offload_no_store; /* an offload's bytes charged, no file */
  e->rank = 0; /* shards are equal, so every rank's plan is rank 0's */
  e->dp_size = ts_engine_shard_size(opts, (int)dp_size); /* hybrid: the shard group's S */
  ts_status st = ts_engine_check_shard_group(opts, (int)dp_size);
  if (st == TS_OK) st = ts_engine_set_stage(e, stage);
  if (st == TS_OK) st = ts_comm_plan(e->rank, e->dp_size, "dp", &e->own_comm);
  if (st == TS_OK && (size_t)e->dp_size < dp_size) {
    e->replicas = (int)(dp_size / (size_t)e->dp_size);
    st = ts_comm_plan(0, e->replicas, "replica", &e->own_rep);
    e->rep = e->own_rep;
  }
  /* world rank w = pipeline stage x dp_size + data-parallel rank */
  size_t base = (size_t)stage * dp_size;
  if (st == TS_OK && e->pipe.stages > 1) st = ts_comm_plan(stage, e->pipe.stages, "pp", &e->pipe.own_pp);
  if (st == TS_OK) st = plan_nodes(e->own_comm, base, 1, ranks_per_node);
  if (st == TS_OK) st = plan_nodes(e->own_rep, base, (size_t)e->dp_size, ranks_per_node);
  if (st == TS_OK) st = plan_nodes(e->pipe.own_pp, 0, dp_size, ranks_per_node);
  e->dp = e->own_comm;
  e->pipe.pp = e->pipe.own_pp;
  if (st == TS_OK) st = ts_engine_lend_memory(e);
  if (st == TS_OK) st = ts_engine_alloc(e);
  if (st != TS_OK) {
    ts_engine_free(e);
    return st;
  }
  *out = e;
  return TS_OK;
}

ts_status ts_engine_plan_batch(void *user, int mb, int32_t *inputs, int32_t *targets) {
  return TS_OK; /* the plan's buffers have no memory */
}

/* ts_engine_plan_build, then one whole step (the tied head's gradient
 * lives across micro-batches) with its statistics in *stats_out (NULL:
 * not wanted). */
static ts_status plan_engine(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                             int stage, int ranks_per_node, ts_engine **out,
                             ts_step_stats *stats_out) {
  ts_engine *e;
  TS_CHECK(ts_engine_plan_build(model, opts, dp_size, stage, ranks_per_node, &e));
  ts_step_stats stats;
  ts_status st = ts_engine_step(e, ts_engine_plan_batch, NULL, 0.0f, &stats);
  if (st != TS_OK) {
    ts_engine_free(e);
    return st;
  }
  if (stats_out) *stats_out = stats;
  *out = e;
  return TS_OK;
}

ts_status ts_engine_plan_engine(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                                int stage, ts_engine **out) {
  return plan_engine(model, opts, dp_size, stage, 0, out, NULL);
}

ts_status ts_engine_plan_comm(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                              int stage, int ranks_per_node, ts_step_stats *out) {
  memset(out, 0, sizeof *out);
  if (ranks_per_node < 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`ranks_per_node` %d: expected 0 (one node) or ranks per node >= 1",
                        ranks_per_node);
  ts_engine *e;
  ts_step_stats stats;
  TS_CHECK(plan_engine(model, opts, dp_size, stage, ranks_per_node, &e, &stats));
  ts_engine_free(e);
  out->comm = stats.comm;
  out->comm_bytes = stats.comm_bytes;
  out->comm_remote_bytes = stats.comm_remote_bytes;
  return TS_OK;
}

ts_status ts_engine_plan(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                         ts_mem_account *out) {
  return ts_engine_plan_stage(model, opts, dp_size, 0, out);
}

ts_status ts_engine_plan_stage(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                               int stage, ts_mem_account *out) {
  ts_mem_account host, disk;
  return ts_engine_plan_stage_host(model, opts, dp_size, stage, out, &host, &disk);
}

ts_status ts_engine_plan_stage_host(const ts_model *model, const ts_engine_opts *opts,
                                    size_t dp_size, int stage, ts_mem_account *out,
                                    ts_mem_account *host, ts_mem_account *disk) {
  memset(out, 0, sizeof *out);
  memset(host, 0, sizeof *host);
  memset(disk, 0, sizeof *disk);
  ts_engine *e;
  TS_CHECK(ts_engine_plan_engine(model, opts, dp_size, stage, &e));
  *out = *ts_ledger_account(&e->ledger, e->device);
  if (e->device != TS_DEVICE_CPU) *host = *ts_ledger_account(&e->ledger, TS_DEVICE_CPU);
  *disk = *ts_ledger_disk_account(&e->ledger);
  ts_engine_free(e);
  return TS_OK;
}
