/*
 * simulate.c — the step on a clock (simulate.h), in two parts. Record:
 * each pipeline stage's plan engine runs its own step while an observer
 * (observer.h: its unit ops' ends, its groups' calls and the waits for
 * them) writes the step's events in order: an op and its
 * compute seconds, a call and its link seconds, a wait for a started
 * call. Replay: the events on a clock per stage; the stages' clocks meet
 * at their messages (a receive ends when its send does) and at the
 * pipeline group's collectives (they start when the last stage starts
 * them), replayed again and again until no time moves.
 *
 * Invariants:
 * - The schedule is the engine's: nothing here orders an op or a call.
 * - Each group is one channel: a call starts when the step starts it or
 *   when the group's previous call ends, whichever is later (the
 *   communication thread or stream runs them in submission order). An
 *   offload's disk is one more (its I/O thread): a unit's read or
 *   write-back is a call of its bytes at the disk's rate, a unit's acquire
 *   a wait for the slot's last job (exposed disk time).
 * - The clock is the compute stream's: an op adds its cost; a wait moves
 *   it to the call's end; the difference is exposed communication, or
 *   pipeline waiting when the call is the pipeline group's.
 * - The k-th send from stage a to stage b with tag t is the k-th receive
 *   of stage b from a with tag t (MPI's order between two ranks).
 * - Replays only raise times (a replay is monotone in the others' times,
 *   all starting at 0), so the first replay in which nothing moves is the
 *   least fixed point: the times of the schedule the engine runs.
 */
#include "engine/simulate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"

enum { MAX_CHANNELS = 4 };
/* The offload's disk: a channel of its own beside the groups'. */
enum { DISK_CHANNEL = MAX_CHANNELS, CHANNELS = MAX_CHANNELS + 1 };

/* A call's time in parts, alpha + max(cpu, wire): cpu the copies within a
 * node that the ranks' own cores make (the direct algorithm's: tessera's
 * CPU transport over shared memory; 0 for the others), wire the rest. */
typedef struct call_time {
  double alpha, cpu, wire;
} call_time;

/* What an event is. */
enum { EV_OP = 0, EV_CALL = 1, EV_WAIT = 2 };
/* A call's part between stages. */
enum { P2P_NONE = 0, P2P_SEND = 1, P2P_RECV = 2 };

typedef struct event {
  int kind;     /* EV_OP, EV_CALL, EV_WAIT */
  int channel;  /* EV_CALL: the group's channel */
  int blocking; /* EV_CALL: the step waits for it where it is made */
  int p2p;      /* EV_CALL: P2P_* */
  int peer, tag;
  int coll;       /* EV_CALL: the pipeline group's k-th collective, else -1 */
  int io;         /* EV_CALL: an offload job on the disk's channel */
  int id;         /* EV_WAIT: the call's event; EV_CALL recv: the matching send's event */
  double t;       /* EV_OP: compute seconds on a core of its own */
  call_time time; /* EV_CALL: its time in parts (cpu on a core of its own) */
} event;

/* One stage's recorded step and its replay's times. */
typedef struct stage_log {
  event *ev;
  int n, cap;
  double *done; /* [n] EV_CALL: when the call ends */
  int pp_colls; /* the pipeline group's collectives recorded */
  ts_sim_result r;
} stage_log;

/* The recorder: hooks of one stage's plan engine. */
typedef struct recorder {
  const ts_sim_cluster *cl;
  const ts_sim_compute *cp;
  const ts_engine *e;
  int node_ranks;   /* the ranks of a node that run each call at once: min(L, dp) */
  double adamw_all; /* the parameters a profile's optimizer step updated: all of them */
  const ts_comm *channel[MAX_CHANNELS];
  int channels;
  stage_log *log;
  int *call_event; /* (calls) the event of each call the engine numbered */
  int calls, calls_cap;
  int *io_event; /* (ios) the event of each offload job the engine numbered */
  int ios, ios_cap;
  int64_t io_base; /* the number of the first job told (the step before counted too) */
  ts_status st;
} recorder;

static double ceil_log2(int p) { return p > 1 ? ceil(log2((double)p)) : 0.0; }

