/*
 * comm.c — the front of comm (the contract is comm.h): groups, argument
 * checks, counters, and the one path every call takes to its group's
 * backend (backend.h: MPI in mpi.c, one rank in self.c).
 *
 * Invariants:
 * - Every collective and point-to-point call fills one ts_comm_call and goes
 *   through submit(): check_call validates it, charge counts it, and the
 *   group's backend runs it. No call reaches a backend unchecked, and no
 *   backend touches the counters.
 * - Checks of counts, dtype, root, peer, tag and scratch size depend only on
 *   values every rank of a correct program shares (the *_scratch_bytes
 *   functions give the sizes), so such a bad call fails on every rank alike
 *   instead of leaving peers in a collective. Checks of pointers (NULL,
 *   overlap) and the in-place choice depend on each rank's own buffers:
 *   every rank must choose in place or not alike (MPI_Allgather needs
 *   MPI_IN_PLACE on all ranks or none), and a pointer bug on one rank fails
 *   that rank only, which then aborts the job (tools: ts_comm_abort).
 * - Counters hold the bytes each call asks this rank to send, computed from
 *   its arguments (comm.h), charged once the checks pass, before the
 *   transfer; a rejected call counts nothing, and one rank counts nothing.
 * - All-reduce exists only here: it runs as a reduce-scatter of the uneven
 *   chunks [j*count/N, (j+1)*count/N) into the own chunk, then an in-place
 *   all-gather of the same chunks, both through the backend's ordinary
 *   reduce-scatter and all-gather (DESIGN.md: stage 0 = reduce-scatter +
 *   all-gather, one reduction primitive).
 * - Every group of one rank runs on the local backend, which makes no MPI
 *   call (ts_comm_self needs no ts_comm_init).
 */
#include "comm/comm.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/backend.h"

/* ---- shared with the backends (backend.h) ---------------------------------------- */

/* Allocations made through ts_comm_alloc and ts_comm_realloc. */
static _Atomic uint64_t g_allocations;

void *ts_comm_alloc(size_t bytes, int zeroed) {
  void *p = zeroed ? calloc(1, bytes ? bytes : 1) : malloc(bytes ? bytes : 1);
  if (p) g_allocations++;
  return p;
}

void *ts_comm_realloc(void *p, size_t bytes) {
  void *q = realloc(p, bytes ? bytes : 1);
  if (q) g_allocations++;
  return q;
}

void ts_comm_dealloc(void *p) { free(p); }

uint64_t ts_comm_allocations(void) { return g_allocations; }

/* A group's released requests, each block tagged with its backend and size. */
struct ts_comm_pool {
  pthread_mutex_t mu;
  ts_comm_request *free; /* a list through next_free */
  struct {
    const ts_comm_backend *be;
    int made;
  } made[4]; /* blocks made per backend (a group and the transports wrapped around it) */
};

/* Counts a block made for backend be (under the lock). */
static void count_made(ts_comm_pool *p, const ts_comm_backend *be) {
  for (int i = 0; i < 4; i++) {
    if (p->made[i].be == be || !p->made[i].be) {
      p->made[i].be = be;
      p->made[i].made++;
      return;
    }
  }
}

/* Blocks made for backend be so far (under the lock). */
static int made_for(const ts_comm_pool *p, const ts_comm_backend *be) {
  for (int i = 0; i < 4; i++)
    if (p->made[i].be == be) return p->made[i].made;
  return 0;
}

/* A new block of `bytes` for group c's backend, readied by it. */
static ts_status block_new(ts_comm *c, const char *op, size_t bytes, ts_comm_request **out) {
  ts_comm_request *q = (ts_comm_request *)ts_comm_alloc(bytes, 1);
  if (!q) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot allocate a request", op);
  q->be = c->be;
  q->bytes = bytes;
  q->c = c;
  ts_status st = c->be->init_request ? c->be->init_request(c, q) : TS_OK;
  if (st != TS_OK) {
    if (c->be->drop_request) c->be->drop_request(q);
    ts_comm_dealloc(q);
    return st;
  }
  pthread_mutex_lock(&c->pool->mu);
  count_made(c->pool, c->be);
  pthread_mutex_unlock(&c->pool->mu);
  *out = q;
  return TS_OK;
}

