/*
 * nccl.c — the NCCL transport (nccl.h): a backend (backend.h) wrapped
 * around a group's MPI (or one-rank) transport, as staged.c is. The front
 * checks and counts every call; this file turns the call into byte
 * transfers of NCCL on the communication stream and, for a reduce-scatter,
 * one rank-order sum on the same stream.
 *
 * Invariants:
 * - NCCL never adds: every transfer is ncclUint8 bytes, so the only
 *   arithmetic is the lender's sum_ranks (comm/sum.h's order, fp32, one
 *   rounding): the bits are those of the same call on host memory.
 * - A data call is queued as: the step stream's `ready` event recorded and
 *   waited for by the communication stream (so the call reads what the
 *   compute wrote before it), the transfers, the sum, and a `done` event
 *   of its own recorded after them. Waiting is cudaStreamWaitEvent on the
 *   step stream; nothing here blocks the host on the GPU but unwrap and
 *   free, which synchronise the communication stream before destroying.
 * - Every rank derives the same transfers from the same call (sizes from
 *   count and N; pieces of zero bytes are skipped on both sides), so the
 *   ranks' NCCL calls match. Calls run in submission order on one stream.
 * - barrier and all_reduce_f64 carry host memory and no lent data: they go
 *   to the inner transport as they are.
 */
#include "comm/nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/backend.h"

/* An NCCL group's state (ts_comm.impl). */
typedef struct nccl_state {
  ts_comm inner;                /* the group on its MPI or one-rank transport */
  ncclComm_t comm;              /* one communicator per group */
  ts_comm_nccl_streams streams; /* copied at wrap */
  cudaEvent_t ready;            /* recorded on the step stream at every data call */
  cudaEvent_t blocking_done;    /* a blocking call's end on the communication stream */
  const void **parts;           /* (size,) a reduce-scatter's pieces, in rank order */
} nccl_state;

/* A started call: its done event on the communication stream, made at the
 * request's first use and kept with it in the group's pool. */
typedef struct nccl_request {
  ts_comm_request base; /* first member (backend.h) */
  cudaEvent_t done;
} nccl_request;

static cudaStream_t step_of(const nccl_state *s) { return (cudaStream_t)s->streams.step_stream; }
static cudaStream_t comm_of(const nccl_state *s) { return (cudaStream_t)s->streams.comm_stream; }

/* TS_ERR_CUDA naming op and the CUDA call, or TS_OK. */
static ts_status cuda_st(cudaError_t e, const char *op, const char *what) {
  if (e == cudaSuccess) return TS_OK;
  cudaGetLastError(); /* clear it so the next check does not report it again */
  return ts_set_error(TS_ERR_CUDA, "%s (nccl): %s: %s", op, what, cudaGetErrorString(e));
}

/* TS_ERR_NCCL naming op, the NCCL call and NCCL's messages (those of
 * communicator comm, NULL for none yet), or TS_OK. */
static ts_status nccl_st(ncclResult_t r, ncclComm_t comm, const ts_comm *c, const char *op,
                         const char *what) {
  if (r == ncclSuccess) return TS_OK;
  const char *last = ncclGetLastError(comm);
  return ts_set_error(TS_ERR_NCCL, "%s: %s on group %s (rank %d of %d): %s%s%s", op, what,
                      c ? c->name : "?", c ? c->rank : -1, c ? c->size : 0, ncclGetErrorString(r),
                      last && *last ? ": " : "", last && *last ? last : "");
}

#define CU(call, what) TS_CHECK(cuda_st((call), d->name, (what)))
#define NC(call, what) TS_CHECK(nccl_st((call), s->comm, c, d->name, (what)))

/* ---- transfers ------------------------------------------------------------------ */

/* Rank j's element range of the call: [lo, lo + n) of count elements per
 * rank (even) or of the whole buffer's chunk j (uneven). */
