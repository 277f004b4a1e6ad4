/*
 * mpi.c — the MPI backend: groups of two or more ranks over Open MPI 4.1
 * communicators, the transport of their calls on host memory (the table is
 * backend.h), and the MPI library calls of comm.h (init, finalize, abort).
 *
 * Invariants:
 * - Every group here has two ranks or more: a communicator of one rank is
 *   freed when the group is made, and the group runs on the local backend
 *   (self.c), which makes no MPI call.
 * - Every MPI communicator runs with MPI_ERRORS_RETURN; every MPI call goes
 *   through MPI_ST, which turns a failure into TS_ERR_MPI naming the tessera
 *   call, the MPI call and MPI's own message.
 * - A group holds two communicators: `user` for the caller's send/recv,
 *   and a private duplicate `coll` for the collectives, so that no user tag
 *   can match them.
 * - Every collective is a direct exchange of point-to-point messages
 *   (reduce-scatter, all-gather, barrier: each rank to each other; broadcast:
 *   the root to each other), never an MPI collective, and every wait polls
 *   its requests: so a wait past the watchdog's deadline (ts_comm_set_timeout)
 *   knows which peers' messages are missing and names them (comm.h).
 * - No MPI message exceeds ts_comm_max_message bytes (1 GiB): larger transfers are
 *   split into pieces sent in order with one tag (MPI's non-overtaking rule
 *   keeps them matched). So element counts beyond INT_MAX work.
 * - A start reserves every request slot it needs before it posts anything,
 *   so only an MPI error can interrupt it half-posted (req_abandon).
 * - Calls arrive checked and counted by the front (comm.c); the only
 *   arithmetic here is ts_comm_sum_rank_order / ts_comm_reduce_f64_rank_order
 *   (sum.c) once the messages are in.
 */
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/backend.h"
#include "comm/sum.h"

/* A group's communicators (ts_comm.impl); both owned by the group. */
typedef struct mpi_group {
  MPI_Comm user; /* the caller's send/recv */
  MPI_Comm coll; /* private duplicate: the collectives' point-to-point traffic */
  int *world;    /* (size,) each group rank's rank in MPI_COMM_WORLD, for the watchdog */
  double *f64;   /* all_reduce_f64's (N, count) gather, kept and grown (f64_cap doubles);
                    the group's calls run one at a time (its thread, if any, runs them) */
  size_t f64_cap;
} mpi_group;

/* One MPI request of an mpi_request, for completion checks and messages. */
typedef struct msg_info {
  const char *call; /* the MPI call that started it, e.g. "MPI_Irecv" */
  int peer;         /* rank in the group, -1 for an MPI collective */
  int expect;       /* bytes a receive must deliver; -1 for sends and collectives */
} msg_info;

/* This backend's request: the MPI requests of one call, and for a
 * reduce-scatter what to sum once they complete. */
typedef struct mpi_request {
  ts_comm_request base; /* group and public call (first member, backend.h) */
  ts_comm_call_kind kind; /* what the call does, and */
  ts_comm_context ctx;    /* its caller's context, for the watchdog's line */
  double t0;              /* when a wait or test first looked at it (s, monotonic); 0: not yet */
  size_t n, cap;        /* requests posted, allocated */
  MPI_Request *reqs;    /* (cap,) */
  msg_info *info;       /* (cap,) */
  MPI_Status *sts;      /* (cap,) completion's statuses */
  int *rcs;             /* (cap,) and MPI's return codes */
  unsigned char *done;  /* (cap,) which have finished, while a watchdog watches */
  const void **srcs;    /* (nsrc,) rank j's chunk: own data or a scratch slot; NULL if none */
  int nsrc;             /* group size; 0 when there is nothing to sum */
  int srcs_cap;         /* entries allocated at srcs */
  void *dst;            /* (count,) the result */
  size_t count;         /* elements of the own chunk */
  ts_dtype dt;          /* element type of srcs and dst */
  int accumulate;       /* add the previous dst last */
} mpi_request;

/* How a collective's whole buffer divides into the ranks' chunks. */
typedef struct chunks {
  size_t count; /* elements per rank, or in all when uneven */
  size_t es;    /* bytes per element */
  int uneven;   /* 1: chunk j is elements [j*count/n, (j+1)*count/n), else [j*count, (j+1)*count) */
  int n;        /* ranks */
} chunks;

/* Tags on the private communicator (user tags never reach it). */
enum { TAG_REDUCE_SCATTER = 1, TAG_ALL_GATHER = 2, TAG_BARRIER = 3, TAG_BROADCAST = 4 };

/* Largest message in bytes, <= INT_MAX (backend.h; tests lower it). */
size_t ts_comm_max_message = (size_t)1 << 30;
/* 1 between ts_comm_init and ts_comm_finalize. */
static int g_initialized;
/* 1 if MPI runs with MPI_THREAD_MULTIPLE (a communication thread may use it). */
static int g_thread_multiple;
/* 1 if ts_comm_init called MPI_Init_thread (then finalize finalises). */
static int g_owns_mpi;

/* ---- errors ---------------------------------------------------------------- */

