/*
 * staged.c — the host-staged transport (DESIGN.md "GPU"): collectives and
 * point-to-point calls of a group of two or more ranks whose data lives in
 * lent memory (ts_comm_set_memory: a GPU's), moved device -> host staging
 * -> MPI -> device. It is a backend (backend.h) wrapped around the group's
 * MPI one, as thread.c is: the front checks and counts every call, then
 * this file copies the call's data through host memory and hands the host
 * copy to MPI, whose sums (comm/sum.h, rank order, fp32) make every bit.
 * So a staged call gives the bits of the same call on host memory, at every
 * chunk size: each element is summed alone, in rank order.
 *
 * Invariants:
 * - A collective moves in chunks of its elements, through two halves
 *   ("slots") of the lender's staging: chunk k+1 is copied to the host
 *   after MPI's chunk k is started and before it is waited for, and chunk k
 *   is copied back after that wait (the lender's copies may return before
 *   they finish; sync waits for them). That order lets the copies overlap
 *   MPI where the lender's copies are asynchronous and MPI progresses by
 *   itself; the engine's copies (engine/device.c) return once done, and
 *   MPI over shared memory moves mostly inside its start and wait, so
 *   there a staged call costs about its copies plus MPI's time, not the
 *   larger of the two. Each rank's part of a chunk is `piece` elements; a reduce-scatter
 *   slot holds the N parts sent, the part received (the previous recv when
 *   accumulating) and the N-1 parts MPI receives: 2N pieces; an all-gather
 *   slot N pieces; a broadcast one piece of N.
 * - Every rank derives the same chunks from the same count, dtype and
 *   staging size (ts_comm_set_memory checks the size's lower bound; the
 *   engine lends every rank the same size), so the ranks' MPI calls match.
 * - The device scratch a reduce-scatter is given is not touched (the
 *   scratch is host memory in the slot).
 * - All-reduce's uneven halves and point-to-point calls stage the whole
 *   buffer through host memory of their own (the group's for the halves, a
 *   request's for a send or receive, which keeps its copy until its wait),
 *   kept and grown, never freed inside a step; all_reduce_f64 and barrier
 *   carry no lent data and go to MPI as they are.
 * - Collectives run to completion in run (on the communication thread when
 *   the group has one); sends and receives are started and completed by
 *   wait or test, so a receive never blocks a send started after it.
 */
#include <stdlib.h>
#include <string.h>

#include "comm/backend.h"

/* A staged group's state (ts_comm.impl). */
typedef struct staged_state {
  ts_comm inner; /* the group on its transport (MPI): backend, state, rank, size, name */
  char *slot[2]; /* the two halves of the lender's staging */
  size_t slot_bytes;
  char *whole;       /* all-reduce's halves: the whole buffer's host copy, kept and grown
                        (whole_cap bytes); the group's collectives run one at a time */
  size_t whole_cap;
  struct host_copy {  /* sends' and receives' host copies, kept for the next step's */
    char *p;
    size_t cap;       /* bytes at p */
    int used;         /* 1 while a request holds it */
  } copies[32];
  int ncopies;
} staged_state;

/* A request of this backend. Collectives are finished in run (inner NULL,
 * host NULL); a send or receive holds MPI's request and its host copy. */
typedef struct staged_request {
  ts_comm_request base;   /* first member (backend.h) */
  ts_comm_request *inner; /* MPI's request of the send or receive; NULL once finished */
  struct host_copy *copy; /* a send's or receive's host copy (the group's), else NULL */
  void *dev;              /* a receive: where the data goes once in */
  size_t nbytes;
} staged_request;

/* A host copy of nbytes for a send or receive: the smallest free one of
 * the group's that holds it, else a new one (the same sends and receives
 * in flight each step find theirs again: no allocation after the first
 * step). TS_ERR_OUT_OF_MEMORY, also past 32 in flight. */