/* Frees the pool and every block in it (the backend's kept parts first). */
static void pool_free(ts_comm_pool *p) {
  if (!p) return;
  for (ts_comm_request *q = p->free, *next; q; q = next) {
    next = q->next_free;
    if (q->be && q->be->drop_request) q->be->drop_request(q);
    ts_comm_dealloc(q);
  }
  pthread_mutex_destroy(&p->mu);
  ts_comm_dealloc(p);
}

ts_status ts_comm_new(const char *op, const ts_comm_backend *be, const char *name, void *impl,
                      ts_comm **out) {
  ts_comm *c = (ts_comm *)ts_comm_alloc(sizeof *c, 1);
  ts_comm_pool *pool = (ts_comm_pool *)ts_comm_alloc(sizeof *pool, 1);
  if (!c || !pool) {
    ts_comm_dealloc(c);
    ts_comm_dealloc(pool);
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot allocate a group", op);
  }
  pthread_mutex_init(&pool->mu, NULL);
  c->pool = pool;
  c->rank = 0;
  c->size = 1;
  c->be = be;
  c->impl = impl;
  snprintf(c->name, sizeof c->name, "%s", name ? name : "");
  *out = c;
  return TS_OK;
}

ts_status ts_comm_set_memory(ts_comm *c, const ts_comm_memory *mem) {
  static const char *op = "ts_comm_set_memory";
  if (!c) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: c is NULL", op);
  if (ts_comm_thread_active(c))
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "%s: group %s runs on a communication thread; lend its memory before "
                        "ts_comm_set_thread",
                        op, c->name);
  if (mem && (!mem->copy || !mem->add))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: copy and add are required", op);
  if (mem && c->mem && c->mem != mem)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "%s: group %s already moves memory lent by another owner; lend it NULL "
                        "first",
                        op, c->name);
  if (c->be->unwrap) c->be->unwrap(c); /* staged or nccl: back to the group's own */
  /* a plan group moves nothing: it keeps mem as a one-rank group does */
  if (mem && c->size > 1 && c->be->caps.moves) {
    if (!c->be->caps.host_ranks)
      return ts_set_error(TS_ERR_UNSUPPORTED,
                          "%s: group %s of %d ranks is on the %s transport; only MPI groups stage "
                          "through the host",
                          op, c->name, c->size, c->be->name);
    TS_CHECK(ts_comm_staged_wrap(c, mem));
  }
  c->mem = mem;
  return TS_OK;
}

const char *ts_comm_transport(const ts_comm *c) { return c->be->name; }

ts_status ts_comm_request_new(ts_comm *c, const char *op, size_t bytes, ts_comm_request **out) {
  ts_comm_pool *p = c->pool;
  ts_comm_request *q = NULL;
  pthread_mutex_lock(&p->mu);
  for (ts_comm_request **at = &p->free; *at; at = &(*at)->next_free) {
    if ((*at)->be == c->be && (*at)->bytes == bytes) {
      q = *at;
      *at = q->next_free;
      break;
    }
  }
  pthread_mutex_unlock(&p->mu);
  if (!q) TS_CHECK(block_new(c, op, bytes, &q));
  q->c = c;
  q->op = op;
  q->times = NULL;
  q->done_in_start = 0;
  q->watch_id = -1;
  q->started[0] = q->started[1] = -1.0;
  q->next_free = NULL;
  *out = q;
  return TS_OK;
}

ts_status ts_comm_pool_reserve(ts_comm *c, int n) {
  size_t bytes = c->be->request_bytes;
  if (!bytes) return TS_OK;
  for (;;) {
    pthread_mutex_lock(&c->pool->mu);
    int made = made_for(c->pool, c->be);
    pthread_mutex_unlock(&c->pool->mu);
    if (made >= n) return TS_OK;
    ts_comm_request *q = NULL;
    TS_CHECK(block_new(c, "ts_comm_pool_reserve", bytes, &q));
    ts_comm_request_release(q);
  }
}

void ts_comm_request_release(ts_comm_request *q) {
  if (!q) return;
  ts_comm_pool *p = q->c->pool;
  pthread_mutex_lock(&p->mu);
  q->next_free = p->free;
  p->free = q;
  pthread_mutex_unlock(&p->mu);
}