/* TS_OK if rc is MPI_SUCCESS, else TS_ERR_MPI with MPI's message, the MPI
 * call, the peer (if >= 0) and the group (if any). */
static ts_status mpi_status(int rc, const ts_comm *c, const char *op, const char *call, int peer) {
  if (rc == MPI_SUCCESS) return TS_OK;
  char err[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(rc, err, &len) != MPI_SUCCESS)
    len = snprintf(err, sizeof err, "error code %d", rc);
  err[len < 0 ? 0 : len > MPI_MAX_ERROR_STRING ? MPI_MAX_ERROR_STRING : len] = '\0';
  char where[96] = "";
  if (c)
    snprintf(where, sizeof where, " on group \"%s\" (rank %d of %d)", c->name, c->rank, c->size);
  if (peer >= 0) {
    return ts_set_error(TS_ERR_MPI, "%s: %s with rank %d failed%s: %s", op, call, peer, where, err);
  }
  return ts_set_error(TS_ERR_MPI, "%s: %s failed%s: %s", op, call, where, err);
}

/* Runs MPI call fn with the parenthesised args and maps its result. */
#define MPI_ST(c, op, peer, fn, args) mpi_status(fn args, (c), (op), #fn, (peer))

/* The communicators of group c. */
static mpi_group *group_of(const ts_comm *c) { return (mpi_group *)c->impl; }

/* ---- the watchdog (comm.h; its line and guard are watchdog.c's) ----------------- */

/* Fires the watchdog for q if its deadline passed (ts_comm_watchdog_expired
 * on q->t0): the missing ranks are the senders of q's receives that have
 * not finished, else the receivers of its sends, as world ranks. done[i]
 * says whether q->reqs[i] finished. */
static void watchdog_check(mpi_request *q, const unsigned char *done) {
  if (!ts_comm_watchdog_expired(&q->t0)) return;
  const ts_comm *c = q->base.c;
  const int *world = group_of(c)->world;
  int *missing = (int *)ts_comm_alloc((size_t)c->size * sizeof *missing, 1);
  unsigned char *seen = (unsigned char *)ts_comm_alloc((size_t)c->size, 1);
  int n = 0;
  for (int pass = 0; pass < 2 && n == 0 && missing && seen; pass++) {
    for (size_t i = 0; i < q->n; i++) {
      int p = q->info[i].peer, is_recv = q->info[i].expect >= 0;
      if (done[i] || p < 0 || seen[p] || is_recv != (pass == 0)) continue;
      seen[p] = 1;
      missing[n++] = world[p];
    }
  }
  ts_comm_watchdog_fire(c->name, q->base.op, q->kind, &q->ctx, missing, n); /* no return */
}

