/*
 * device.c — the engine beside a GPU: what create does before allocating
 * (the device's copies and addition lent to comm's groups, the staged
 * transport's host staging, NCCL's streams and sum, the
 * kernels' flags, the plan checked against the card's free memory, the
 * step's transients reserved), the host-side check of a batch that lets the
 * kernels skip reading it back, and the card's own memory figures beside
 * the ledger (engine.h ts_device_report).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/nccl.h"
#include "engine/engine_internal.h"

/* The engine's memory lent to its groups (ts_engine_lend_memory): this
 * file's part of the engine's state, so that NCCL's types stay here. */
struct ts_engine_lending {
  ts_comm_memory comm_mem;        /* lent to dp (beside a device, or staged) and to pp (staged) */
  int lent_dp, lent_pp, lent_rep; /* 1 while comm_mem is lent to that group */
  void *comm_staging[3];          /* staged: host staging of dp, pp, rep (ledger: CPU, comm) */
  size_t comm_staging_bytes[3];
  ts_comm_memory pp_mem;          /* comm_mem with pp's staging */
  ts_comm_memory rep_mem;         /* comm_mem with rep's staging (hybrid sharding) */
  ts_kctx comm_ctx;               /* nccl: the communication stream's context (its sums) */
  ts_comm_nccl_streams nccl;      /* nccl: the streams lent to dp with comm_mem */
};

/* The device copy and addition comm's one-rank group uses on the
 * engine's buffers (comm.h ts_comm_memory), on the engine's stream. */
static ts_status device_copy(void *user, void *dst, const void *src, size_t nbytes) {
  return ts_k_copy(&((ts_engine *)user)->ctx, dst, src, nbytes);
}

static ts_status device_add(void *user, void *out, const void *a, const void *b, size_t count,
                            ts_dtype dt) {
  return ts_k_add(&((ts_engine *)user)->ctx, out, a, b, count, dt);
}

/* The staged transport's copies (comm.h): on the engine's stream, each
 * returning once done (ts_k_to_host, ts_k_from_host), so sync has nothing
 * left to wait for. */
static ts_status device_to_host(void *user, void *h_dst, const void *src, size_t nbytes) {
  return ts_k_to_host(&((ts_engine *)user)->ctx, h_dst, src, nbytes);
}

static ts_status device_to_device(void *user, void *dst, const void *h_src, size_t nbytes) {
  return ts_k_from_host(&((ts_engine *)user)->ctx, dst, h_src, nbytes);
}

static ts_status device_sync(void *user) { return TS_OK; }

/* The NCCL transport's sum (comm/nccl.h), on the communication stream. */
static ts_status device_sum_ranks(void *user, void *out, const void *const *parts, int n,
                                  size_t count, ts_dtype dt, int accumulate) {
  return ts_k_sum_ranks(&((ts_engine *)user)->lending->comm_ctx, out, parts, n, count, dt, accumulate);
}


/* Puts dp on NCCL: the communication stream's context, then the
 * communicator (collective over dp). A plan group keeps the memory only
 * (comm/nccl.h), and a plan context forks without a stream. */
static ts_status lend_nccl(ts_engine *e) {
  if (e->dp_size > TS_K_SUM_RANKS_MAX)
    return ts_set_error(TS_ERR_UNSUPPORTED,
                        "`comm` nccl: %d data-parallel ranks; its reduce-scatter sums at most %d "
                        "(ts_k_sum_ranks); use staged",
                        e->dp_size, TS_K_SUM_RANKS_MAX);
  /* a plan's fork has no stream; a failed fork is agreed, since the set-up
   * below is collective */
  TS_CHECK(ts_comm_agree(e->dp, ts_k_context_fork(&e->lending->comm_ctx, &e->ctx),
                         "making the communication stream", NULL));
  e->lending->nccl = (ts_comm_nccl_streams){.device = e->opts.device_index,
                                   .step_stream = e->ctx.stream,
                                   .comm_stream = e->lending->comm_ctx.stream,
                                   .user = e,
                                   .sum_ranks = device_sum_ranks};
  return ts_comm_set_nccl(e->dp, &e->lending->comm_mem, &e->lending->nccl);
}

/* Allocates and page-locks host staging for a group of n ranks. */
static ts_status alloc_staging(ts_engine *e, int n, size_t piece, void **out, size_t *bytes) {
  *bytes = ts_comm_staging_bytes(n, piece);
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_DEVICE_CPU, TS_MEM_COMM, *bytes, out));
  return ts_k_host_register(&e->ctx, *out, *bytes);
}