static call_time call_parts(const ts_sim_cluster *cl, int kind, uint64_t bytes, uint64_t remote,
                            uint64_t buffer, int p, int local, int node_ranks) {
  call_time c = {0.0, 0.0, 0.0};
  if (p <= 1) return c;
  int spans = local < p, direct = cl->algorithm == TS_SIM_DIRECT;
  double R = node_ranks > local ? (double)node_ranks : (double)local;
  double share = cl->inter.bandwidth * (double)local / R; /* this group's part of the node link */
  double alpha = spans ? cl->inter.latency : cl->intra.latency;
  double w = spans ? fmin(cl->intra.bandwidth, share) : cl->intra.bandwidth;
  double n = (double)buffer;
  if (kind == TS_COMM_SEND) { /* one message, to a peer on this node or another */
    c.alpha = remote ? cl->inter.latency : cl->intra.latency;
    if (remote)
      c.wire = n / fmin(cl->intra.bandwidth, cl->inter.bandwidth);
    else if (direct)
      c.cpu = n / cl->intra.bandwidth;
    else
      c.wire = n / cl->intra.bandwidth;
    return c;
  }
  if (direct) {
    c.alpha = alpha;
    c.cpu = (double)(bytes - remote) / cl->intra.bandwidth;
    c.wire = R * (double)remote / cl->inter.bandwidth;
    return c;
  }
  if (kind == TS_COMM_BROADCAST) {
    c.wire = ceil_log2(p) * alpha + n / w;
    return c;
  }
  double ring = (double)(p - 1) * (alpha + n / (double)p / w);
  if (kind != TS_COMM_ALL_REDUCE) {
    c.wire = ring;
    return c;
  }
  ring *= 2.0;
  double tree = 2.0 * ceil_log2(p) * alpha + 2.0 * n / w;
  switch (cl->algorithm) {
    case TS_SIM_RING: c.wire = ring; break;
    case TS_SIM_TREE: c.wire = tree; break;
    default: c.wire = fmin(ring, tree);
  }
  return c;
}

double ts_sim_call_seconds(const ts_sim_cluster *cl, int kind, uint64_t bytes, uint64_t remote,
                           uint64_t buffer, int p, int local, int node_ranks) {
  call_time c = call_parts(cl, kind, bytes, remote, buffer, p, local, node_ranks);
  return c.alpha + fmax(c.cpu, c.wire);
}

/* The index of c's channel, added on first use. */
static int channel_of(recorder *r, const ts_comm *c) {
  for (int i = 0; i < r->channels; i++)
    if (r->channel[i] == c) return i;
  int i = r->channels < MAX_CHANNELS ? r->channels++ : MAX_CHANNELS - 1;
  r->channel[i] = c;
  return i;
}

/* Appends ev to the log; returns its index, or -1 (r->st set). */
static int push(recorder *r, event ev) {
  stage_log *g = r->log;
  if (r->st != TS_OK) return -1;
  if (g->n == g->cap) {
    int cap = g->cap ? 2 * g->cap : 1024;
    event *ne = realloc(g->ev, (size_t)cap * sizeof *ne);
    if (!ne) {
      r->st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "simulate: %d events", cap);
      return -1;
    }
    g->ev = ne;
    g->cap = cap;
  }
  g->ev[g->n] = ev;
  return g->n++;
}

/* Appends v to a growing int array *a of *n (capacity *cap); 0, or -1 (r->st
 * set). */
static int append(recorder *r, int **a, int *n, int *cap, int v) {
  if (*n == *cap) {
    int c = *cap ? 2 * *cap : 1024;
    int *na = realloc(*a, (size_t)c * sizeof *na);
    if (!na) {
      r->st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "simulate: %d numbered events", c);
      return -1;
    }
    *a = na;
    *cap = c;
  }
  (*a)[(*n)++] = v;
  return 0;
}

/* An offload job queued (observer.h io): a call on the disk's channel. */
static void rec_io(void *user, ts_engine *e, int write, int unit, uint64_t bytes, int64_t id) {
  (void)e;
  (void)unit;
  recorder *r = user;
  if (r->st != TS_OK) return;
  if (r->ios == 0) r->io_base = id;
  if (id - r->io_base != r->ios) {
    r->st = ts_set_error(TS_ERR_INTERNAL, "simulate: offload job %lld told after %d", (long long)id,
                         r->ios);
    return;
  }
  double rate = write ? r->cp->disk_write : r->cp->disk_read;
  event ev = {.kind = EV_CALL, .channel = DISK_CHANNEL, .io = 1, .coll = -1, .id = -1,
              .peer = -1, .tag = -1};
  ev.time.wire = (double)bytes / rate;
  append(r, &r->io_event, &r->ios, &r->ios_cap, push(r, ev));
}