static void piece_of(const ts_comm *c, const ts_comm_call *d, int j, size_t *lo, size_t *n) {
  if (d->uneven) {
    *lo = ts_comm_chunk_lo(d->count, c->size, j);
    *n = ts_comm_chunk_lo(d->count, c->size, j + 1) - *lo;
  } else {
    *lo = (size_t)j * d->count;
    *n = d->count;
  }
}

/* Reduce-scatter: rank j's piece of send goes to rank j (a grouped
 * all-to-all; the own piece stays), the N-1 pieces received land in
 * scratch, slot k for the k-th other rank, each slot the longest piece;
 * then recv = the pieces in rank order (the own one from send) [+ recv]. */
static ts_status run_reduce_scatter(ts_comm *c, nccl_state *s, const ts_comm_call *d) {
  size_t es = ts_dtype_size(d->dt), lo, n;
  size_t slot = d->uneven ? ts_comm_chunk_max(d->count, c->size) : d->count;
  piece_of(c, d, c->rank, &lo, &n);
  if (n == 0) return TS_OK; /* my piece is empty: I only send (below) */
  const void **parts = s->parts;
  for (int j = 0, k = 0; j < c->size; j++)
    parts[j] = j == c->rank ? (const char *)d->send + lo * es
                            : (const char *)d->scratch + (size_t)(k++) * slot * es;
  return s->streams.sum_ranks(s->streams.user, d->recv, parts, c->size, n, d->dt, d->accumulate);
}

/* The all-to-all of a reduce-scatter: sends of every other rank's piece of
 * send, receives of my piece from every other rank into scratch. */
static ts_status exchange_pieces(ts_comm *c, nccl_state *s, const ts_comm_call *d) {
  size_t es = ts_dtype_size(d->dt), lo, n, mine_lo, mine;
  size_t slot = d->uneven ? ts_comm_chunk_max(d->count, c->size) : d->count;
  piece_of(c, d, c->rank, &mine_lo, &mine);
  NC(ncclGroupStart(), "ncclGroupStart");
  ncclResult_t r = ncclSuccess;
  for (int j = 0, k = 0; j < c->size && r == ncclSuccess; j++) {
    if (j == c->rank) continue;
    piece_of(c, d, j, &lo, &n);
    if (n) r = ncclSend((const char *)d->send + lo * es, n * es, ncclUint8, j, s->comm, comm_of(s));
    if (r == ncclSuccess && mine)
      r = ncclRecv((char *)d->scratch + (size_t)k * slot * es, mine * es, ncclUint8, j, s->comm,
                   comm_of(s));
    k++;
  }
  ncclResult_t end = ncclGroupEnd();
  NC(r, "ncclSend/ncclRecv");
  NC(end, "ncclGroupEnd");
  return TS_OK;
}

/* All-gather: equal pieces through ncclAllGather (in place when send is the
 * own piece of recv); uneven ones (all-reduce's second half, in place) as
 * a grouped exchange of the own chunk with every other rank. */
static ts_status run_all_gather(ts_comm *c, nccl_state *s, const ts_comm_call *d) {
  size_t es = ts_dtype_size(d->dt);
  if (!d->uneven) {
    if (d->count == 0) return TS_OK;
    NC(ncclAllGather(d->send, d->recv, d->count * es, ncclUint8, s->comm, comm_of(s)),
       "ncclAllGather");
    return TS_OK;
  }
  size_t mine_lo, mine, lo, n;
  piece_of(c, d, c->rank, &mine_lo, &mine);
  NC(ncclGroupStart(), "ncclGroupStart");
  ncclResult_t r = ncclSuccess;
  for (int j = 0; j < c->size && r == ncclSuccess; j++) {
    if (j == c->rank) continue;
    piece_of(c, d, j, &lo, &n);
    if (mine) r = ncclSend(d->send, mine * es, ncclUint8, j, s->comm, comm_of(s));
    if (r == ncclSuccess && n)
      r = ncclRecv((char *)d->recv + lo * es, n * es, ncclUint8, j, s->comm, comm_of(s));
  }
  ncclResult_t end = ncclGroupEnd();
  NC(r, "ncclSend/ncclRecv");
  NC(end, "ncclGroupEnd");
  return TS_OK;
}