int ts_engine_dp_on_nccl(const ts_engine_opts *opts, int dp_size) {
  return ts_engine_comm_resolve(opts) == TS_ENGINE_COMM_NCCL && opts->device != TS_DEVICE_CPU &&
         (dp_size > 1 || opts->comm == TS_ENGINE_COMM_NCCL);
}

ts_status ts_engine_lend_memory(ts_engine *e) {
  ts_engine_comm_kind kind = ts_engine_comm_resolve(&e->opts);
  int staged = kind == TS_ENGINE_COMM_STAGED;
  /* pp's sends are staged on nccl too (nccl.h: two sends, or two receives,
   * started first on both sides of one stream would deadlock) */
  int nccl = ts_engine_dp_on_nccl(&e->opts, e->dp_size);
  int lend_dp = e->device != TS_DEVICE_CPU || (staged && e->dp_size > 1);
  int lend_pp = (staged || kind == TS_ENGINE_COMM_NCCL) && e->pipe.pp;
  /* hybrid sharding's replicas: staged on nccl too (one blocking
   * all-reduce of each shard per step, through host copies of its own) */
  int lend_rep = e->rep && (e->device != TS_DEVICE_CPU || staged);
  if (!lend_dp && !lend_pp && !lend_rep) return TS_OK;
  if (!e->lending) e->lending = (struct ts_engine_lending *)calloc(1, sizeof *e->lending);
  if (!e->lending) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "engine: lending its memory");
  size_t piece = e->opts.comm_chunk_bytes ? e->opts.comm_chunk_bytes : (size_t)1 << 20;
  e->lending->comm_mem = (ts_comm_memory){.user = e,
                                 .copy = device_copy,
                                 .add = device_add,
                                 .to_host = device_to_host,
                                 .to_device = device_to_device,
                                 .sync = device_sync};
  /* dp first: its NCCL set-up is collective, so no rank may leave before
   * it on a failure of its own (pp's staging) */
  if (lend_dp) {
    if (staged && e->dp_size > 1) {
      TS_CHECK(alloc_staging(e, e->dp_size, piece, &e->lending->comm_staging[0], &e->lending->comm_staging_bytes[0]));
      e->lending->comm_mem.staging = e->lending->comm_staging[0];
      e->lending->comm_mem.staging_bytes = e->lending->comm_staging_bytes[0];
    }
    if (nccl)
      TS_CHECK(lend_nccl(e));
    else
      TS_CHECK(ts_comm_set_memory(e->dp, &e->lending->comm_mem));
    e->lending->lent_dp = 1;
  }
  if (lend_pp) {
    /* pipeline groups send and receive (through host copies of their own)
     * and run no chunked collective: the smallest staging */
    e->lending->pp_mem = e->lending->comm_mem;
    TS_CHECK(alloc_staging(e, ts_comm_size(e->pipe.pp), TS_COMM_STAGING_MIN_PIECE, &e->lending->comm_staging[1],
                           &e->lending->comm_staging_bytes[1]));
    e->lending->pp_mem.staging = e->lending->comm_staging[1];
    e->lending->pp_mem.staging_bytes = e->lending->comm_staging_bytes[1];
    TS_CHECK(ts_comm_set_memory(e->pipe.pp, &e->lending->pp_mem));
    e->lending->lent_pp = 1;
  }
  if (lend_rep) {
    e->lending->rep_mem = e->lending->comm_mem;
    TS_CHECK(alloc_staging(e, e->replicas, piece, &e->lending->comm_staging[2], &e->lending->comm_staging_bytes[2]));
    e->lending->rep_mem.staging = e->lending->comm_staging[2];
    e->lending->rep_mem.staging_bytes = e->lending->comm_staging_bytes[2];
    TS_CHECK(ts_comm_set_memory(e->rep, &e->lending->rep_mem));
    e->lending->lent_rep = 1;
  }
  return TS_OK;
}