static ts_status copy_take(staged_state *s, size_t nbytes, const char *op, struct host_copy **out) {
  struct host_copy *best = NULL;
  for (int i = 0; i < s->ncopies; i++) {
    struct host_copy *h = &s->copies[i];
    if (!h->used && h->cap >= nbytes && (!best || h->cap < best->cap)) best = h;
  }
  if (!best) {
    if (s->ncopies == (int)(sizeof s->copies / sizeof s->copies[0]))
      return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: more than %d staged sends and receives in "
                          "flight", op, s->ncopies);
    char *p = (char *)ts_comm_alloc(nbytes + 1, 0);
    if (!p) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot stage %zu bytes", op, nbytes);
    best = &s->copies[s->ncopies++];
    best->p = p;
    best->cap = nbytes + 1;
  }
  best->used = 1;
  *out = best;
  return TS_OK;
}

/* Gives q back to its group's pool, its host copy back to the group's. */
static void request_release(staged_request *q) {
  if (q->copy) q->copy->used = 0;
  q->copy = NULL;
  q->inner = NULL;
  q->dev = NULL;
  q->nbytes = 0;
  ts_comm_request_release(&q->base);
}

/* Frees the group's host copies (the state itself is the caller's). */
static void copies_free(staged_state *s) {
  for (int i = 0; i < s->ncopies; i++) ts_comm_dealloc(s->copies[i].p);
  s->ncopies = 0;
}

static const ts_comm_memory *mem_of(const ts_comm *c) { return c->mem; }

/* ---- collectives in chunks ------------------------------------------------------ */

/* One chunk: elements [a, a + n) of each rank's part of a call. */
typedef struct chunk {
  size_t a, n;
} chunk;

/* Copies chunk k of call d into host slot h (lent -> host), as the call's
 * kind lays it out (the header comment). */
static ts_status stage_in(const ts_comm *c, const ts_comm_call *d, chunk k, char *h) {
  const ts_comm_memory *m = mem_of(c);
  size_t es = ts_dtype_size(d->dt), nb = k.n * es, N = (size_t)c->size;
  if (nb == 0) return TS_OK;
  switch (d->kind) {
    case TS_COMM_CALL_REDUCE_SCATTER:
      for (size_t j = 0; j < N; j++)
        TS_CHECK(
            m->to_host(m->user, h + j * nb, (const char *)d->send + (j * d->count + k.a) * es, nb));
      if (d->accumulate)
        TS_CHECK(m->to_host(m->user, h + N * nb, (const char *)d->recv + k.a * es, nb));
      return TS_OK;
    case TS_COMM_CALL_ALL_GATHER:
      return m->to_host(m->user, h + (size_t)c->rank * nb, (const char *)d->send + k.a * es, nb);
    case TS_COMM_CALL_BROADCAST:
      if (c->rank != d->root) return TS_OK;
      return m->to_host(m->user, h, (const char *)d->buf + k.a * es, nb);
    default: return ts_set_error(TS_ERR_INTERNAL, "%s: call kind %d staged", d->name, (int)d->kind);
  }
}

/* Copies chunk k of call d's result from host slot h to where it belongs. */
static ts_status stage_out(const ts_comm *c, const ts_comm_call *d, chunk k, const char *h) {
  const ts_comm_memory *m = mem_of(c);
  size_t es = ts_dtype_size(d->dt), nb = k.n * es, N = (size_t)c->size;
  if (nb == 0) return TS_OK;
  switch (d->kind) {
    case TS_COMM_CALL_REDUCE_SCATTER:
      return m->to_device(m->user, (char *)d->recv + k.a * es, h + N * nb, nb);
    case TS_COMM_CALL_ALL_GATHER:
      for (size_t j = 0; j < N; j++)
        TS_CHECK(
            m->to_device(m->user, (char *)d->recv + (j * d->count + k.a) * es, h + j * nb, nb));
      return TS_OK;
    case TS_COMM_CALL_BROADCAST:
      if (c->rank == d->root) return TS_OK;
      return m->to_device(m->user, (char *)d->buf + k.a * es, h, nb);
    default: return ts_set_error(TS_ERR_INTERNAL, "%s: call kind %d staged", d->name, (int)d->kind);
  }
}