/* Queues call d's transfers (and sum) on the communication stream. */
static ts_status queue_call(ts_comm *c, nccl_state *s, const ts_comm_call *d) {
  size_t nb = d->count * ts_dtype_size(d->dt);
  switch (d->kind) {
    case TS_COMM_CALL_REDUCE_SCATTER:
      if (c->size > 1) TS_CHECK(exchange_pieces(c, s, d));
      return run_reduce_scatter(c, s, d);
    case TS_COMM_CALL_ALL_GATHER: return run_all_gather(c, s, d);
    case TS_COMM_CALL_BROADCAST:
      if (nb)
        NC(ncclBroadcast(d->buf, d->buf, nb, ncclUint8, d->root, s->comm, comm_of(s)),
           "ncclBroadcast");
      return TS_OK;
    case TS_COMM_CALL_SEND:
      if (nb) NC(ncclSend(d->buf, nb, ncclUint8, d->peer, s->comm, comm_of(s)), "ncclSend");
      return TS_OK;
    case TS_COMM_CALL_RECV:
      if (nb) NC(ncclRecv(d->buf, nb, ncclUint8, d->peer, s->comm, comm_of(s)), "ncclRecv");
      return TS_OK;
    default:
      return ts_set_error(TS_ERR_INTERNAL, "%s: call kind %d reached the NCCL transport", d->name,
                          (int)d->kind);
  }
}

static ts_status nccl_run(ts_comm *c, const ts_comm_call *d, ts_comm_request **req) {
  nccl_state *s = (nccl_state *)c->impl;
  if (d->kind == TS_COMM_CALL_BARRIER || d->kind == TS_COMM_CALL_ALL_REDUCE_F64)
    return s->inner.be->run(&s->inner, d, req); /* host memory: the inner transport */
  CU(cudaEventRecord(s->ready, step_of(s)), "cudaEventRecord");
  CU(cudaStreamWaitEvent(comm_of(s), s->ready, 0), "cudaStreamWaitEvent");
  TS_CHECK(queue_call(c, s, d));
  if (!req) { /* blocking: later work on the step stream waits for the call */
    CU(cudaEventRecord(s->blocking_done, comm_of(s)), "cudaEventRecord");
    CU(cudaStreamWaitEvent(step_of(s), s->blocking_done, 0), "cudaStreamWaitEvent");
    return TS_OK;
  }
  ts_comm_request *r = NULL;
  TS_CHECK(ts_comm_request_new(c, d->name, sizeof(nccl_request), &r));
  nccl_request *q = (nccl_request *)r;
  ts_status st = TS_OK;
  if (!q->done) /* a new request; a pooled one has its event */
    st = cuda_st(cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming), d->name,
                 "cudaEventCreateWithFlags");
  if (st == TS_OK) st = cuda_st(cudaEventRecord(q->done, comm_of(s)), d->name, "cudaEventRecord");
  if (st != TS_OK) {
    ts_comm_request_release(r);
    return st;
  }
  *req = r;
  return TS_OK;
}

/* Destroys the event a pooled request keeps (backend.h drop_request);
 * destroying a recorded event is deferred until it completes. */
static void drop_request(ts_comm_request *req) {
  nccl_request *q = (nccl_request *)req;
  if (q->done) cudaEventDestroy(q->done);
}

/* Ends request q: NCCL's asynchronous error if any, then the event. */
static ts_status nccl_end(nccl_request *q, ts_status st) {
  ts_comm *c = q->base.c;
  nccl_state *s = (nccl_state *)c->impl;
  ncclResult_t async = ncclSuccess;
  if (st == TS_OK && ncclCommGetAsyncError(s->comm, &async) == ncclSuccess &&
      async != ncclSuccess && async != ncclInProgress)
    st = nccl_st(async, s->comm, c, q->base.op, "asynchronous error");
  ts_comm_request_release(&q->base); /* its event kept for the next call */
  return st;
}