/* MPI_ST of a call that blocks inside MPI, under watchdog.c's guard. */
#define MPI_GUARDED(c, op, fn, args) \
  (ts_comm_guard_begin(#fn), guarded_status(fn args, (c), (op), #fn))

/* ts_comm_guard_end, then MPI_ST's mapping of rc. */
static ts_status guarded_status(int rc, const ts_comm *c, const char *op, const char *call) {
  ts_comm_guard_end();
  return mpi_status(rc, c, op, call, -1);
}

/* ---- requests ------------------------------------------------------------------- */

/* A new, empty request of this backend for call d on c. */
static ts_status req_new(ts_comm *c, const ts_comm_call *d, mpi_request **out) {
  ts_comm_request *q = NULL;
  TS_CHECK(ts_comm_request_new(c, d->name, sizeof(mpi_request), &q));
  *out = (mpi_request *)q;
  (*out)->kind = d->kind;
  (*out)->ctx = d->ctx;
  return TS_OK;
}

/* Grows *p to n elements of `size` bytes (ts_comm_realloc); 0 on failure,
 * *p kept. */
static int grow(void **p, size_t n, size_t size) {
  void *q = ts_comm_realloc(*p, n * size);
  if (!q) return 0;
  *p = q;
  return 1;
}

/* Makes room for `more` requests beyond those posted. A start reserves
 * all its slots before it posts anything (post_send and post_recv assert
 * the room), so that only an MPI error can interrupt it half-posted (see
 * req_abandon). The arrays stay with the request in its group's pool, so
 * a call of a size seen before allocates nothing. */
static ts_status req_reserve(mpi_request *q, size_t more) {
  if (q->n + more <= q->cap) return TS_OK;
  size_t cap = q->cap ? 2 * q->cap : 8;
  while (cap < q->n + more) cap *= 2;
  if (!grow((void **)&q->reqs, cap, sizeof *q->reqs) ||
      !grow((void **)&q->info, cap, sizeof *q->info) ||
      !grow((void **)&q->sts, cap, sizeof *q->sts) ||
      !grow((void **)&q->rcs, cap, sizeof *q->rcs) ||
      !grow((void **)&q->done, cap, sizeof *q->done))
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot grow a request", q->base.op);
  q->cap = cap;
  return TS_OK;
}

/* Records the request *slot just started by `call`. */
static void req_push(mpi_request *q, const char *call, int peer, int expect) {
  q->info[q->n].call = call;
  q->info[q->n].peer = peer;
  q->info[q->n].expect = expect;
  q->n++;
}

/* Pieces a transfer of nbytes is split into; at least one if min_one. */
static size_t npieces(size_t nbytes, int min_one) {
  size_t k = (nbytes + ts_comm_max_message - 1) / ts_comm_max_message;
  return k == 0 && min_one ? 1 : k;
}

/* Bytes of piece p (at byte p * ts_comm_max_message) of a transfer of nbytes. */
static int piece_len(size_t nbytes, size_t p) {
  size_t rest = nbytes - p * ts_comm_max_message;
  return (int)(rest < ts_comm_max_message ? rest : ts_comm_max_message);
}

/* Requests a direct exchange among n ranks may post: a send to and a
 * receive from each of the n-1 others, each at most `longest` bytes. */
static size_t exchange_slots(int n, size_t longest) {
  return 2 * (size_t)(n - 1) * npieces(longest, 0);
}

/* Starts the MPI_Isend of nbytes at buf to peer, in pieces. */
static ts_status post_send(mpi_request *q, MPI_Comm comm, const void *buf, size_t nbytes, int peer,
                           int tag, int min_one) {
  size_t k = npieces(nbytes, min_one);
  for (size_t p = 0; p < k; p++) {
    const char *at = (const char *)buf + p * ts_comm_max_message;
    int len = piece_len(nbytes, p);
    TS_ASSERT(q->n < q->cap); /* reserved by the start */
    TS_CHECK(MPI_ST(q->base.c, q->base.op, peer, MPI_Isend,
                    (at, len, MPI_BYTE, peer, tag, comm, &q->reqs[q->n])));
    req_push(q, "MPI_Isend", peer, -1);
  }
  return TS_OK;
}

/* Starts the MPI_Irecv of nbytes into buf from peer, in pieces. */
static ts_status post_recv(mpi_request *q, MPI_Comm comm, void *buf, size_t nbytes, int peer,
                           int tag, int min_one) {
  size_t k = npieces(nbytes, min_one);
  for (size_t p = 0; p < k; p++) {
    char *at = (char *)buf + p * ts_comm_max_message;
    int len = piece_len(nbytes, p);
    TS_ASSERT(q->n < q->cap); /* reserved by the start */
    TS_CHECK(MPI_ST(q->base.c, q->base.op, peer, MPI_Irecv,
                    (at, len, MPI_BYTE, peer, tag, comm, &q->reqs[q->n])));
    req_push(q, "MPI_Irecv", peer, len);
  }
  return TS_OK;
}

/* Gives q back to its group's pool, reset but for its arrays. */
static void req_free(mpi_request *q) {
  q->kind = TS_COMM_CALL_BARRIER;
  memset(&q->ctx, 0, sizeof q->ctx);
  q->t0 = 0;
  q->n = 0;
  q->nsrc = 0;
  q->dst = NULL;
  q->count = 0;
  q->accumulate = 0;
  ts_comm_request_release(&q->base);
}

/* Readies a new block for group c (backend.h init_request): room for the
 * requests of any call of c whose messages fit one piece (a direct
 * exchange's 2 (N - 1), at least 8) and for a reduce-scatter's N sources,
 * so that a pooled request never grows below 1 GiB messages. */
static ts_status req_init(ts_comm *c, ts_comm_request *req) {
  mpi_request *q = (mpi_request *)req;
  q->base.op = "ts_comm_pool";
  TS_CHECK(req_reserve(q, exchange_slots(c->size, 1) > 8 ? exchange_slots(c->size, 1) : 8));
  if (!grow((void **)&q->srcs, (size_t)c->size, sizeof *q->srcs))
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "ts_comm_pool: cannot allocate %d pointers", c->size);
  q->srcs_cap = c->size;
  return TS_OK;
}

/* Frees the arrays a pooled request keeps (backend.h drop_request). */
static void req_drop(ts_comm_request *req) {
  mpi_request *q = (mpi_request *)req;
  ts_comm_dealloc(q->reqs);
  ts_comm_dealloc(q->info);
  ts_comm_dealloc(q->sts);
  ts_comm_dealloc(q->rcs);
  ts_comm_dealloc(q->done);
  ts_comm_dealloc(q->srcs);
}

/* Frees q without completing it, after an MPI error while posting (every
 * slot was reserved first, so nothing else interrupts a start). Posted
 * receives are cancelled and waited for, so none writes into a buffer
 * after this returns. Posted sends are released to MPI: after an MPI error
 * MPI's state is undefined (MPI-3.1 §8.3) and the caller aborts the job
 * (tools call ts_comm_abort), so they are not waited for, since a peer
 * that never posts the matching receive would hang this rank. */
static void req_abandon(mpi_request *q) {
  for (size_t i = 0; i < q->n; i++) {
    if (q->reqs[i] == MPI_REQUEST_NULL) continue;
    if (q->info[i].expect >= 0) {
      MPI_Cancel(&q->reqs[i]);
      MPI_Wait(&q->reqs[i], MPI_STATUS_IGNORE);
    } else if (strcmp(q->info[i].call, "MPI_Isend") == 0) {
      MPI_Request_free(&q->reqs[i]);
    } /* a nonblocking collective's request may be neither freed nor
         cancelled (MPI-3.1 §5.12): its handle is dropped */
  }
  req_free(q);
}

/* Finishes every MPI request of q into sts[i] and rcs[i] (MPI's return
 * codes): MPI_Wait each without a watchdog, else MPI_Test them in turn
 * until all have finished, the watchdog checking the deadline between
 * rounds. */
static void req_finish_all(mpi_request *q, MPI_Status *sts, int *rcs) {
  if (ts_comm_timeout() <= 0) {
    for (size_t i = 0; i < q->n; i++) rcs[i] = MPI_Wait(&q->reqs[i], &sts[i]);
    return;
  }
  unsigned char *done = q->done; /* (cap,) with the request's arrays */
  if (q->n) memset(done, 0, q->n);
  for (size_t left = q->n;;) {
    for (size_t i = 0; i < q->n; i++) {
      if (done[i]) continue;
      int flag = 0;
      rcs[i] = MPI_Test(&q->reqs[i], &flag, &sts[i]);
      if (flag || rcs[i] != MPI_SUCCESS) {
        done[i] = 1;
        left--;
      }
    }
    if (left == 0) break;
    watchdog_check(q, done);
  }
}

/* Completes every request of q (all of them, even after a failure, so no
 * buffer stays in MPI's hands), checks received sizes, sums a
 * reduce-scatter, and frees q. Returns the first failure. */
static ts_status req_complete(mpi_request *q) {
  const ts_comm *c = q->base.c;
  ts_status st = TS_OK;
  MPI_Status *sts = q->sts; /* (cap,) with the request's arrays */
  int *rcs = q->rcs;
  req_finish_all(q, sts, rcs);
  for (size_t i = 0; i < q->n; i++) {
    MPI_Status s = sts[i];
    int rc = rcs[i];
    const msg_info *m = &q->info[i];
    if (st != TS_OK) continue;
    if (rc != MPI_SUCCESS) {
      int cls = MPI_ERR_OTHER;
      MPI_Error_class(rc, &cls);
      st = mpi_status(rc, c, q->base.op, m->call, m->peer);
      if (cls == MPI_ERR_TRUNCATE && m->expect >= 0) {
        char prev[1024];
        snprintf(prev, sizeof prev, "%s", ts_last_error());
        st = ts_set_error(TS_ERR_MPI, "%s (the message is longer than the %d bytes expected)", prev,
                          m->expect);
      }
      continue;
    }
    if (m->expect >= 0) {
      int got = -1;
      MPI_Get_count(&s, MPI_BYTE, &got);
      if (got != m->expect) {
        st = ts_set_error(TS_ERR_MPI,
                          "%s: expected %d bytes from rank %d, the message has %d bytes, on group "
                          "\"%s\" (rank %d of %d)",
                          q->base.op, m->expect, m->peer, got, c->name, c->rank, c->size);
      }
    }
  }
  if (st == TS_OK && q->nsrc > 0) {
    ts_comm_sum_rank_order(q->dst, q->srcs, q->nsrc, q->count, q->dt, q->accumulate);
  }
  req_free(q);
  return st;
}

/* Whether every MPI request of q has finished (MPI_Request_get_status,
 * which progresses MPI and frees nothing); if so, completes q. */
static ts_status req_test(mpi_request *q, int *done) {
  *done = 0;
  unsigned char *fin = NULL; /* which requests finished, once the watchdog needs to know */
  for (size_t i = 0; i < q->n; i++) {
    if (q->reqs[i] == MPI_REQUEST_NULL) continue;
    int flag = 0;
    MPI_Status s;
    int rc = MPI_Request_get_status(q->reqs[i], &flag, &s);
    if (rc == MPI_SUCCESS && !flag) { /* still running */
      if (!ts_comm_watchdog_expired(&q->t0)) return TS_OK;
      fin = q->done; /* past the deadline: which are missing */
      for (size_t j = 0; j < q->n; j++) {
        int f = 1;
        if (q->reqs[j] != MPI_REQUEST_NULL) MPI_Request_get_status(q->reqs[j], &f, &s);
        fin[j] = (unsigned char)(f != 0);
      }
      watchdog_check(q, fin); /* does not return */
      return TS_OK;
    }
  }
  *done = 1;
  return req_complete(q); /* its waits return at once, with the statuses */
}

/* Ends a start: after a failure while posting (st) abandons q; else gives q
 * to the caller (req != NULL) or completes it. */
static ts_status req_finish(mpi_request *q, ts_status st, ts_comm_request **req) {
  if (st != TS_OK) {
    req_abandon(q);
    return st;
  }
  if (req) {
    *req = &q->base;
    return TS_OK;
  }
  return req_complete(q);
}

/* ---- chunks ------------------------------------------------------------------------- */

/* The chunks of call d on c: even (count per rank) or uneven (count in all). */
static chunks chunks_of(const ts_comm *c, const ts_comm_call *d) {
  chunks k = {d->count, ts_dtype_size(d->dt), d->uneven, c->size};
  return k;
}

/* Byte offset of chunk j (0 <= j <= n) in the whole buffer. */
static size_t chunk_off(const chunks *k, int j) {
  size_t lo = k->uneven ? ts_comm_chunk_lo(k->count, k->n, j) : (size_t)j * k->count;
  return lo * k->es;
}

/* Bytes of chunk j. */
static size_t chunk_len(const chunks *k, int j) { return chunk_off(k, j + 1) - chunk_off(k, j); }

/* Bytes of the longest chunk. */
static size_t chunk_longest(const chunks *k) {
  return (k->uneven ? ts_comm_chunk_max(k->count, k->n) : k->count) * k->es;
}

/* ---- collectives -------------------------------------------------------------------- */

/* Starts a reduce-scatter's direct exchange on q: chunk j of d->send goes
 * to rank j, the other ranks' chunks r arrive in scratch slots of the own
 * chunk's length (slot j for j < r, j - 1 for j > r), and q is set to sum
 * them in rank order into d->recv when it completes. */
static ts_status rs_start(mpi_request *q, const ts_comm_call *d) {
  ts_comm *c = q->base.c;
  MPI_Comm coll = group_of(c)->coll;
  int n = c->size, r = c->rank;
  chunks k = chunks_of(c, d);
  const char *base = (const char *)d->send;
  char *scratch = (char *)d->scratch;
  size_t len_r = chunk_len(&k, r);
  if (q->srcs_cap < n) {
    if (!grow((void **)&q->srcs, (size_t)n, sizeof *q->srcs))
      return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot allocate %d pointers", q->base.op, n);
    q->srcs_cap = n;
  }
  memset((void *)q->srcs, 0, (size_t)n * sizeof *q->srcs);
  q->nsrc = n;
  q->dst = d->recv;
  q->count = len_r / k.es;
  q->dt = d->dt;
  q->accumulate = d->accumulate;
  for (int j = 0; j < n; j++) { /* scratch may be NULL when there is nothing to receive */
    if (j == r) {
      q->srcs[j] = base + chunk_off(&k, r);
    } else if (len_r > 0) {
      q->srcs[j] = scratch + (size_t)(j < r ? j : j - 1) * len_r;
    }
  }
  TS_CHECK(req_reserve(q, exchange_slots(n, chunk_longest(&k))));
  if (len_r > 0) {
    for (int j = 0; j < n; j++) {
      if (j == r) continue;
      TS_CHECK(post_recv(q, coll, (void *)q->srcs[j], len_r, j, TAG_REDUCE_SCATTER, 0));
    }
  }
  for (int s = 1; s < n; s++) { /* rank r+1 first, so sends spread over the peers */
    int j = (r + s) % n;
    TS_CHECK(
        post_send(q, coll, base + chunk_off(&k, j), chunk_len(&k, j), j, TAG_REDUCE_SCATTER, 0));
  }
  return TS_OK;
}

/* All-gather over chunks k as a direct exchange on the private
 * communicator: this rank's chunk (at send, or already at its place in
 * recv when in_place) goes to every other rank, and theirs land at their
 * places in recv. */
static ts_status ag_post(mpi_request *q, const chunks *k, const void *send, char *recv,
                         int in_place) {
  ts_comm *c = q->base.c;
  MPI_Comm coll = group_of(c)->coll;
  int n = c->size, r = c->rank;
  size_t own_len = chunk_len(k, r);
  char *own = recv + chunk_off(k, r);
  if (!in_place && own_len > 0) memcpy(own, send, own_len);
  TS_CHECK(req_reserve(q, exchange_slots(n, chunk_longest(k))));
  for (int j = 0; j < n; j++) {
    if (j != r)
      TS_CHECK(post_recv(q, coll, recv + chunk_off(k, j), chunk_len(k, j), j, TAG_ALL_GATHER, 0));
  }
  for (int s = 1; s < n; s++) {
    TS_CHECK(post_send(q, coll, own, own_len, (r + s) % n, TAG_ALL_GATHER, 0));
  }
  return TS_OK;
}

/* A barrier: an empty message from every rank to every other. */
static ts_status barrier_post(mpi_request *q) {
  ts_comm *c = q->base.c;
  MPI_Comm coll = group_of(c)->coll;
  int n = c->size, r = c->rank;
  TS_CHECK(req_reserve(q, 2 * (size_t)(n - 1)));
  for (int j = 0; j < n; j++) {
    if (j != r) TS_CHECK(post_recv(q, coll, NULL, 0, j, TAG_BARRIER, 1));
  }
  for (int s = 1; s < n; s++) TS_CHECK(post_send(q, coll, NULL, 0, (r + s) % n, TAG_BARRIER, 1));
  return TS_OK;
}

/* all_reduce_f64: every rank's doubles gathered, then reduced in rank
 * order here. */
static ts_status f64_run(ts_comm *c, const ts_comm_call *d) {
  if (d->count == 0) return TS_OK;
  size_t n = (size_t)c->size, nb = d->count * sizeof(double);
  mpi_group *g = group_of(c);
  if (g->f64_cap < n * d->count) { /* (N, count), kept for the next call */
    if (!grow((void **)&g->f64, n * d->count, sizeof(double)))
      return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", d->name, n * nb);
    g->f64_cap = n * d->count;
  }
  double *all = g->f64;
  chunks k = {d->count, sizeof(double), 0, c->size};
  mpi_request *q = NULL;
  ts_status st = req_new(c, d, &q);
  if (st == TS_OK) st = req_finish(q, ag_post(q, &k, d->buf, (char *)all, 0), NULL);
  if (st == TS_OK) ts_comm_reduce_f64_rank_order((double *)d->buf, all, n, d->count, d->reduce);
  return st;
}

/* Broadcast from d->root: the root sends the buffer (in pieces) to every
 * other rank on the private communicator. */
static ts_status bcast_post(mpi_request *q, const ts_comm_call *d) {
  ts_comm *c = q->base.c;
  MPI_Comm coll = group_of(c)->coll;
  int n = c->size, r = c->rank;
  size_t nb = d->count * ts_dtype_size(d->dt), k = npieces(nb, 0);
  if (r != d->root) {
    TS_CHECK(req_reserve(q, k));
    return post_recv(q, coll, d->buf, nb, d->root, TAG_BROADCAST, 0);
  }
  TS_CHECK(req_reserve(q, (size_t)(n - 1) * k));
  for (int s = 1; s < n; s++)
    TS_CHECK(post_send(q, coll, d->buf, nb, (r + s) % n, TAG_BROADCAST, 0));
  return TS_OK;
}

/* ---- point-to-point ------------------------------------------------------------------ */

/* MPI_Probe for a message from d->peer with d->tag, under the watchdog's
 * deadline when one is set. */
static ts_status probe(ts_comm *c, const ts_comm_call *d, MPI_Status *s) {
  MPI_Comm user = group_of(c)->user;
  if (ts_comm_timeout() <= 0)
    return MPI_ST(c, d->name, d->peer, MPI_Probe, (d->peer, d->tag, user, s));
  for (double t0 = 0;;) {
    int flag = 0;
    TS_CHECK(MPI_ST(c, d->name, d->peer, MPI_Iprobe, (d->peer, d->tag, user, &flag, s)));
    if (flag) return TS_OK;
    if (ts_comm_watchdog_expired(&t0)) {
      int peer = group_of(c)->world[d->peer];
      ts_comm_watchdog_fire(c->name, d->name, d->kind, &d->ctx, &peer, 1); /* no return */
    }
  }
}

/* Blocking receive of exactly d->count elements in pieces; a message of
 * another size fails naming both sizes and is consumed. */
static ts_status recv_now(ts_comm *c, const ts_comm_call *d) {
  MPI_Comm user = group_of(c)->user;
  const char *op = d->name;
  int peer = d->peer, tag = d->tag;
  size_t nb = d->count * ts_dtype_size(d->dt);
  for (size_t p = 0, k = npieces(nb, 1); p < k; p++) {
    char *at = (char *)d->buf + p * ts_comm_max_message;
    int len = piece_len(nb, p);
    MPI_Status s;
    int got = -1;
    TS_CHECK(probe(c, d, &s));
    TS_CHECK(MPI_ST(c, op, peer, MPI_Get_count, (&s, MPI_BYTE, &got)));
    if (got != len) { /* consume the message so it cannot match a later recv */
      void *tmp = ts_comm_alloc(got > 0 ? (size_t)got : 1, 0);
      if (tmp) MPI_Recv(tmp, got, MPI_BYTE, peer, tag, user, MPI_STATUS_IGNORE);
      ts_comm_dealloc(tmp);
      char piece[48] = "";
      if (k > 1) snprintf(piece, sizeof piece, " (piece %zu of %zu)", p + 1, k);
      return ts_set_error(TS_ERR_MPI,
                          "%s: expected %zu elements of %s (%d bytes%s) from rank %d with tag %d, "
                          "the message has %d bytes (%d elements), on group \"%s\" (rank %d of %d)",
                          op, d->count, ts_dtype_name(d->dt), len, piece, peer, tag, got,
                          got / (int)ts_dtype_size(d->dt), c->name, c->rank, c->size);
    }
    /* the probed message is there: this receive completes at once */
    TS_CHECK(
        MPI_ST(c, op, peer, MPI_Recv, (at, len, MPI_BYTE, peer, tag, user, MPI_STATUS_IGNORE)));
  }
  return TS_OK;
}

/* Starts an isend or irecv of d->buf on the user communicator, on q. */
static ts_status p2p_post(mpi_request *q, const ts_comm_call *d) {
  MPI_Comm user = group_of(q->base.c)->user;
  size_t nb = d->count * ts_dtype_size(d->dt);
  TS_CHECK(req_reserve(q, npieces(nb, 1)));
  if (d->kind == TS_COMM_CALL_SEND) return post_send(q, user, d->buf, nb, d->peer, d->tag, 1);
  return post_recv(q, user, d->buf, nb, d->peer, d->tag, 1);
}

/* ---- the table ------------------------------------------------------------------------ */

/* Runs or starts call d on group c (backend.h). */
static ts_status mpi_run(ts_comm *c, const ts_comm_call *d, ts_comm_request **req) {
  switch (d->kind) {
    case TS_COMM_CALL_ALL_REDUCE_F64: return f64_run(c, d);
    case TS_COMM_CALL_RECV:
      if (d->blocking) return recv_now(c, d);
      break;
    case TS_COMM_CALL_ALL_REDUCE:
      return ts_set_error(TS_ERR_INTERNAL, "%s: all-reduce reached the backend whole", d->name);
    default: break;
  }
  mpi_request *q = NULL;
  TS_CHECK(req_new(c, d, &q));
  ts_status st = TS_OK;
  if (d->kind == TS_COMM_CALL_REDUCE_SCATTER) {
    st = rs_start(q, d);
  } else if (d->kind == TS_COMM_CALL_ALL_GATHER) {
    chunks k = chunks_of(c, d);
    st = ag_post(q, &k, d->send, (char *)d->recv, d->in_place);
  } else if (d->kind == TS_COMM_CALL_BROADCAST) {
    st = bcast_post(q, d);
  } else if (d->kind == TS_COMM_CALL_BARRIER) {
    st = barrier_post(q);
  } else {
    st = p2p_post(q, d);
  }
  return req_finish(q, st, req);
}

/* Completes a request of this backend. */
static ts_status mpi_wait(ts_comm_request *req) { return req_complete((mpi_request *)req); }

static ts_status mpi_test(ts_comm_request *req, int *done) {
  return req_test((mpi_request *)req, done);
}

/* 1 if MPI is usable now (initialised, not finalised). */
static int mpi_live(void) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

/* Frees the group's communicators (while MPI is live) and their holder. */
static void mpi_free_group(ts_comm *c) {
  mpi_group *g = group_of(c);
  if (!g) return;
  if (mpi_live()) {
    if (g->coll != MPI_COMM_NULL) MPI_Comm_free(&g->coll);
    if (g->user != MPI_COMM_NULL) MPI_Comm_free(&g->user);
  }
  ts_comm_dealloc(g->world);
  ts_comm_dealloc(g->f64);
  ts_comm_dealloc(g);
  c->impl = NULL;
}

/* *out = (size,) the world rank of each rank of communicator comm (of
 * group c), ts_comm_alloc'd. */
static ts_status world_ranks(ts_comm *c, const char *op, MPI_Comm comm, int **out) {
  int n = c->size, *ranks = (int *)ts_comm_alloc(2 * (size_t)n * sizeof *ranks, 0);
  if (!ranks) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot allocate %d ranks", op, n);
  for (int i = 0; i < n; i++) ranks[n + i] = i;
  MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  ts_status st = MPI_ST(c, op, -1, MPI_Comm_group, (comm, &mine));
  if (st == TS_OK) st = MPI_ST(c, op, -1, MPI_Comm_group, (MPI_COMM_WORLD, &world));
  if (st == TS_OK)
    st = MPI_ST(c, op, -1, MPI_Group_translate_ranks, (mine, n, ranks + n, world, ranks));
  if (mine != MPI_GROUP_NULL) MPI_Group_free(&mine);
  if (world != MPI_GROUP_NULL) MPI_Group_free(&world);
  if (st != TS_OK) {
    ts_comm_dealloc(ranks);
    return st;
  }
  *out = ranks; /* the first n; the rest was the input */
  return TS_OK;
}

/* Wraps `user` (a new communicator we own; freed on failure) into a group:
 * error handler, rank and size, private duplicate. A communicator of one
 * rank is freed and the group goes to the local backend. */
static ts_status group_new(const char *op, MPI_Comm user, const char *name, ts_comm **out) {
  ts_comm *c = NULL;
  mpi_group *g = (mpi_group *)ts_comm_alloc(sizeof *g, 1);
  if (g) {
    g->user = user;
    g->coll = MPI_COMM_NULL;
  }
  ts_status st = g ? ts_comm_new(op, &ts_comm_mpi_backend, name, g, &c)
                   : ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot allocate a group", op);
  if (st != TS_OK) {
    ts_comm_dealloc(g);
    MPI_Comm_free(&user);
    return st;
  }
  TS_CHECK_GOTO(MPI_ST(NULL, op, -1, MPI_Comm_set_errhandler, (user, MPI_ERRORS_RETURN)), st, fail);
  TS_CHECK_GOTO(MPI_ST(NULL, op, -1, MPI_Comm_rank, (user, &c->rank)), st, fail);
  TS_CHECK_GOTO(MPI_ST(NULL, op, -1, MPI_Comm_size, (user, &c->size)), st, fail);
  if (c->size == 1) {
    ts_comm_free(c);
    return ts_comm_self_new(op, name, out);
  }
  TS_CHECK_GOTO(world_ranks(c, op, user, &g->world), st, fail);
  TS_CHECK_GOTO(ts_comm_set_nodes_of_world(c, g->world), st, fail);
  TS_CHECK_GOTO(MPI_GUARDED(c, op, MPI_Comm_dup, (user, &g->coll)), st, fail);
  TS_CHECK_GOTO(MPI_ST(c, op, -1, MPI_Comm_set_errhandler, (g->coll, MPI_ERRORS_RETURN)), st, fail);
  *out = c;
  return TS_OK;
fail:
  ts_comm_free(c);
  return st;
}

/* MPI_Comm_split of the parent's user communicator (backend.h). */
static ts_status mpi_split(ts_comm *parent, int color, int key, const char *name, ts_comm **out) {
  static const char *op = "ts_comm_split";
  MPI_Comm user = MPI_COMM_NULL;
  TS_CHECK(MPI_GUARDED(parent, op, MPI_Comm_split, (group_of(parent)->user, color, key, &user)));
  return group_new(op, user, name, out);
}

const ts_comm_backend ts_comm_mpi_backend = {
    .name = "mpi",
    .caps = {.moves = 1, .host_ranks = 1},
    .run = mpi_run,
    .wait = mpi_wait,
    .test = mpi_test,
    .split = mpi_split,
    .free_group = mpi_free_group,
    .drop_request = req_drop,
    .init_request = req_init,
    .request_bytes = sizeof(mpi_request),
};

ts_status ts_comm_mpi_world(ts_comm **out) {
  static const char *op = "ts_comm_world";
  if (!mpi_live()) {
    return ts_set_error(TS_ERR_INVALID_USAGE, "%s: MPI is not initialised (call ts_comm_init)", op);
  }
  MPI_Comm user = MPI_COMM_NULL;
  TS_CHECK(MPI_GUARDED(NULL, op, MPI_Comm_dup, (MPI_COMM_WORLD, &user)));
  return group_new(op, user, "world", out);
}

/* ---- the MPI library -------------------------------------------------------------- */

/* Every world rank's host name, for the watchdog (watchdog.c). */
static ts_status gather_hosts(const char *op) {
  int rank = 0, size = 1;
  TS_CHECK(MPI_ST(NULL, op, -1, MPI_Comm_rank, (MPI_COMM_WORLD, &rank)));
  TS_CHECK(MPI_ST(NULL, op, -1, MPI_Comm_size, (MPI_COMM_WORLD, &size)));
  char name[MPI_MAX_PROCESSOR_NAME + 1] = "", mine[TS_COMM_HOST_CHARS] = "";
  int len = 0;
  if (MPI_Get_processor_name(name, &len) != MPI_SUCCESS) snprintf(name, sizeof name, "?");
  snprintf(mine, sizeof mine, "%s", name);
  char(*hosts)[TS_COMM_HOST_CHARS] =
      (char(*)[TS_COMM_HOST_CHARS])ts_comm_alloc((size_t)size * TS_COMM_HOST_CHARS, 1);
  if (!hosts)
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot allocate %d host names", op, size);
  ts_status st = MPI_GUARDED(
      NULL, op, MPI_Allgather,
      (mine, TS_COMM_HOST_CHARS, MPI_CHAR, hosts, TS_COMM_HOST_CHARS, MPI_CHAR, MPI_COMM_WORLD));
  if (st != TS_OK) {
    ts_comm_dealloc(hosts);
    return st;
  }
  ts_comm_watchdog_set_hosts(rank, size, hosts);
  return TS_OK;
}

ts_status ts_comm_init(int *argc, char ***argv) {
  static const char *op = "ts_comm_init";
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (fin) return ts_set_error(TS_ERR_MPI, "%s: MPI was finalised already; it cannot restart", op);
  if (!init) {
    int provided = MPI_THREAD_SINGLE;
    TS_CHECK(MPI_GUARDED(NULL, op, MPI_Init_thread, (argc, argv, MPI_THREAD_MULTIPLE, &provided)));
    g_owns_mpi = 1;
    if (provided < MPI_THREAD_FUNNELED) {
      return ts_set_error(TS_ERR_MPI, "%s: MPI provides thread level %d, below MPI_THREAD_FUNNELED",
                          op, provided);
    }
  }
  int level = MPI_THREAD_SINGLE;
  TS_CHECK(MPI_ST(NULL, op, -1, MPI_Query_thread, (&level)));
  g_thread_multiple = level >= MPI_THREAD_MULTIPLE;
  TS_CHECK(MPI_ST(NULL, op, -1, MPI_Comm_set_errhandler, (MPI_COMM_WORLD, MPI_ERRORS_RETURN)));
  TS_CHECK(gather_hosts(op));
  g_initialized = 1;
  return TS_OK;
}

int ts_comm_initialized(void) { return g_initialized; }

int ts_comm_mpi_thread_multiple(void) { return g_initialized && g_thread_multiple; }

ts_status ts_comm_finalize(void) {
  g_initialized = 0;
  if (!g_owns_mpi) return TS_OK;
  g_owns_mpi = 0;
  if (!mpi_live()) return TS_OK;
  return MPI_ST(NULL, "ts_comm_finalize", -1, MPI_Finalize, ());
}

void ts_comm_abort(int code) {
  if (mpi_live()) MPI_Abort(MPI_COMM_WORLD, code);
  exit(code);
}