/* Starts chunk k of call d on host slot h with MPI (non-blocking). */
static ts_status start_piece(staged_state *s, const ts_comm_call *d, chunk k, char *h,
                             ts_comm_request **req) {
  size_t es = ts_dtype_size(d->dt), nb = k.n * es, N = (size_t)s->inner.size;
  ts_comm_call p = *d;
  p.count = k.n;
  p.blocking = 0;
  p.in_place = 0;
  switch (d->kind) {
    case TS_COMM_CALL_REDUCE_SCATTER:
      p.send = h;
      p.recv = h + N * nb;
      p.scratch = h + (N + 1) * nb;
      p.scratch_bytes = (N - 1) * nb;
      break;
    case TS_COMM_CALL_ALL_GATHER:
      p.recv = h;
      p.send = h + (size_t)s->inner.rank * nb;
      p.in_place = 1;
      break;
    default: /* broadcast */ p.buf = h; break;
  }
  return s->inner.be->run(&s->inner, &p, req);
}

/* Pieces a slot holds per chunk for call kind d (the header comment). */
static size_t pieces_per_slot(const ts_comm_call *d, size_t N) {
  if (d->kind == TS_COMM_CALL_REDUCE_SCATTER) return 2 * N;
  if (d->kind == TS_COMM_CALL_ALL_GATHER) return N;
  return 1;
}

/* Runs collective d to completion in chunks through the two slots. */
static ts_status run_chunked(ts_comm *c, staged_state *s, const ts_comm_call *d) {
  const ts_comm_memory *m = mem_of(c);
  size_t es = ts_dtype_size(d->dt);
  size_t piece = s->slot_bytes / pieces_per_slot(d, (size_t)c->size) / es; /* >= 1: set_memory */
  size_t nchunks = d->count == 0 ? 1 : (d->count + piece - 1) / piece;
  chunk k = {0, d->count < piece ? d->count : piece};
  TS_CHECK(stage_in(c, d, k, s->slot[0]));
  TS_CHECK(m->sync(m->user));
  for (size_t i = 0; i < nchunks; i++) {
    char *h = s->slot[i % 2];
    ts_comm_request *q = NULL;
    TS_CHECK(start_piece(s, d, k, h, &q));
    chunk next = {k.a + k.n, 0};
    ts_status st = TS_OK;
    if (i + 1 < nchunks) {
      next.n = d->count - next.a < piece ? d->count - next.a : piece;
      st = stage_in(c, d, next, s->slot[(i + 1) % 2]); /* beside MPI's chunk i */
    }
    ts_status sw = s->inner.be->wait(q);
    if (st == TS_OK) st = sw;
    if (st == TS_OK) st = stage_out(c, d, k, h);
    /* chunk i+1 is in its slot, and chunk i out of this one (free for i+2) */
    if (st == TS_OK) st = m->sync(m->user);
    TS_CHECK(st);
    k = next;
  }
  return TS_OK;
}

/* All-reduce's halves (uneven chunks of count, backend.h): the whole
 * buffer through a host copy of its own. */