static ts_status nccl_wait(ts_comm_request *req) {
  nccl_request *q = (nccl_request *)req;
  nccl_state *s = (nccl_state *)req->c->impl;
  return nccl_end(
      q, cuda_st(cudaStreamWaitEvent(step_of(s), q->done, 0), req->op, "cudaStreamWaitEvent"));
}

static ts_status nccl_test(ts_comm_request *req, int *done) {
  nccl_request *q = (nccl_request *)req;
  cudaError_t e = cudaEventQuery(q->done);
  *done = 0;
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return TS_OK;
  }
  *done = 1;
  if (e != cudaSuccess) return nccl_end(q, cuda_st(e, req->op, "cudaEventQuery"));
  return nccl_wait(req); /* finished: the step stream's wait costs nothing */
}

static ts_status nccl_split(ts_comm *parent, int color, int key, const char *name, ts_comm **out) {
  nccl_state *s = (nccl_state *)parent->impl;
  return s->inner.be->split(&s->inner, color, key, name, out);
}

/* Destroys the communicator and the event. In order (abort 0: every rank
 * of the group does it, as ncclCommFinalize needs) the communication
 * stream finishes first; on a failed set-up (abort 1: other ranks may not
 * follow) the communicator is aborted, a local call. */
static void release(nccl_state *s, int abort) {
  if (s->comm) {
    if (abort) {
      ncclCommAbort(s->comm);
    } else {
      cudaStreamSynchronize(comm_of(s));
      ncclCommFinalize(s->comm);
      ncclCommDestroy(s->comm);
    }
  }
  if (s->ready) cudaEventDestroy(s->ready);
  if (s->blocking_done) cudaEventDestroy(s->blocking_done);
  ts_comm_dealloc((void *)s->parts);
  s->parts = NULL;
  cudaGetLastError(); /* no error of teardown is left for the next launch check */
}

static void nccl_unwrap(ts_comm *c) {
  nccl_state *s = (nccl_state *)c->impl;
  release(s, 0);
  c->be = s->inner.be;
  c->impl = s->inner.impl;
  ts_comm_dealloc(s);
}

static void nccl_free_group(ts_comm *c) {
  nccl_state *s = (nccl_state *)c->impl;
  release(s, 0);
  s->inner.be->free_group(&s->inner);
  ts_comm_dealloc(s);
}

static const ts_comm_backend nccl_backend = {
    .name = "nccl",
    .caps = {.moves = 1, .device_memory = 1, .async = 1, .device_sums = 1},
    .run = nccl_run,
    .wait = nccl_wait,
    .test = nccl_test,
    .split = nccl_split,
    .free_group = nccl_free_group,
    .unwrap = nccl_unwrap,
    .drop_request = drop_request,
};

/* ---- making the communicator -------------------------------------------------------- */

/* What rank 0 broadcasts: whether it made the id, and the id. */
typedef struct id_message {
  double ok;
  ncclUniqueId id;
} id_message;

/* Makes s->comm over the inner group, every rank taking part whatever its
 * local status st (its GPU set up or not): the ranks agree on st, rank 0's
 * unique id is broadcast over the inner transport, ncclCommInitRank runs
 * on every rank, and the ranks agree on its success. On failure no rank
 * keeps a communicator (release aborts one that was made). The calls go
 * through comm's front on s->inner, a copy of the group whose counters are
 * dropped with it: set-up is not counted as the group's traffic. */
