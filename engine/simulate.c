/*
 * simulate.c — the step on a clock (simulate.h): the plan's engine runs
 * its own step while hooks on its groups (comm.h ts_comm_set_sim) and its
 * unit ops (engine_internal.h ts_engine_sim_op) move a clock.
 *
 * Invariants:
 * - The schedule is the engine's: nothing here orders an op or a call.
 * - Each group is one channel: a call starts when the step starts it or
 *   when the group's previous call ends, whichever is later (the
 *   communication thread or stream runs them in submission order).
 * - The clock is the compute stream's: an op adds its cost; a wait moves
 *   it to the call's end, and the difference is exposed communication.
 */
#include "engine/simulate.h"

#include <math.h>
#include <string.h>

#include "engine/engine_internal.h"

enum { MAX_CHANNELS = 4 };

typedef struct sim {
  const ts_sim_cluster *cl;
  const ts_sim_compute *cp;
  const ts_engine *e;
  int node_ranks; /* the ranks of a node that run each call at once: min(L, world) */
  double now, compute, exposed, busy, adamw_total;
  const ts_comm *channel[MAX_CHANNELS];
  double free_at[MAX_CHANNELS];
  int channels, ops, calls;
} sim;

static double ceil_log2(int p) { return p > 1 ? ceil(log2((double)p)) : 0.0; }

double ts_sim_call_seconds(const ts_sim_cluster *cl, int kind, uint64_t bytes, uint64_t remote,
                           uint64_t buffer, int p, int local, int node_ranks) {
  if (p <= 1) return 0.0;
  int spans = local < p;
  double R = node_ranks > local ? (double)node_ranks : (double)local;
  double share = cl->inter.bandwidth * (double)local / R; /* this group's part of the node link */
  double alpha = spans ? cl->inter.latency : cl->intra.latency;
  double w = spans ? fmin(cl->intra.bandwidth, share) : cl->intra.bandwidth;
  double n = (double)buffer;
  if (kind == TS_COMM_SEND) { /* one message, to a peer on this node or another */
    double ws = remote ? fmin(cl->intra.bandwidth, cl->inter.bandwidth) : cl->intra.bandwidth;
    return (remote ? cl->inter.latency : cl->intra.latency) + n / ws;
  }
  if (cl->algorithm == TS_SIM_DIRECT) {
    double within = (double)(bytes - remote) / cl->intra.bandwidth;
    double across = R * (double)remote / cl->inter.bandwidth;
    return alpha + fmax(within, across);
  }
  if (kind == TS_COMM_BROADCAST) return ceil_log2(p) * alpha + n / w;
  double ring = (double)(p - 1) * (alpha + n / (double)p / w);
  if (kind != TS_COMM_ALL_REDUCE) return ring;
  ring *= 2.0;
  double tree = 2.0 * ceil_log2(p) * alpha + 2.0 * n / w;
  switch (cl->algorithm) {
    case TS_SIM_RING: return ring;
    case TS_SIM_TREE: return tree;
    default: return fmin(ring, tree);
  }
}

/* The index of c's channel, added on first use. */
static int channel_of(sim *s, const ts_comm *c) {
  for (int i = 0; i < s->channels; i++)
    if (s->channel[i] == c) return i;
  int i = s->channels < MAX_CHANNELS ? s->channels++ : MAX_CHANNELS - 1;
  s->channel[i] = c;
  s->free_at[i] = 0.0;
  return i;
}

static void sim_wait(void *user, double done) {
  sim *s = user;
  if (done > s->now) {
    s->exposed += done - s->now;
    s->now = done;
  }
}

static double sim_call(void *user, const ts_comm *c, const ts_comm_sim_call *k, int blocking) {
  sim *s = user;
  int p = ts_comm_size(c), local = p - ts_comm_remote_peers(c);
  double t =
      ts_sim_call_seconds(s->cl, k->kind, k->bytes, k->remote, k->buffer, p, local, s->node_ranks);
  int i = channel_of(s, c);
  double start = fmax(s->now, s->free_at[i]), end = start + t;
  s->free_at[i] = end;
  s->busy += t;
  s->calls++;
  if (blocking) sim_wait(s, end);
  return end;
}

/* Forward FLOPs of unit u for one micro-batch (a third of the PaLM count
 * of ts_engine_unit_cost: 2 per matrix parameter and token, 4 T C per
 * token for a block's attention); the embedding's gather counts none. */
static double forward_flops(const ts_engine *e, int u) {
  const ts_model *m = e->model;
  const ts_unit *un = &m->units[u];
  if (un->role == TS_UNIT_EMBEDDING) return 0.0;
  double BT = (double)e->opts.micro_batch * (double)e->opts.seq, matrices = 0.0;
  for (int i = 0; i < un->n_tensors; i++) matrices += (double)un->tensors[i].numel;
  if (un->tied_unit >= 0)
    matrices += (double)m->units[un->tied_unit].tensors[un->tied_tensor].numel;
  double f = 2.0 * matrices;
  if (un->role == TS_UNIT_BLOCK) f += 4.0 * (double)e->opts.seq * (double)m->hidden_size;
  return f * BT;
}

/* The elements AdamW updates on this rank for unit u. */
static double adamw_elements(const ts_engine *e, int u) {
  const ts_flat_layout *l = &e->units[u].layout;
  return (double)(e->zero->shard_optim ? l->shard : l->padded);
}