/* ---- argument checks ---------------------------------------------------------- */

/* dt must be a storage dtype comm moves. */
static ts_status check_dtype(const char *op, ts_dtype dt) {
  if (dt == TS_FP32 || dt == TS_BF16 || dt == TS_FP16) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: dtype %d is not fp32, bf16 or fp16", op,
                      (int)dt);
}

/* count elements of es bytes, times `copies`, must fit in size_t bytes. */
static ts_status check_count(const char *op, size_t count, size_t es, size_t copies) {
  if (count <= SIZE_MAX / es / copies) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: count %zu x %zu bytes x %zu overflows size_t",
                      op, count, es, copies);
}

/* p may be NULL only when there is nothing to move. */
static ts_status check_ptr(const char *op, const char *what, const void *p, size_t nbytes) {
  if (p || nbytes == 0) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: %s is NULL with %zu bytes to move", op, what,
                      nbytes);
}

/* 1 if the byte ranges [a, a+na) and [b, b+nb) share a byte. */
static int overlap(const void *a, size_t na, const void *b, size_t nb) {
  if (na == 0 || nb == 0) return 0;
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + nb && y < x + na;
}

/* peer must be another rank of c, and tag >= 0. */
static ts_status check_peer(const ts_comm *c, const char *op, int peer, int tag) {
  if (peer < 0 || peer >= c->size || peer == c->rank) {
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: peer %d is not another rank of group \"%s\" (rank %d of %d)", op, peer,
                        c->name, c->rank, c->size);
  }
  if (tag < 0) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: tag %d < 0", op, tag);
  return TS_OK;
}

/* root must be a rank of c. */
static ts_status check_root(const ts_comm *c, const char *op, int root) {
  if (root >= 0 && root < c->size) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                      "%s: root %d is not a rank of group \"%s\" (size %d)", op, root, c->name,
                      c->size);
}

/* The reduction of all_reduce_f64 must be sum, max or min. */
static ts_status check_reduce(const char *op, ts_comm_op reduce) {
  if (reduce == TS_COMM_SUM || reduce == TS_COMM_MAX || reduce == TS_COMM_MIN) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: op %d is not sum, max or min", op, (int)reduce);
}

/* Checks a collective's (N, count) buffer `whole` and (count,) buffer `part`
 * of nb bytes per rank: part may be the own chunk whole + r*nb
 * (*in_place = 1), else the two must not overlap. */
static ts_status check_whole_part(const ts_comm *c, const char *op, const char *whole_name,
                                  const void *whole, const char *part_name, const void *part,
                                  size_t nb, int *in_place) {
  size_t whole_bytes = nb * (size_t)c->size;
  TS_CHECK(check_ptr(op, whole_name, whole, whole_bytes));
  TS_CHECK(check_ptr(op, part_name, part, nb));
  *in_place = nb == 0 || part == (const void *)((const char *)whole + (size_t)c->rank * nb);
  if (!*in_place && overlap(part, nb, whole, whole_bytes)) {
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: %s overlaps %s but is not the own chunk %s + %d*count", op, part_name,
                        whole_name, whole_name, c->rank);
  }
  return TS_OK;
}

/* Checks d's scratch against `need` bytes ((N-1) * per_rank elements) and
 * against the call's buffers a (na bytes) and b (nb bytes), named `bufs`. */
static ts_status check_scratch(const ts_comm *c, const ts_comm_call *d, size_t need,
                               const char *per_rank, const void *a, size_t na, const void *b,
                               size_t nb, const char *bufs) {
  if (d->scratch_bytes < need) {
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: scratch has %zu bytes, needs %zu ((N-1)*%s*%zu with N=%d, count=%zu)",
                        d->name, d->scratch_bytes, need, per_rank, ts_dtype_size(d->dt), c->size,
                        d->count);
  }
  if (need > 0) {
    TS_CHECK(check_ptr(d->name, "scratch", d->scratch, need));
    if (overlap(d->scratch, need, a, na) || overlap(d->scratch, need, b, nb)) {
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: scratch overlaps %s", d->name, bufs);
    }
  }
  return TS_OK;
}

/* Bytes per element of call d. */
static size_t call_es(const ts_comm_call *d) {
  return d->kind == TS_COMM_CALL_ALL_REDUCE_F64 ? sizeof(double) : ts_dtype_size(d->dt);
}