static ts_status run_uneven(ts_comm *c, staged_state *s, const ts_comm_call *d) {
  const ts_comm_memory *m = mem_of(c);
  size_t es = ts_dtype_size(d->dt), nb = d->count * es;
  size_t lo = ts_comm_chunk_lo(d->count, c->size, c->rank) * es;
  size_t own = ts_comm_chunk_lo(d->count, c->size, c->rank + 1) * es - lo;
  size_t scratch = (size_t)(c->size - 1) * ts_comm_chunk_max(d->count, c->size) * es;
  int rs = d->kind == TS_COMM_CALL_REDUCE_SCATTER;
  const char *whole = rs ? (const char *)d->send : (const char *)d->recv;
  size_t need = nb + (rs ? scratch : 0) + 1;
  if (s->whole_cap < need) { /* grown once: the same call next step allocates nothing */
    char *h = (char *)ts_comm_realloc(s->whole, need);
    if (!h) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot stage %zu bytes", d->name, nb);
    s->whole = h;
    s->whole_cap = need;
  }
  char *h = s->whole;
  ts_status st = nb ? m->to_host(m->user, h, whole, nb) : TS_OK;
  if (st == TS_OK) st = m->sync(m->user);
  ts_comm_call p = *d;
  p.blocking = 1;
  if (rs) {
    p.send = h;
    p.recv = h + lo;
    p.scratch = h + nb;
    p.scratch_bytes = scratch;
  } else {
    p.recv = h;
    p.send = h + lo;
  }
  if (st == TS_OK) st = s->inner.be->run(&s->inner, &p, NULL);
  if (st == TS_OK && nb) {
    if (rs)
      st = own ? m->to_device(m->user, (char *)d->recv, h + lo, own) : TS_OK;
    else
      st = m->to_device(m->user, d->recv, h, nb);
  }
  if (st == TS_OK) st = m->sync(m->user);
  return st;
}

/* ---- point to point --------------------------------------------------------------- */

/* Finishes a send or receive whose MPI request is complete: a receive's
 * data goes to lent memory. */
static ts_status p2p_finish(ts_comm *c, staged_request *q) {
  const ts_comm_memory *m = mem_of(c);
  ts_status st = TS_OK;
  if (q->dev && q->nbytes) {
    st = m->to_device(m->user, q->dev, q->copy->p, q->nbytes);
    if (st == TS_OK) st = m->sync(m->user);
  }
  return st;
}

/* Starts (or, blocking, runs) send or receive d through a host copy. */
static ts_status run_p2p(ts_comm *c, staged_state *s, const ts_comm_call *d,
                         ts_comm_request **req) {
  const ts_comm_memory *m = mem_of(c);
  staged_request *q = NULL;
  ts_comm_request *r = NULL;
  TS_CHECK(ts_comm_request_new(c, d->name, sizeof *q, &r));
  q = (staged_request *)r;
  q->nbytes = d->count * ts_dtype_size(d->dt);
  ts_status sc = copy_take(s, q->nbytes, d->name, &q->copy);
  if (sc != TS_OK) {
    request_release(q);
    return sc;
  }
  ts_status st = TS_OK;
  if (d->kind == TS_COMM_CALL_SEND) {
    if (q->nbytes) st = m->to_host(m->user, q->copy->p, d->buf, q->nbytes);
    if (st == TS_OK) st = m->sync(m->user);
  } else {
    q->dev = d->buf;
  }
  ts_comm_call p = *d;
  p.buf = q->copy->p;
  if (st == TS_OK) st = s->inner.be->run(&s->inner, &p, req ? &q->inner : NULL);
  if (st == TS_OK && !req) st = p2p_finish(c, q);
  if (st != TS_OK || !req) {
    request_release(q);
    return st;
  }
  *req = r;
  return TS_OK;
}

/* ---- the table ------------------------------------------------------------------------ */

static ts_status staged_run(ts_comm *c, const ts_comm_call *d, ts_comm_request **req) {
  staged_state *s = (staged_state *)c->impl;
  switch (d->kind) {
    case TS_COMM_CALL_BARRIER:
    case TS_COMM_CALL_ALL_REDUCE_F64: return s->inner.be->run(&s->inner, d, req);
    case TS_COMM_CALL_SEND:
    case TS_COMM_CALL_RECV: return run_p2p(c, s, d, req);
    default: break;
  }
  TS_CHECK(d->uneven ? run_uneven(c, s, d) : run_chunked(c, s, d));
  if (!req) return TS_OK;
  /* finished: the request only has to be freed, and the front times the start */
  TS_CHECK(ts_comm_request_new(c, d->name, sizeof(staged_request), req));
  (*req)->done_in_start = 1;
  return TS_OK;
}