static ts_status make_comm(nccl_state *s, const char *op, ts_status st) {
  ts_comm *inner = &s->inner;
  TS_CHECK(ts_comm_agree(inner, st, "to set up its GPU for NCCL", NULL));
  id_message m;
  memset(&m, 0, sizeof m);
  if (inner->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&m.id);
    m.ok = r == ncclSuccess;
    if (r != ncclSuccess) st = nccl_st(r, NULL, inner, op, "ncclGetUniqueId");
  }
  /* bytes as bf16 pairs: a broadcast adds nothing */
  TS_CHECK(ts_comm_broadcast(inner, &m, sizeof m / 2, TS_BF16, 0));
  if (!m.ok) /* every rank returns here: the broadcast told them */
    return st != TS_OK
               ? st
               : ts_set_error(TS_ERR_NCCL, "%s: rank 0 of group %s could not make NCCL's unique id",
                              op, inner->name);
  if (st == TS_OK) {
    ncclResult_t r = ncclCommInitRank(&s->comm, inner->size, m.id, inner->rank);
    if (r != ncclSuccess) {
      s->comm = NULL;
      st = nccl_st(r, NULL, inner, op, "ncclCommInitRank");
    }
  }
  return ts_comm_agree(inner, st, "ncclCommInitRank", NULL);
}

ts_status ts_comm_set_nccl(ts_comm *c, const ts_comm_memory *mem,
                           const ts_comm_nccl_streams *streams) {
  static const char *op = "ts_comm_set_nccl";
  if (!c || !mem || !streams)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: c, mem and streams are required", op);
  if (!mem->copy || !mem->add || !streams->sum_ranks)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: group %s: mem needs copy and add, streams needs sum_ranks", op,
                        c->name);
  if (ts_comm_thread_active(c))
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "%s: group %s runs on a communication thread; the NCCL transport needs "
                        "none (its stream is the overlap)",
                        op, c->name);
  if (c->mem && c->mem != mem)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "%s: group %s already moves memory lent by another owner; lend it NULL "
                        "first",
                        op, c->name);
  if (c->be->unwrap) c->be->unwrap(c);
  c->mem = NULL;
  if (!c->be->caps.moves) { /* a plan moves nothing */
    c->mem = mem;
    return TS_OK;
  }
  /* NCCL bootstraps over the group's host transport: MPI, or one rank's */
  if (c->be->caps.device_memory || c->be->caps.async)
    return ts_set_error(TS_ERR_UNSUPPORTED, "%s: group %s is on the %s transport", op, c->name,
                        c->be->name);
  if (!streams->step_stream || !streams->comm_stream)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: group %s: streams needs step_stream and comm_stream", op, c->name);
  nccl_state *s = (nccl_state *)ts_comm_alloc(sizeof *s, 1);
  const void **parts = (const void **)ts_comm_alloc((size_t)c->size * sizeof *parts, 1);
  if (!s || !parts) {
    ts_comm_dealloc(s);
    ts_comm_dealloc((void *)parts);
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot allocate the NCCL state", op);
  }
  s->inner = *c;
  s->parts = parts;
  s->streams = *streams;
  ts_status st = cuda_st(cudaSetDevice(streams->device), op, "cudaSetDevice");
  if (st == TS_OK)
    st = cuda_st(cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming), op,
                 "cudaEventCreateWithFlags");
  if (st == TS_OK)
    st = cuda_st(cudaEventCreateWithFlags(&s->blocking_done, cudaEventDisableTiming), op,
                 "cudaEventCreateWithFlags");
  st = make_comm(s, op, st); /* collective: every rank, whatever st */
  if (st != TS_OK) {
    release(s, 1);
    ts_comm_dealloc(s);
    return st;
  }
  c->be = &nccl_backend;
  c->impl = s;
  c->mem = mem;
  return TS_OK;
}

const char *ts_comm_nccl_version(void) {
  static char v[32];
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "?";
  /* NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z from 2.9 on */
  snprintf(v, sizeof v, "%d.%d.%d", code / 10000, code / 100 % 100, code % 100);
  return v;
}