/* Validates call d on c and sets d->in_place. Shared values first (dtype or
 * reduction, root, peer and tag, count), then this rank's pointers, then
 * the scratch size, in the order comm has always checked them. */
static ts_status check_call(const ts_comm *c, ts_comm_call *d) {
  const char *op = d->name;
  ts_comm_call_kind kind = d->kind;
  if (kind == TS_COMM_CALL_BARRIER) return TS_OK;
  if (kind == TS_COMM_CALL_ALL_REDUCE_F64) {
    TS_CHECK(check_reduce(op, d->reduce));
  } else {
    TS_CHECK(check_dtype(op, d->dt));
  }
  if (kind == TS_COMM_CALL_BROADCAST) TS_CHECK(check_root(c, op, d->root));
  int p2p = kind == TS_COMM_CALL_SEND || kind == TS_COMM_CALL_RECV;
  if (p2p) TS_CHECK(check_peer(c, op, d->peer, d->tag));
  size_t es = call_es(d);
  int one_copy = p2p || kind == TS_COMM_CALL_ALL_REDUCE;
  TS_CHECK(check_count(op, d->count, es, one_copy ? 1 : (size_t)c->size));
  size_t nb = d->count * es;
  if (kind == TS_COMM_CALL_ALL_GATHER) {
    return check_whole_part(c, op, "recv", d->recv, "send", d->send, nb, &d->in_place);
  }
  if (kind == TS_COMM_CALL_REDUCE_SCATTER) {
    TS_CHECK(check_whole_part(c, op, "send", d->send, "recv", d->recv, nb, &d->in_place));
    if (d->in_place && d->accumulate && d->count > 0)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "%s: accumulate in place: recv is this rank's chunk of send, so there "
                          "is no previous recv to add; pass a separate recv",
                          op);
    size_t need = ts_comm_reduce_scatter_scratch_bytes(c, d->count, d->dt);
    return check_scratch(c, d, need, "count", d->send, nb * (size_t)c->size, d->recv, nb,
                         "send or recv");
  }
  TS_CHECK(check_ptr(op, "buf", d->buf, nb));
  if (kind == TS_COMM_CALL_ALL_REDUCE) {
    size_t need = ts_comm_all_reduce_scratch_bytes(c, d->count, d->dt);
    return check_scratch(c, d, need, "ceil(count/N)", d->buf, nb, NULL, 0, "buf");
  }
  return TS_OK;
}

/* ---- counters ------------------------------------------------------------------ */

const char *ts_comm_kind_name(ts_comm_kind k) {
  switch (k) {
    case TS_COMM_ALL_REDUCE: return "all_reduce";
    case TS_COMM_REDUCE_SCATTER: return "reduce_scatter";
    case TS_COMM_ALL_GATHER: return "all_gather";
    case TS_COMM_BROADCAST: return "broadcast";
    case TS_COMM_SEND: return "send";
    case TS_COMM_NUM_KINDS: break;
  }
  return "?";
}

ts_status ts_comm_set_nodes(ts_comm *c, const int *node) {
  ts_comm_dealloc(c->node);
  c->node = NULL;
  c->remote_peers = 0;
  if (!node) return TS_OK;
  c->node = (int *)ts_comm_alloc((size_t)c->size * sizeof *c->node, 0);
  if (!c->node) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "ts_comm_set_nodes: %d members", c->size);
  memcpy(c->node, node, (size_t)c->size * sizeof *node);
  for (int j = 0; j < c->size; j++) c->remote_peers += node[j] != node[c->rank];
  return TS_OK;
}

ts_status ts_comm_set_nodes_of_world(ts_comm *c, const int *world) {
  int n = c->size, *node = (int *)ts_comm_alloc((size_t)n * sizeof *node, 0);
  if (!node) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "ts_comm_split: %d members' nodes", n);
  for (int i = 0; i < n; i++) { /* member i's node: the first member with its host name */
    node[i] = i;
    for (int j = 0; j < i; j++)
      if (strcmp(ts_comm_host(world[i]), ts_comm_host(world[j])) == 0) {
        node[i] = node[j];
        break;
      }
  }
  ts_status st = ts_comm_set_nodes(c, node);
  ts_comm_dealloc(node);
  return st;
}