/* A wait for offload job id (observer.h io_wait). */
static void rec_io_wait(void *user, ts_engine *e, int64_t id) {
  (void)e;
  recorder *r = user;
  int64_t k = id - r->io_base; /* jobs queued before the recorded step: done by now */
  if (r->ios > 0 && k >= 0 && k < r->ios && r->io_event[k] >= 0)
    push(r, (event){.kind = EV_WAIT, .id = r->io_event[k], .coll = -1});
}

/* The step waits for call id (observer.h call_wait). */
static void rec_wait(void *user, ts_engine *e, int64_t id) {
  (void)e;
  recorder *r = user;
  if (id >= 0 && id < r->calls && r->call_event[id] >= 0)
    push(r, (event){.kind = EV_WAIT, .id = r->call_event[id], .coll = -1});
}

/* A call on group c, the engine's number id (observer.h call). */
static void rec_call(void *user, ts_engine *e, const ts_comm *c, const ts_comm_call_info *k,
                     int blocking, int64_t id) {
  (void)e;
  recorder *r = user;
  if (r->st != TS_OK) return;
  if (id != r->calls) {
    r->st = ts_set_error(TS_ERR_INTERNAL, "simulate: call %lld told after %d calls", (long long)id,
                         r->calls);
    return;
  }
  if (r->calls == r->calls_cap) {
    int cap = r->calls_cap ? 2 * r->calls_cap : 1024;
    int *nc = realloc(r->call_event, (size_t)cap * sizeof *nc);
    if (!nc) {
      r->st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "simulate: %d calls", cap);
      return;
    }
    r->call_event = nc;
    r->calls_cap = cap;
  }
  int p = ts_comm_size(c), local = p - ts_comm_remote_peers(c);
  event ev = {.kind = EV_CALL,
              .channel = channel_of(r, c),
              .blocking = blocking,
              .p2p = k->recv                   ? P2P_RECV
                     : k->kind == TS_COMM_SEND ? P2P_SEND
                                               : P2P_NONE,
              .peer = k->peer,
              .tag = k->tag,
              .coll = -1,
              .id = -1};
  if (ev.p2p != P2P_RECV) /* a receive's transfer is its send's */
    ev.time = call_parts(r->cl, k->kind, k->bytes, k->remote, k->buffer, p, local, r->node_ranks);
  if (ev.p2p == P2P_NONE && c == r->e->pipe.pp) ev.coll = r->log->pp_colls++;
  r->call_event[r->calls++] = push(r, ev);
}

/* Forward FLOPs of unit u for one micro-batch (models/model.h's FLOP
 * model). */
static double forward_flops(const ts_engine *e, int u) {
  double BT = (double)e->opts.micro_batch * (double)e->opts.seq;
  return ts_unit_forward_flops(e->model, u, e->opts.seq) * BT;
}

/* The part of unit u's backward that is W, its weight gradients, when
 * the schedule defers them (ZB-H1) and u's backward splits: the products'
 * weight-gradient halves, its forward's FLOPs but the attention's (4 T C
 * a token for a block, models/model.h), over the backward's 2 forwards;
 * else 0. */
static double weight_share(const ts_engine *e, int u) {
  if (!e->pipe.sched.split_backward || !ts_unit_splits_backward(e->model, u)) return 0.0;
  double T = (double)e->opts.seq, C = (double)e->model->hidden_size;
  double f = ts_unit_forward_flops(e->model, u, e->opts.seq);
  double attention = e->model->units[u].role == TS_UNIT_BLOCK ? 4.0 * T * C : 0.0;
  return f > 0 ? (f - attention) / (2.0 * f) : 0.0;
}

/* The elements AdamW updates on this rank for unit u. */
static double adamw_elements(const ts_engine *e, int u) {
  const ts_flat_layout *l = &e->units[u].layout;
  return (double)(e->zero->shard_optim ? l->shard : l->padded);
}