void ts_engine_unlend_memory(ts_engine *e) {
  if (!e->lending) return;
  if (e->lending->lent_dp) ts_comm_set_memory(e->dp, NULL);
  if (e->lending->lent_pp) ts_comm_set_memory(e->pipe.pp, NULL);
  if (e->lending->lent_rep) ts_comm_set_memory(e->rep, NULL);
  e->lending->lent_dp = e->lending->lent_pp = e->lending->lent_rep = 0;
  ts_k_context_destroy(&e->lending->comm_ctx); /* after dp left NCCL; a zeroed one: no-op */
  memset(&e->lending->comm_ctx, 0, sizeof e->lending->comm_ctx);
  for (int g = 0; g < 3; g++) {
    if (!e->lending->comm_staging[g]) continue;
    ts_k_host_unregister(&e->ctx, e->lending->comm_staging[g]);
    ts_ledger_free(&e->ledger, e->lending->comm_staging[g]);
    e->lending->comm_staging[g] = NULL;
  }
  free(e->lending);
  e->lending = NULL;
}

int ts_engine_dp_lent(const ts_engine *e) { return e->lending && e->lending->lent_dp; }

void ts_engine_lending_sync(ts_engine *e) {
  if (e->lending && e->lending->comm_ctx.stream) ts_k_synchronize(&e->lending->comm_ctx);
}

ts_status ts_engine_prepare_device(ts_engine *e) {
  e->ctx.flags |= TS_K_INDICES_CHECKED; /* ts_engine_load_batch checks them on the host */
  if (e->opts.allow_tf32) e->ctx.flags |= TS_K_ALLOW_TF32;
  if (e->opts.plain_attention) e->ctx.flags |= TS_K_PLAIN_ATTENTION;
  ts_device_report *r = &e->report;
  size_t free_bytes, total;
  r->index = e->opts.device_index;
  TS_CHECK(ts_k_device_memory(e->device, r->index, &free_bytes, &total, r->name, sizeof r->name));
  r->total = total;
  r->used_at_create = total - free_bytes;
  ts_engine *pe;
  TS_CHECK(ts_engine_plan_engine(e->model, &e->opts, (size_t)e->dp_size * (size_t)e->replicas,
                                 e->pipe.stage, &pe));
  ts_mem_account plan = *ts_ledger_account(&pe->ledger, e->device);
  /* What the card will hold: the plan's other blocks at their peak plus
   * every transient reserved below (more than the plan's peak, which
   * counts only the transients in use at that moment). */
  size_t need = ts_ledger_reserved_peak(&pe->ledger, e->device);
  if (need < plan.peak_total) need = plan.peak_total;
  ts_status st = TS_OK;
  if (need > free_bytes) {
    char parts[512];
    size_t n = 0;
    for (int c = 0; c < TS_MEM_NUM_CATEGORIES && n < sizeof parts; c++)
      n += (size_t)snprintf(parts + n, sizeof parts - n, "%s%s %.2f GiB", c ? ", " : "",
                            ts_mem_category_name((ts_mem_category)c),
                            (double)plan.peak[c] / (1u << 30));
    st = ts_set_error(
        TS_ERR_OUT_OF_MEMORY,
        "%s:%d (%s) has %.2f GiB free; this run needs %.2f GiB (plan peaks: %s; "
        "with the step's transients reserved): raise `zero_stage`, lower `micro_batch`, "
        "set `recompute_every` or use more ranks",
        ts_device_name(e->device), r->index, r->name, (double)free_bytes / (1u << 30),
        (double)need / (1u << 30), parts);
  }
  /* The step's transients (ZeRO-2/3's full gradients, ZeRO-3's gathers),
   * allocated now as many at once as the plan's step holds them, so that
   * the step itself allocates nothing. */
  if (st == TS_OK) st = ts_ledger_reserve_transients(&e->ledger, &pe->ledger);
  ts_engine_free(pe);
  return st;
}

ts_status ts_engine_device_report(const ts_engine *e, ts_device_report *out) {
  *out = e->report;
  if (e->device == TS_DEVICE_CPU) {
    snprintf(out->name, sizeof out->name, "cpu");
    return TS_OK;
  }
  size_t free_bytes, total;
  TS_CHECK(ts_k_device_memory(e->device, out->index, &free_bytes, &total, NULL, 0));
  out->used_now = total - free_bytes;
  out->reserved = ts_ledger_cached_bytes(&e->ledger, e->device);
  size_t ledger = ts_ledger_account(&e->ledger, e->device)->current_total + out->reserved;
  out->overhead = out->used_now > ledger ? out->used_now - ledger : 0;
  return TS_OK;
}