/* 1 when member j of c is on another node than this rank. */
static int is_remote(const ts_comm *c, int j) { return c->node && c->node[j] != c->node[c->rank]; }

/* Charges checked call d to c: one call of its kind and the bytes its
 * arguments ask this rank to send (comm.h), and of them those to members
 * on other nodes. A one-rank group sends nothing and counts nothing, calls
 * included. */
static void charge(ts_comm *c, const ts_comm_call *d, ts_comm_call_info *out) {
  memset(out, 0, sizeof *out);
  out->kind = -1;
  out->peer = out->tag = -1;
  if (c->size == 1) return;
  uint64_t others = (uint64_t)(c->size - 1), nb = (uint64_t)d->count * call_es(d);
  uint64_t bytes = others * nb; /* this rank's count elements to each of the N-1 others */
  uint64_t remote = (uint64_t)c->remote_peers * nb;
  ts_comm_kind k;
  switch (d->kind) {
    case TS_COMM_CALL_REDUCE_SCATTER: k = TS_COMM_REDUCE_SCATTER; break;
    case TS_COMM_CALL_ALL_GATHER: k = TS_COMM_ALL_GATHER; break;
    case TS_COMM_CALL_ALL_REDUCE_F64: k = TS_COMM_ALL_REDUCE; break;
    case TS_COMM_CALL_ALL_REDUCE: {
      /* The reduce-scatter half sends every chunk but the own one, the
       * all-gather half the own chunk to each of the N-1 others. */
      size_t lo = ts_comm_chunk_lo(d->count, c->size, c->rank);
      uint64_t own = ts_comm_chunk_lo(d->count, c->size, c->rank + 1) - lo;
      k = TS_COMM_ALL_REDUCE;
      bytes = ((uint64_t)d->count - own + others * own) * call_es(d);
      remote = (uint64_t)c->remote_peers * own;            /* the all-gather half */
      for (int j = 0; j < c->size && c->remote_peers; j++) /* the reduce-scatter half */
        if (is_remote(c, j))
          remote +=
              ts_comm_chunk_lo(d->count, c->size, j + 1) - ts_comm_chunk_lo(d->count, c->size, j);
      remote *= call_es(d);
      break;
    }
    case TS_COMM_CALL_BROADCAST:
      k = TS_COMM_BROADCAST;
      if (c->rank != d->root) bytes = remote = 0; /* only the root sends */
      break;
    case TS_COMM_CALL_SEND:
      k = TS_COMM_SEND;
      bytes = nb;
      remote = is_remote(c, d->peer) ? nb : 0;
      out->peer = d->peer;
      out->tag = d->tag;
      break;
    case TS_COMM_CALL_RECV: /* nothing sent; told to a watcher */
      out->recv = 1;
      out->peer = d->peer;
      out->tag = d->tag;
      out->buffer = nb;
      return;
    default: return; /* barrier: nothing sent */
  }
  c->counters.bytes[k] += bytes;
  c->counters.calls[k] += 1;
  c->counters.remote[k] += remote;
  out->kind = (int)k;
  out->bytes = bytes;
  out->remote = remote;
  out->buffer = (uint64_t)d->count * call_es(d) * (k == TS_COMM_ALL_GATHER ? (uint64_t)c->size : 1);
  if (k == TS_COMM_REDUCE_SCATTER) out->buffer *= (uint64_t)c->size;
}

void ts_comm_set_watcher(ts_comm *c, const ts_comm_watcher *w) { c->watcher = w; }

const ts_comm_counters *ts_comm_get_counters(const ts_comm *c) { return &c->counters; }

uint64_t ts_comm_bytes_sent(const ts_comm *c) {
  uint64_t sum = 0;
  for (int k = 0; k < TS_COMM_NUM_KINDS; k++) sum += c->counters.bytes[k];
  return sum;
}

uint64_t ts_comm_bytes_remote(const ts_comm *c) {
  uint64_t sum = 0;
  for (int k = 0; k < TS_COMM_NUM_KINDS; k++) sum += c->counters.remote[k];
  return sum;
}

void ts_comm_reset_counters(ts_comm *c) { memset(&c->counters, 0, sizeof c->counters); }