/* Unit u's parameters (its own tensors, unpadded). */
static double unit_numel(const ts_model *m, int u) {
  double n = 0.0;
  for (int i = 0; i < m->units[u].n_tensors; i++) n += (double)m->units[u].tensors[i].numel;
  return n;
}

/* The share of a measured optimizer step (one rank updating every
 * parameter) that unit u's AdamW on this rank is: the unit's part of the
 * parameters, times the part of its padded buffer this rank updates. */
static double adamw_share(const recorder *r, int u) {
  const ts_engine *e = r->e;
  return unit_numel(e->model, u) / r->adamw_all * adamw_elements(e, u) /
         (double)e->units[u].layout.padded;
}

/* An op's end (observer.h span_end): a unit's forward, recompute,
 * backward (B), weight gradients (W) or AdamW; the other spans (the whole update, sends and
 * receives) are timed by their parts and calls. */
static void rec_op(void *user, ts_engine *e, ts_span_kind kind, int u) {
  (void)e;
  recorder *r = user;
  if (u < 0 || (kind != TS_SPAN_FORWARD && kind != TS_SPAN_RECOMPUTE &&
                kind != TS_SPAN_BACKWARD && kind != TS_SPAN_WEIGHT && kind != TS_SPAN_OPTIMIZER))
    return;
  const ts_sim_compute *cp = r->cp;
  double rate = cp->peak_flops * cp->efficiency, t;
  switch (kind) {
    case TS_SPAN_FORWARD:
      t = cp->forward && cp->forward[u] >= 0 ? cp->forward[u] : forward_flops(r->e, u) / rate;
      break;
    case TS_SPAN_RECOMPUTE:
      t = cp->recompute && cp->recompute[u] >= 0 ? cp->recompute[u] : forward_flops(r->e, u) / rate;
      break;
    case TS_SPAN_BACKWARD: /* split (ZB-H1): B, the rest of the whole backward after W */
    case TS_SPAN_WEIGHT:   /* its weight_share */
      t = cp->backward && cp->backward[u] >= 0 ? cp->backward[u]
                                               : 2.0 * forward_flops(r->e, u) / rate;
      t *= kind == TS_SPAN_WEIGHT ? weight_share(r->e, u) : 1.0 - weight_share(r->e, u);
      break;
    case TS_SPAN_OPTIMIZER:
      if (r->e->opts.offload_optimizer) { /* over the host link, AdamW on the host */
        double n = adamw_elements(r->e, u), es = (double)r->e->es;
        double moved = (r->e->opts.dtype == TS_FP32 ? 3.0 : 2.0) * es * n;
        t = moved / cp->host_link + 32.0 * n / cp->host_mem_bandwidth;
      } else {
        t = cp->optimizer >= 0 ? cp->optimizer * adamw_share(r, u)
                               : 32.0 * adamw_elements(r->e, u) / cp->mem_bandwidth;
      }
      break;
    default: t = 0.0;
  }
  push(r, (event){.kind = EV_OP, .t = t, .coll = -1, .id = -1});
}

static ts_status check_link(const ts_sim_link *l, const char *name) {
  if (!(l->bandwidth > 0) || !isfinite(l->bandwidth) || !(l->latency >= 0) || !isfinite(l->latency))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "simulate: `%s` link %g bytes/s, latency %g s: expected a bandwidth > 0 "
                        "and a latency >= 0",
                        name, l->bandwidth, l->latency);
  return TS_OK;
}

static ts_status check_inputs(const ts_sim_cluster *cl, const ts_sim_compute *cp) {
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
  if (!(cp->shared_cores >= 0) || !isfinite(cp->shared_cores))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "simulate: `shared_cores` %g: expected 0 (a device per rank) or the "
                        "cores the ranks share",
                        cp->shared_cores);
  return TS_OK;
}

/* Records stage `stage`'s second step into g (the first warms: a tied
 * head's first gathers). */