/* Ends request q whose MPI part (if any) has completed with status st: a
 * receive's data goes to lent memory (p2p_finish; nothing for a finished
 * collective), then q is freed. */
static ts_status staged_end(staged_request *q, ts_status st) {
  q->inner = NULL;
  ts_status sf = p2p_finish(q->base.c, q);
  request_release(q);
  return st != TS_OK ? st : sf;
}

static ts_status staged_wait(ts_comm_request *req) {
  staged_request *q = (staged_request *)req;
  staged_state *s = (staged_state *)req->c->impl;
  return staged_end(q, q->inner ? s->inner.be->wait(q->inner) : TS_OK);
}

static ts_status staged_test(ts_comm_request *req, int *done) {
  staged_request *q = (staged_request *)req;
  staged_state *s = (staged_state *)req->c->impl;
  ts_status st = TS_OK;
  *done = 0;
  if (q->inner) {
    if (!s->inner.be->test) return TS_OK; /* wait completes it */
    int inner_done = 0;
    st = s->inner.be->test(q->inner, &inner_done); /* frees it when done, even on error */
    if (!inner_done && st == TS_OK) return TS_OK;
  }
  *done = 1;
  return staged_end(q, st);
}

static ts_status staged_split(ts_comm *parent, int color, int key, const char *name,
                              ts_comm **out) {
  staged_state *s = (staged_state *)parent->impl;
  return s->inner.be->split(&s->inner, color, key, name, out);
}

static void staged_free_group(ts_comm *c) {
  staged_state *s = (staged_state *)c->impl;
  s->inner.be->free_group(&s->inner);
  copies_free(s);
  ts_comm_dealloc(s->whole);
  ts_comm_dealloc(s);
}

const ts_comm_backend ts_comm_staged_backend = {
    .name = "staged",
    .caps = {.moves = 1, .device_memory = 1},
    .run = staged_run,
    .wait = staged_wait,
    .test = staged_test,
    .split = staged_split,
    .free_group = staged_free_group,
    .unwrap = ts_comm_staged_unwrap,
    .request_bytes = sizeof(staged_request),
};

size_t ts_comm_staging_bytes(int ranks, size_t piece_bytes) {
  if (ranks < 1) ranks = 1;
  return 2 * 2 * (size_t)ranks * piece_bytes;
}

ts_status ts_comm_staged_wrap(ts_comm *c, const ts_comm_memory *mem) {
  static const char *op = "ts_comm_set_memory";
  size_t need = ts_comm_staging_bytes(c->size, TS_COMM_STAGING_MIN_PIECE);
  if (!mem->to_host || !mem->to_device || !mem->sync)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: group %s has %d ranks: lent memory needs to_host, to_device and sync "
                        "(the host-staged transport)",
                        op, c->name, c->size);
  if (!mem->staging || mem->staging_bytes < need)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: group %s has %d ranks: staging of %zu bytes at %p; expected at least "
                        "%zu (ts_comm_staging_bytes(%d, %d))",
                        op, c->name, c->size, mem->staging_bytes, mem->staging, need, c->size,
                        TS_COMM_STAGING_MIN_PIECE);
  staged_state *s = (staged_state *)ts_comm_alloc(sizeof *s, 1);
  if (!s) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot allocate the staged state", op);
  s->inner = *c;
  s->inner.mem = NULL; /* MPI sees host memory only */
  s->slot_bytes = mem->staging_bytes / 2 / 64 * 64;
  s->slot[0] = (char *)mem->staging;
  s->slot[1] = (char *)mem->staging + s->slot_bytes;
  c->be = &ts_comm_staged_backend;
  c->impl = s;
  return TS_OK;
}

void ts_comm_staged_unwrap(ts_comm *c) {
  staged_state *s = (staged_state *)c->impl;
  c->be = s->inner.be;
  c->impl = s->inner.impl;
  copies_free(s);
  ts_comm_dealloc(s->whole);
  ts_comm_dealloc(s);
}