/* ---- the one path ------------------------------------------------------------------ */

/* All-reduce d as comm.h defines it: a reduce-scatter of the chunks
 * [j*count/N, (j+1)*count/N) of buf into the own chunk, then an in-place
 * all-gather of the same chunks, both blocking on c's backend. */
static ts_status all_reduce_halves(ts_comm *c, const ts_comm_call *d) {
  size_t lo = ts_comm_chunk_lo(d->count, c->size, c->rank);
  char *own = (char *)d->buf + lo * ts_dtype_size(d->dt);
  ts_comm_call half = *d;
  half.kind = TS_COMM_CALL_REDUCE_SCATTER;
  half.uneven = 1;
  half.in_place = 1;
  half.send = d->buf;
  half.recv = own;
  half.buf = NULL;
  TS_CHECK(c->be->run(c, &half, NULL)); /* the own chunk now holds the rank-order sum */
  half.kind = TS_COMM_CALL_ALL_GATHER;
  half.send = own;
  half.recv = d->buf;
  return c->be->run(c, &half, NULL);
}

/* Seconds callers spent in blocking calls and waits (ts_comm_wait_seconds). */
static double g_wait_s;

double ts_comm_wait_seconds(void) { return g_wait_s; }

double ts_comm_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec * 1e6 + (double)(ts.tv_nsec / 1000);
}

/* Every call's way in: validates d, charges it, and runs it on c's backend
 * (blocking when req is NULL, else its request goes to *req, with the time
 * its start took when the backend ran the call to its end there). */
static ts_status submit(ts_comm *c, ts_comm_call *d, ts_comm_request **req) {
  d->blocking = req == NULL;
  d->ctx = ts_comm_get_context();
  TS_CHECK(check_call(c, d));
  ts_comm_call_info info;
  charge(c, d, &info);
  int64_t watch_id = c->watcher && (info.kind >= 0 || info.recv)
                         ? c->watcher->started(c->watcher->user, c, &info, req == NULL)
                         : -1;
  if (!req) { /* a blocking call: all of it is the caller's wait */
    double t0 = ts_comm_now_us();
    ts_status st =
        d->kind == TS_COMM_CALL_ALL_REDUCE ? all_reduce_halves(c, d) : c->be->run(c, d, req);
    if (c->size > 1) g_wait_s += (ts_comm_now_us() - t0) * 1e-6;
    return st;
  }
  double t0 = ts_comm_now_us();
  TS_CHECK(c->be->run(c, d, req));
  if (*req) (*req)->watch_id = watch_id;
  if (*req && (*req)->done_in_start) {
    (*req)->started[0] = t0;
    (*req)->started[1] = ts_comm_now_us();
  }
  return TS_OK;
}

ts_status ts_comm_wait(ts_comm_request *req) {
  if (!req) return TS_OK;
  if (req->c->watcher) req->c->watcher->waited(req->c->watcher->user, req->watch_id);
  double t0 = ts_comm_now_us();
  int many = req->c->size > 1; /* wait frees req */
  ts_status st = req->c->be->wait(req);
  if (many) g_wait_s += (ts_comm_now_us() - t0) * 1e-6;
  return st;
}

ts_status ts_comm_wait_timed(ts_comm_request *req, double times[4]) {
  times[0] = times[1] = times[2] = times[3] = -1.0;
  if (!req) return TS_OK;
  if (req->c->watcher) req->c->watcher->waited(req->c->watcher->user, req->watch_id);
  req->times = times;
  times[2] = req->started[0]; /* wait frees req */
  times[3] = req->started[1];
  double t0 = ts_comm_now_us();
  int many = req->c->size > 1; /* wait frees req */
  ts_status st = req->c->be->wait(req);
  if (many) g_wait_s += (ts_comm_now_us() - t0) * 1e-6;
  return st;
}

/* ---- groups --------------------------------------------------------------------- */

ts_status ts_comm_world(ts_comm **out) { return ts_comm_mpi_world(out); }

ts_status ts_comm_self(ts_comm **out) { return ts_comm_self_new("ts_comm_self", "self", out); }

ts_status ts_comm_split(ts_comm *parent, int color, int key, const char *name, ts_comm **out) {
  if (color < 0) {
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: color %d < 0 (group \"%s\")", "ts_comm_split",
                        color, name ? name : "");
  }
  return parent->be->split(parent, color, key, name, out);
}