static ts_status record_stage(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                              int stage, const ts_sim_cluster *cl, const ts_sim_compute *cp,
                              stage_log *g) {
  ts_engine *e;
  TS_CHECK(ts_engine_plan_build(model, opts, dp_size, stage, cl->ranks_per_node, &e));
  int R = dp_size < (size_t)cl->ranks_per_node ? (int)dp_size : cl->ranks_per_node;
  recorder r = {.cl = cl, .cp = cp, .e = e, .node_ranks = R, .log = g, .st = TS_OK};
  for (int u = 0; u < model->n_units; u++) r.adamw_all += unit_numel(model, u);
  ts_step_stats st;
  ts_status rc = ts_engine_step(e, ts_engine_plan_batch, NULL, 0.0f, &st);
  ts_step_observer ops = {.span_end = rec_op,
                          .call = rec_call,
                          .call_wait = rec_wait,
                          .io = rec_io,
                          .io_wait = rec_io_wait,
                          .user = &r};
  if (rc == TS_OK) rc = ts_engine_add_observer(e, &ops);
  if (rc == TS_OK) {
    rc = ts_engine_step(e, ts_engine_plan_batch, NULL, 0.0f, &st);
    ts_engine_remove_observer(e, &ops);
  }
  free(r.call_event);
  free(r.io_event);
  if (rc == TS_OK) rc = r.st;
  if (rc == TS_OK) {
    g->r.bytes = st.comm_bytes;
    g->r.remote_bytes = st.comm_remote_bytes;
    const ts_mem_account *acc = ts_ledger_account(&e->ledger, e->device);
    g->r.peak_bytes = acc->peak_total;
    /* offload_optimizer: the state and the update's pieces are the host's,
     * not the simulated device's (the plan's device is the CPU, one
     * account; those blocks live from create to free, so their bytes are
     * in every moment's total) */
    if (opts->offload_optimizer)
      g->r.peak_bytes -= acc->current[TS_MEM_MASTER] + acc->current[TS_MEM_OPTIM] +
                         acc->current[TS_MEM_STAGING];
  }
  ts_engine_free(e);
  return rc;
}

/* Each receive's matching send (event.id): the k-th receive of stage s from
 * a with tag t is the k-th send of a to s with tag t. TS_ERR_INTERNAL when
 * one has none, or the stages made unequal numbers of pipeline
 * collectives (the engine's schedule would hang). */
static ts_status match(stage_log *g, int P) {
  for (int s = 0; s < P; s++) {
    if (g[s].pp_colls != g[0].pp_colls)
      return ts_set_error(TS_ERR_INTERNAL,
                          "simulate: stage %d made %d pipeline collectives, stage 0 %d", s,
                          g[s].pp_colls, g[0].pp_colls);
    for (int i = 0; i < g[s].n; i++) {
      event *rv = &g[s].ev[i];
      if (rv->kind != EV_CALL || rv->p2p != P2P_RECV) continue;
      int a = rv->peer, k = 0;
      for (int j = 0; j < i; j++) /* earlier receives from a with this tag */
        k += g[s].ev[j].kind == EV_CALL && g[s].ev[j].p2p == P2P_RECV && g[s].ev[j].peer == a &&
             g[s].ev[j].tag == rv->tag;
      if (a < 0 || a >= P)
        return ts_set_error(TS_ERR_INTERNAL, "simulate: stage %d receives from %d of %d", s, a, P);
      for (int j = 0; j < g[a].n && rv->id < 0; j++) {
        const event *sd = &g[a].ev[j];
        if (sd->kind == EV_CALL && sd->p2p == P2P_SEND && sd->peer == s && sd->tag == rv->tag &&
            k-- == 0)
          rv->id = j;
      }
      if (rv->id < 0)
        return ts_set_error(TS_ERR_INTERNAL,
                            "simulate: stage %d's receive from stage %d (tag %d) has no send", s, a,
                            rv->tag);
    }
  }
  return TS_OK;
}

/* Replays stage s against the others' latest times (coll_start: (K, P)
 * each stage's start of each pipeline collective), its work on the cores
 * (ops, copies) taking f times its time on a core of its own. Returns 1
 * when a time of this stage moved. */