static void sim_op(void *user, ts_span_kind kind, int u) {
  sim *s = user;
  const ts_sim_compute *cp = s->cp;
  double rate = cp->peak_flops * cp->efficiency, t;
  switch (kind) {
    case TS_SPAN_FORWARD:
      t = cp->forward && cp->forward[u] >= 0 ? cp->forward[u] : forward_flops(s->e, u) / rate;
      break;
    case TS_SPAN_RECOMPUTE:
      t = cp->recompute && cp->recompute[u] >= 0 ? cp->recompute[u] : forward_flops(s->e, u) / rate;
      break;
    case TS_SPAN_BACKWARD:
      t = cp->backward && cp->backward[u] >= 0 ? cp->backward[u]
                                               : 2.0 * forward_flops(s->e, u) / rate;
      break;
    case TS_SPAN_OPTIMIZER:
      t = cp->optimizer >= 0 ? cp->optimizer * adamw_elements(s->e, u) / s->adamw_total
                             : 32.0 * adamw_elements(s->e, u) / cp->mem_bandwidth;
      break;
    default: t = 0.0;
  }
  t *= cp->slowdown;
  s->now += t;
  s->compute += t;
  s->ops++;
}

static ts_status check_link(const ts_sim_link *l, const char *name) {
  if (!(l->bandwidth > 0) || !isfinite(l->bandwidth) || !(l->latency >= 0) || !isfinite(l->latency))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "simulate: `%s` link %g bytes/s, latency %g s: expected a bandwidth > 0 "
                        "and a latency >= 0",
                        name, l->bandwidth, l->latency);
  return TS_OK;
}

static ts_status check_inputs(const ts_engine_opts *o, const ts_sim_cluster *cl,
                              const ts_sim_compute *cp) {
  if (o->pipeline_stages > 1)
    return ts_set_error(TS_ERR_UNSUPPORTED,
                        "simulate: `pipeline_stages` %d: pipelines are not simulated in this "
                        "build (1 stage only)",
                        o->pipeline_stages);
  if (cl->ranks_per_node < 1)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "simulate: `ranks_per_node` %d: expected >= 1",
                        cl->ranks_per_node);
  TS_CHECK(check_link(&cl->intra, "intra"));
  TS_CHECK(check_link(&cl->inter, "inter"));
  if (!(cp->peak_flops > 0) || !isfinite(cp->peak_flops) || !(cp->efficiency > 0) ||
      !(cp->efficiency <= 1) || !(cp->mem_bandwidth > 0) || !isfinite(cp->mem_bandwidth) ||
      !(cp->slowdown >= 1) || !isfinite(cp->slowdown) || !(cp->other >= 0) || !isfinite(cp->other))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "simulate: compute peak %g FLOP/s, efficiency %g, memory %g bytes/s, "
                        "slowdown %g, other %g s: expected a peak > 0, 0 < efficiency <= 1, "
                        "memory > 0, slowdown >= 1, other >= 0",
                        cp->peak_flops, cp->efficiency, cp->mem_bandwidth, cp->slowdown, cp->other);
  return TS_OK;
}

ts_status ts_simulate(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                      const ts_sim_cluster *cluster, const ts_sim_compute *compute,
                      ts_sim_result *out) {
  memset(out, 0, sizeof *out);
  TS_CHECK(check_inputs(opts, cluster, compute));
  ts_engine *e;
  TS_CHECK(ts_engine_plan_build(model, opts, dp_size, 0, cluster->ranks_per_node, &e));
  int R = dp_size < (size_t)cluster->ranks_per_node ? (int)dp_size : cluster->ranks_per_node;
  sim s = {.cl = cluster, .cp = compute, .e = e, .node_ranks = R};
  for (int u = e->u_begin; u < e->u_end; u++) s.adamw_total += adamw_elements(e, u);
  ts_comm_sim hooks = {&s, sim_call, sim_wait};
  ts_comm *groups[3] = {e->dp, e->rep, e->pp};
  for (int g = 0; g < 3; g++)
    if (groups[g]) ts_comm_set_sim(groups[g], &hooks);
  e->sim_op = sim_op;
  e->sim_user = &s;
  /* The first step warms (a tied head's first gathers); the second is timed. */
  ts_step_stats st;
  ts_status rc = ts_engine_step(e, ts_engine_plan_batch, NULL, 0.0f, &st);
  if (rc == TS_OK) {
    sim fresh = {
        .cl = cluster, .cp = compute, .e = e, .node_ranks = R, .adamw_total = s.adamw_total};
    s = fresh;
    rc = ts_engine_step(e, ts_engine_plan_batch, NULL, 0.0f, &st);
  }
  for (int g = 0; g < 3; g++)
    if (groups[g]) ts_comm_set_sim(groups[g], NULL);
  if (rc == TS_OK) {
    double tokens = (double)opts->micro_batch * (double)opts->seq * (double)opts->grad_accum;
    s.now += compute->other; /* outside the ops: no call overlaps it in the model */
    s.compute += compute->other;
    out->step_s = s.now;
    out->compute_s = s.compute;
    out->exposed_comm_s = s.exposed;
    out->comm_busy_s = s.busy;
    out->bytes = st.comm_bytes;
    out->remote_bytes = st.comm_remote_bytes;
    out->tokens_per_s = s.now > 0 ? tokens / s.now : 0.0;
    out->mfu = out->tokens_per_s * ts_model_flops_per_token(model, opts->seq) / compute->peak_flops;
    out->peak_bytes = ts_ledger_account(&e->ledger, e->device)->peak_total;
    out->ops = s.ops;
    out->calls = s.calls;
  }
  ts_engine_free(e);
  return rc;
}