void ts_comm_free(ts_comm *c) {
  if (!c) return;
  c->be->free_group(c);
  pool_free(c->pool);
  ts_comm_dealloc(c->node);
  ts_comm_dealloc(c);
}

int ts_comm_rank(const ts_comm *c) { return c->rank; }
int ts_comm_size(const ts_comm *c) { return c->size; }
const char *ts_comm_name(const ts_comm *c) { return c->name; }
int ts_comm_remote_peers(const ts_comm *c) { return c->remote_peers; }

/* ---- scratch sizes ----------------------------------------------------------------- */

/* (N-1) * chunk elements of dt, saturating at SIZE_MAX (too big for any scratch). */
size_t ts_comm_reduce_scatter_scratch_bytes_n(size_t ranks, size_t chunk, ts_dtype dt) {
  size_t es = ts_dtype_size(dt), n = ranks - 1;
  if (ranks <= 1) return 0;
  if (chunk > SIZE_MAX / es / n) return SIZE_MAX;
  return n * chunk * es;
}

size_t ts_comm_reduce_scatter_scratch_bytes(const ts_comm *c, size_t count, ts_dtype dt) {
  return ts_comm_reduce_scatter_scratch_bytes_n((size_t)c->size, count, dt);
}

size_t ts_comm_all_reduce_scratch_bytes(const ts_comm *c, size_t count, ts_dtype dt) {
  return ts_comm_reduce_scatter_scratch_bytes_n((size_t)c->size, ts_comm_chunk_max(count, c->size),
                                                dt);
}

/* ---- collectives ------------------------------------------------------------------ */

ts_status ts_comm_barrier(ts_comm *c) {
  ts_comm_call d = {.kind = TS_COMM_CALL_BARRIER, .name = "ts_comm_barrier"};
  return submit(c, &d, NULL);
}

/* A reduce-scatter, blocking (req NULL) or started. */
static ts_status reduce_scatter(ts_comm *c, const char *name, const void *send, void *recv,
                                size_t count, ts_dtype dt, int accumulate, void *scratch,
                                size_t scratch_bytes, ts_comm_request **req) {
  ts_comm_call d = {.kind = TS_COMM_CALL_REDUCE_SCATTER,
                    .name = name,
                    .send = send,
                    .recv = recv,
                    .count = count,
                    .dt = dt,
                    .accumulate = accumulate,
                    .scratch = scratch,
                    .scratch_bytes = scratch_bytes};
  return submit(c, &d, req);
}

ts_status ts_comm_reduce_scatter(ts_comm *c, const void *send, void *recv, size_t count,
                                 ts_dtype dt, int accumulate, void *scratch, size_t scratch_bytes) {
  return reduce_scatter(c, "ts_comm_reduce_scatter", send, recv, count, dt, accumulate, scratch,
                        scratch_bytes, NULL);
}

ts_status ts_comm_ireduce_scatter(ts_comm *c, const void *send, void *recv, size_t count,
                                  ts_dtype dt, int accumulate, void *scratch, size_t scratch_bytes,
                                  ts_comm_request **req) {
  return reduce_scatter(c, "ts_comm_ireduce_scatter", send, recv, count, dt, accumulate, scratch,
                        scratch_bytes, req);
}

/* An all-gather, blocking (req NULL) or started. */
static ts_status all_gather(ts_comm *c, const char *name, const void *send, void *recv,
                            size_t count, ts_dtype dt, ts_comm_request **req) {
  ts_comm_call d = {.kind = TS_COMM_CALL_ALL_GATHER,
                    .name = name,
                    .send = send,
                    .recv = recv,
                    .count = count,
                    .dt = dt};
  return submit(c, &d, req);
}

ts_status ts_comm_all_gather(ts_comm *c, const void *send, void *recv, size_t count, ts_dtype dt) {
  return all_gather(c, "ts_comm_all_gather", send, recv, count, dt, NULL);
}

ts_status ts_comm_iall_gather(ts_comm *c, const void *send, void *recv, size_t count, ts_dtype dt,
                              ts_comm_request **req) {
  return all_gather(c, "ts_comm_iall_gather", send, recv, count, dt, req);
}