static int replay(stage_log *g, int P, int s, double *coll_start, double other, double f) {
  stage_log *me = &g[s];
  double now = 0.0, free_at[CHANNELS] = {0};
  ts_sim_result r = me->r; /* bytes and peak from the record */
  r.step_s = r.compute_s = r.exposed_comm_s = r.pipeline_wait_s = r.comm_busy_s = 0.0;
  r.exposed_io_s = r.io_busy_s = 0.0;
  r.ops = r.calls = 0;
  int moved = 0;
  for (int i = 0; i < me->n; i++) {
    const event *ev = &me->ev[i];
    double until = -1.0; /* a wait's end */
    int pipe = 0;        /* the wait is for another stage */
    int io = 0;          /* the wait is for the disk */
    if (ev->kind == EV_OP) {
      now += f * ev->t;
      r.compute_s += f * ev->t;
      r.ops++;
      continue;
    }
    if (ev->kind == EV_WAIT) {
      const event *c = &me->ev[ev->id];
      until = me->done[ev->id];
      pipe = c->p2p != P2P_NONE || c->coll >= 0;
      io = c->io;
    } else {
      double end;
      if (ev->p2p == P2P_RECV) {
        end = g[ev->peer].done[ev->id]; /* when its send ends */
      } else {
        double start = fmax(now, free_at[ev->channel]);
        if (ev->coll >= 0) {
          double *row = coll_start + (size_t)ev->coll * (size_t)P;
          if (row[s] != start) moved = 1;
          row[s] = start;
          for (int q = 0; q < P; q++) start = fmax(start, row[q]);
        }
        double t = ev->time.alpha + fmax(f * ev->time.cpu, ev->time.wire);
        end = start + t;
        free_at[ev->channel] = end;
        if (ev->io) {
          r.io_busy_s += t;
        } else {
          r.comm_busy_s += t;
          r.calls++;
        }
      }
      if (me->done[i] != end) moved = 1;
      me->done[i] = end;
      if (ev->blocking) {
        until = end, pipe = ev->p2p != P2P_NONE || ev->coll >= 0;
      } else if (ev->time.cpu > 0) { /* its copies take the compute stream's core */
        double c = f * ev->time.cpu;
        now += c;
        if (ev->p2p != P2P_NONE || ev->coll >= 0)
          r.pipeline_wait_s += c;
        else
          r.exposed_comm_s += c;
      }
    }
    if (until > now) {
      if (io)
        r.exposed_io_s += until - now;
      else if (pipe)
        r.pipeline_wait_s += until - now;
      else
        r.exposed_comm_s += until - now;
      now = until;
    }
  }
  now += other; /* outside the ops: no call overlaps it in the model */
  r.compute_s += other;
  r.step_s = now;
  me->r = r;
  return moved;
}

ts_status ts_simulate_stages(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                             const ts_sim_cluster *cluster, const ts_sim_compute *compute,
                             ts_sim_result *out, ts_sim_result *stages) {
  memset(out, 0, sizeof *out);
  TS_CHECK(check_inputs(cluster, compute));
  if (opts->offload_optimizer &&
      (!(compute->host_link > 0) || !isfinite(compute->host_link) ||
       !(compute->host_mem_bandwidth > 0) || !isfinite(compute->host_mem_bandwidth)))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "simulate: host link %g, host memory %g bytes/s: expected both > 0 with "
                        "`offload_optimizer`",
                        compute->host_link, compute->host_mem_bandwidth);
  if (opts->offload_dir && (!(compute->disk_read > 0) || !isfinite(compute->disk_read) ||
                            !(compute->disk_write > 0) || !isfinite(compute->disk_write)))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "simulate: disk read %g, write %g bytes/s: expected both > 0 with "
                        "`offload_dir`",
                        compute->disk_read, compute->disk_write);
  int P = opts->pipeline_stages > 1 ? opts->pipeline_stages : 1;
  stage_log *g = calloc((size_t)P, sizeof *g);
  if (!g) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "simulate: %d stages", P);
  ts_status st = TS_OK;
  for (int s = 0; s < P && st == TS_OK; s++)
    st = record_stage(model, opts, dp_size, s, cluster, compute, &g[s]);
  if (st == TS_OK) st = match(g, P);
  for (int s = 0; s < P && st == TS_OK; s++) {
    g[s].done = calloc((size_t)g[s].n + 1, sizeof *g[s].done);
    if (!g[s].done) st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "simulate: %d events", g[s].n);
  }
  double *coll = NULL;
  if (st == TS_OK) {
    coll = calloc((size_t)g[0].pp_colls * (size_t)P + 1, sizeof *coll);
    if (!coll) st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "simulate: %d collectives", g[0].pp_colls);
  }
  /* Sweeps down and up the stages (activations flow down, gradients up)
   * until none moves; each sweep fixes at least one more event of the
   * longest chain, so the events bound the sweeps. With shared cores, the
   * whole again at the share the ranks' demand for the cores gives, until
   * it settles. */
  long events = 0;
  for (int s = 0; s < P && st == TS_OK; s++) events += g[s].n;
  double share = 1.0; /* the slowdown from sharing cores */
  for (int round = 0; st == TS_OK; round++) {
    for (int s = 0; s < P; s++) memset(g[s].done, 0, (size_t)g[s].n * sizeof *g[s].done);
    memset(coll, 0, ((size_t)g[0].pp_colls * (size_t)P + 1) * sizeof *coll);
    int moved = 1;
    for (long pass = 0; moved && st == TS_OK; pass++) {
      if (pass > events + 1) {
        st = ts_set_error(TS_ERR_INTERNAL, "simulate: the stages' times did not settle");
        break;
      }
      moved = 0;
      for (int k = 0; k < P; k++) {
        int s = pass % 2 ? P - 1 - k : k;
        moved |= replay(g, P, s, coll, compute->other, compute->slowdown * share);
      }
    }
    if (st != TS_OK || compute->shared_cores <= 0) break;
    /* the ranks holding a core on average over the step: all but those
     * waiting for another pipeline stage, each stage's dp of them */
    double step = 0.0, demand = 0.0;
    for (int s = 0; s < P; s++) step = fmax(step, g[s].r.step_s);
    for (int s = 0; s < P && step > 0; s++)
      demand += (double)dp_size * (step - g[s].r.pipeline_wait_s) / step;
    double next = fmax(1.0, demand / compute->shared_cores);
    if (fabs(next - share) <= 1e-9 * next || round >= 50) break;
    share = next;
  }
  if (st == TS_OK) {
    /* the step ends with its slowest stage; the figures are the
     * bottleneck's, the stage whose own work (compute and exposed
     * communication) is the most: its waits are the bubble and the
     * transfers, not the others' imbalance (the time it then waits for
     * the step's end counts as pipeline wait); the bytes and memory of
     * the stage that sends or holds the most, the ops and calls of all */
    int worst = 0;
    double last = 0.0;
    for (int s = 0; s < P; s++) {
      last = fmax(last, g[s].r.step_s);
      if (g[s].r.compute_s + g[s].r.exposed_comm_s >
          g[worst].r.compute_s + g[worst].r.exposed_comm_s)
        worst = s;
    }
    *out = g[worst].r;
    out->pipeline_wait_s += last - out->step_s;
    out->step_s = last;
    out->ops = out->calls = 0;
    for (int s = 0; s < P; s++) {
      const ts_sim_result *r = &g[s].r;
      if (r->bytes > out->bytes) out->bytes = r->bytes;
      if (r->remote_bytes > out->remote_bytes) out->remote_bytes = r->remote_bytes;
      if (r->peak_bytes > out->peak_bytes) out->peak_bytes = r->peak_bytes;
      out->ops += r->ops;
      out->calls += r->calls;
    }
    /* the P stages' ranks share one replica's tokens */
    double tokens = (double)opts->micro_batch * (double)opts->seq * (double)opts->grad_accum;
    for (int s = 0; s < P; s++) {
      ts_sim_result *r = &g[s].r;
      r->tokens_per_s = r->step_s > 0 ? tokens / r->step_s / P : 0.0;
      r->mfu = r->tokens_per_s * ts_model_flops_per_token(model, opts->seq) / compute->peak_flops;
    }
    out->tokens_per_s = out->step_s > 0 ? tokens / out->step_s / P : 0.0;
    out->mfu = out->tokens_per_s * ts_model_flops_per_token(model, opts->seq) / compute->peak_flops;
    if (stages)
      for (int s = 0; s < P; s++) stages[s] = g[s].r;
  }
  free(coll);
  for (int s = 0; s < P; s++) {
    free(g[s].ev);
    free(g[s].done);
  }
  free(g);
  return st;
}

ts_status ts_simulate(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                      const ts_sim_cluster *cluster, const ts_sim_compute *compute,
                      ts_sim_result *out) {
  return ts_simulate_stages(model, opts, dp_size, cluster, compute, out, NULL);
}