ts_status ts_comm_all_reduce(ts_comm *c, void *buf, size_t count, ts_dtype dt, void *scratch,
                             size_t scratch_bytes) {
  ts_comm_call d = {.kind = TS_COMM_CALL_ALL_REDUCE,
                    .name = "ts_comm_all_reduce",
                    .buf = buf,
                    .count = count,
                    .dt = dt,
                    .scratch = scratch,
                    .scratch_bytes = scratch_bytes};
  return submit(c, &d, NULL);
}

ts_status ts_comm_all_reduce_f64(ts_comm *c, double *buf, size_t count, ts_comm_op op) {
  ts_comm_call d = {.kind = TS_COMM_CALL_ALL_REDUCE_F64,
                    .name = "ts_comm_all_reduce_f64",
                    .buf = buf,
                    .count = count,
                    .reduce = op};
  return submit(c, &d, NULL);
}

ts_status ts_comm_agree(ts_comm *c, ts_status st, const char *what, int *first) {
  int rank = ts_comm_rank(c), n = ts_comm_size(c);
  enum { STATUSES = 64 }; /* above every ts_status value */
  double key = st != TS_OK ? (double)rank * STATUSES + (double)st : (double)n * STATUSES;
  if (first) *first = -1;
  TS_CHECK(ts_comm_all_reduce_f64(c, &key, 1, TS_COMM_MIN));
  if (key >= (double)n * STATUSES) return TS_OK;
  int who = (int)(key / STATUSES);
  if (first) *first = who;
  if (who == rank) return st;
  return ts_set_error((ts_status)((int)key % STATUSES), "rank %d of %d failed %s", who, n, what);
}

/* A broadcast, blocking (req NULL) or started. */
static ts_status broadcast(ts_comm *c, const char *name, void *buf, size_t count, ts_dtype dt,
                           int root, ts_comm_request **req) {
  ts_comm_call d = {.kind = TS_COMM_CALL_BROADCAST,
                    .name = name,
                    .buf = buf,
                    .count = count,
                    .dt = dt,
                    .root = root};
  return submit(c, &d, req);
}

ts_status ts_comm_broadcast(ts_comm *c, void *buf, size_t count, ts_dtype dt, int root) {
  return broadcast(c, "ts_comm_broadcast", buf, count, dt, root, NULL);
}

ts_status ts_comm_ibroadcast(ts_comm *c, void *buf, size_t count, ts_dtype dt, int root,
                             ts_comm_request **req) {
  return broadcast(c, "ts_comm_ibroadcast", buf, count, dt, root, req);
}

/* ---- point-to-point ---------------------------------------------------------------- */

/* A send or receive (kind), blocking (req NULL) or started. */
static ts_status p2p(ts_comm *c, const char *name, ts_comm_call_kind kind, void *buf, size_t count,
                     ts_dtype dt, int peer, int tag, ts_comm_request **req) {
  ts_comm_call d = {
      .kind = kind, .name = name, .buf = buf, .count = count, .dt = dt, .peer = peer, .tag = tag};
  return submit(c, &d, req);
}

ts_status ts_comm_send(ts_comm *c, const void *buf, size_t count, ts_dtype dt, int peer, int tag) {
  return p2p(c, "ts_comm_send", TS_COMM_CALL_SEND, (void *)buf, count, dt, peer, tag, NULL);
}

ts_status ts_comm_recv(ts_comm *c, void *buf, size_t count, ts_dtype dt, int peer, int tag) {
  return p2p(c, "ts_comm_recv", TS_COMM_CALL_RECV, buf, count, dt, peer, tag, NULL);
}

ts_status ts_comm_isend(ts_comm *c, const void *buf, size_t count, ts_dtype dt, int peer, int tag,
                        ts_comm_request **req) {
  return p2p(c, "ts_comm_isend", TS_COMM_CALL_SEND, (void *)buf, count, dt, peer, tag, req);
}

ts_status ts_comm_irecv(ts_comm *c, void *buf, size_t count, ts_dtype dt, int peer, int tag,
                        ts_comm_request **req) {
  return p2p(c, "ts_comm_irecv", TS_COMM_CALL_RECV, buf, count, dt, peer, tag, req);
}
