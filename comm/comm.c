/*
 * comm.c — process groups and collectives on host memory over Open MPI 4.1
 * (the contract is comm.h).
 *
 * Invariants:
 * - A group of one rank (ts_comm_self, or an MPI group of size 1) takes the
 *   local path: it makes no MPI call, copies or adds locally, and never
 *   touches its counters.
 * - Every MPI communicator runs with MPI_ERRORS_RETURN; every MPI call goes
 *   through MPI_ST, which turns a failure into TS_ERR_MPI naming the tessera
 *   call, the MPI call and MPI's own message.
 * - An MPI group holds two communicators: `user` for MPI collectives
 *   (all-gather, broadcast, barrier) and the caller's send/recv, and a
 *   private duplicate `coll` for the collectives' own point-to-point messages
 *   (the reduce-scatter exchange), so that no user tag can match them.
 * - No MPI message exceeds g_max_message bytes (1 GiB): larger transfers are
 *   split into pieces sent in order with one tag (MPI's non-overtaking rule
 *   keeps them matched), and an all-gather too large for MPI's int counts and
 *   displacements becomes a direct point-to-point exchange. So element counts
 *   beyond INT_MAX work.
 * - Checks of counts, dtype, root, peer, tag and scratch size depend only on
 *   values every rank of a correct program shares (the *_scratch_bytes
 *   functions give the sizes), so such a bad call fails on every rank alike
 *   instead of leaving peers in a collective. Checks of pointers (NULL,
 *   overlap) and the in-place choice depend on each rank's own buffers:
 *   every rank must choose in place or not alike (MPI_Allgather needs
 *   MPI_IN_PLACE on all ranks or none), and a pointer bug on one rank fails
 *   that rank only, which then aborts the job (tools: ts_comm_abort).
 * - Reductions add the ranks' contributions in rank order, in fp32 for half
 *   dtypes, rounding once (comm.h "Determinism"); the summation runs on
 *   OpenMP threads over element tiles, which changes no element's order.
 */
#include "comm/comm.h"

#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_testing.h"
#include "base/floats.h"

struct ts_comm {
  int rank;                  /* this rank in the group, 0 .. size-1 */
  int size;                  /* ranks in the group, >= 1 */
  int mpi;                   /* 1: user and coll are communicators we own */
  MPI_Comm user;             /* MPI collectives and the caller's send/recv */
  MPI_Comm coll;             /* private duplicate: the collectives' point-to-point traffic */
  char name[32];             /* NUL-terminated, e.g. "world", "dp" */
  ts_comm_counters counters; /* bytes sent and calls made by this rank */
};

/* One MPI request of a ts_comm_request, for completion checks and messages. */
typedef struct msg_info {
  const char *call; /* the MPI call that started it, e.g. "MPI_Irecv" */
  int peer;         /* rank in the group, -1 for an MPI collective */
  int expect;       /* bytes a receive must deliver; -1 for sends and collectives */
} msg_info;

struct ts_comm_request {
  ts_comm *c;        /* the group (borrowed) */
  const char *op;    /* the public call that started it, for messages */
  size_t n, cap;     /* requests posted, allocated */
  MPI_Request *reqs; /* (cap,) */
  msg_info *info;    /* (cap,) */
  /* Reduce-scatter: what ts_comm_wait sums once the messages are in. */
  const void **srcs; /* (nsrc,) rank j's chunk: own data or a scratch slot; NULL if none */
  int nsrc;          /* group size */
  void *dst;         /* (count,) the result */
  size_t count;      /* elements of the own chunk */
  ts_dtype dt;
  int accumulate; /* add the previous dst last */
};

/* Tags on the private communicator (user tags never reach it). */
enum { TAG_REDUCE_SCATTER = 1, TAG_ALL_GATHER = 2 };

/* Largest message in bytes, <= INT_MAX (see comm_testing.h). */
static size_t g_max_message = (size_t)1 << 30;
/* 1 between ts_comm_init and ts_comm_finalize. */
static int g_initialized;
/* 1 if ts_comm_init called MPI_Init_thread (then finalize finalises). */
static int g_owns_mpi;

/* Element tile of the summation and the size below which it stays on one thread. */
#define SUM_TILE 1024
#define SUM_PARALLEL_MIN ((size_t)1 << 16)

size_t ts_comm_testing_set_max_message_bytes(size_t nbytes) {
  size_t old = g_max_message;
  if (nbytes < 1) nbytes = 1;
  if (nbytes > ((size_t)1 << 30)) nbytes = (size_t)1 << 30;
  g_max_message = nbytes;
  return old;
}

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

/* ---- argument checks ---------------------------------------------------------- */

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

static ts_status check_peer(const ts_comm *c, const char *op, int peer, int tag) {
  if (peer < 0 || peer >= c->size || peer == c->rank) {
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: peer %d is not another rank of group \"%s\" (rank %d of %d)", op, peer,
                        c->name, c->rank, c->size);
  }
  if (tag < 0) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: tag %d < 0", op, tag);
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

/* Charges one call of kind k sending `bytes`; one-rank groups count nothing. */
static void charge(ts_comm *c, ts_comm_kind k, uint64_t bytes) {
  if (c->size == 1) return;
  c->counters.bytes[k] += bytes;
  c->counters.calls[k] += 1;
}

const ts_comm_counters *ts_comm_get_counters(const ts_comm *c) { return &c->counters; }

uint64_t ts_comm_bytes_sent(const ts_comm *c) {
  uint64_t sum = 0;
  for (int k = 0; k < TS_COMM_NUM_KINDS; k++) sum += c->counters.bytes[k];
  return sum;
}

void ts_comm_reset_counters(ts_comm *c) { memset(&c->counters, 0, sizeof c->counters); }

/* ---- rank-order summation ------------------------------------------------------- */

/* acc[0..m) = element lo.. of x (widened to fp32). */
static void load_tile(float *acc, const void *x, size_t lo, size_t m, ts_dtype dt) {
  if (dt == TS_FP32) {
    memcpy(acc, (const float *)x + lo, m * sizeof(float));
  } else if (dt == TS_BF16) {
    const uint16_t *h = (const uint16_t *)x + lo;
    for (size_t i = 0; i < m; i++) acc[i] = ts_bf16_to_f32(h[i]);
  } else {
    const uint16_t *h = (const uint16_t *)x + lo;
    for (size_t i = 0; i < m; i++) acc[i] = ts_f16_to_f32(h[i]);
  }
}

/* acc[0..m) += element lo.. of x, one fp32 addition per element. */
static void add_tile(float *acc, const void *x, size_t lo, size_t m, ts_dtype dt) {
  if (dt == TS_FP32) {
    const float *f = (const float *)x + lo;
    for (size_t i = 0; i < m; i++) acc[i] = ts_fadd(acc[i], f[i]);
  } else if (dt == TS_BF16) {
    const uint16_t *h = (const uint16_t *)x + lo;
    for (size_t i = 0; i < m; i++) acc[i] = ts_fadd(acc[i], ts_bf16_to_f32(h[i]));
  } else {
    const uint16_t *h = (const uint16_t *)x + lo;
    for (size_t i = 0; i < m; i++) acc[i] = ts_fadd(acc[i], ts_f16_to_f32(h[i]));
  }
}

/* element lo.. of y = acc[0..m), rounded once to dt (nearest even). */
static void store_tile(void *y, const float *acc, size_t lo, size_t m, ts_dtype dt) {
  if (dt == TS_FP32) {
    memcpy((float *)y + lo, acc, m * sizeof(float));
  } else if (dt == TS_BF16) {
    uint16_t *h = (uint16_t *)y + lo;
    for (size_t i = 0; i < m; i++) h[i] = ts_f32_to_bf16(acc[i]);
  } else {
    uint16_t *h = (uint16_t *)y + lo;
    for (size_t i = 0; i < m; i++) h[i] = ts_f32_to_f16(acc[i]);
  }
}

/* dst (count,) = ((src[0] + src[1]) + ... + src[n-1]) [+ dst], element-wise in
 * fp32, rounded once. dst may equal one of src (each tile is read in full
 * before it is written). */
static void sum_rank_order(void *dst, const void *const *src, int n, size_t count, ts_dtype dt,
                           int accumulate) {
  size_t ntiles = (count + SUM_TILE - 1) / SUM_TILE;
#pragma omp parallel for schedule(static) if (count >= SUM_PARALLEL_MIN)
  for (size_t t = 0; t < ntiles; t++) {
    float acc[SUM_TILE];
    size_t lo = t * SUM_TILE;
    size_t m = count - lo < SUM_TILE ? count - lo : SUM_TILE;
    load_tile(acc, src[0], lo, m, dt);
    for (int j = 1; j < n; j++) add_tile(acc, src[j], lo, m, dt);
    if (accumulate) add_tile(acc, dst, lo, m, dt);
    store_tile(dst, acc, lo, m, dt);
  }
}

/* ---- requests ------------------------------------------------------------------- */

static ts_status req_new(ts_comm *c, const char *op, ts_comm_request **out) {
  ts_comm_request *q = (ts_comm_request *)calloc(1, sizeof *q);
  if (!q) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot allocate a request", op);
  q->c = c;
  q->op = op;
  *out = q;
  return TS_OK;
}

/* Makes room for `more` requests beyond those posted. A start reserves
 * all its slots before it posts anything (post_send and post_recv assert
 * the room), so that only an MPI error can interrupt it half-posted (see
 * req_abandon). */
static ts_status req_reserve(ts_comm_request *q, size_t more) {
  if (q->n + more <= q->cap) return TS_OK;
  size_t cap = q->cap ? 2 * q->cap : 8;
  while (cap < q->n + more) cap *= 2;
  MPI_Request *r = (MPI_Request *)realloc(q->reqs, cap * sizeof *r);
  if (r) q->reqs = r;
  msg_info *m = r ? (msg_info *)realloc(q->info, cap * sizeof *m) : NULL;
  if (m) q->info = m;
  if (!r || !m) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot grow a request", q->op);
  q->cap = cap;
  return TS_OK;
}

/* Records the request *slot just started by `call`. */
static void req_push(ts_comm_request *q, const char *call, int peer, int expect) {
  q->info[q->n].call = call;
  q->info[q->n].peer = peer;
  q->info[q->n].expect = expect;
  q->n++;
}

/* Pieces a transfer of nbytes is split into; at least one if min_one. */
static size_t npieces(size_t nbytes, int min_one) {
  size_t k = (nbytes + g_max_message - 1) / g_max_message;
  return k == 0 && min_one ? 1 : k;
}

/* Bytes of piece p (at byte p * g_max_message) of a transfer of nbytes. */
static int piece_len(size_t nbytes, size_t p) {
  size_t rest = nbytes - p * g_max_message;
  return (int)(rest < g_max_message ? rest : g_max_message);
}

/* Requests a direct exchange among n ranks may post: a send to and a
 * receive from each of the n-1 others, each at most `longest` bytes. */
static size_t exchange_slots(int n, size_t longest) {
  return 2 * (size_t)(n - 1) * npieces(longest, 0);
}

/* Starts the MPI_Isend of nbytes at buf to peer, in pieces. */
static ts_status post_send(ts_comm_request *q, MPI_Comm comm, const void *buf, size_t nbytes,
                           int peer, int tag, int min_one) {
  size_t k = npieces(nbytes, min_one);
  for (size_t p = 0; p < k; p++) {
    const char *at = (const char *)buf + p * g_max_message;
    int len = piece_len(nbytes, p);
    TS_ASSERT(q->n < q->cap); /* reserved by the start */
    TS_CHECK(
        MPI_ST(q->c, q->op, peer, MPI_Isend, (at, len, MPI_BYTE, peer, tag, comm, &q->reqs[q->n])));
    req_push(q, "MPI_Isend", peer, -1);
  }
  return TS_OK;
}

/* Starts the MPI_Irecv of nbytes into buf from peer, in pieces. */
static ts_status post_recv(ts_comm_request *q, MPI_Comm comm, void *buf, size_t nbytes, int peer,
                           int tag, int min_one) {
  size_t k = npieces(nbytes, min_one);
  for (size_t p = 0; p < k; p++) {
    char *at = (char *)buf + p * g_max_message;
    int len = piece_len(nbytes, p);
    TS_ASSERT(q->n < q->cap); /* reserved by the start */
    TS_CHECK(
        MPI_ST(q->c, q->op, peer, MPI_Irecv, (at, len, MPI_BYTE, peer, tag, comm, &q->reqs[q->n])));
    req_push(q, "MPI_Irecv", peer, len);
  }
  return TS_OK;
}

static void req_free(ts_comm_request *q) {
  free(q->reqs);
  free(q->info);
  free(q->srcs);
  free(q);
}

/* Frees q without completing it, after an MPI error while posting (every
 * slot was reserved first, so nothing else interrupts a start). Posted
 * receives are cancelled and waited for, so none writes into a buffer
 * after this returns. Posted sends are released to MPI: after an MPI error
 * MPI's state is undefined (MPI-3.1 §8.3) and the caller aborts the job
 * (tools call ts_comm_abort), so they are not waited for, since a peer
 * that never posts the matching receive would hang this rank. */
static void req_abandon(ts_comm_request *q) {
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

/* Completes every request of q (all of them, even after a failure, so no
 * buffer stays in MPI's hands), checks received sizes, sums a
 * reduce-scatter, and frees q. Returns the first failure. */
static ts_status req_complete(ts_comm_request *q) {
  ts_status st = TS_OK;
  for (size_t i = 0; i < q->n; i++) {
    MPI_Status s;
    int rc = MPI_Wait(&q->reqs[i], &s);
    const msg_info *m = &q->info[i];
    if (st != TS_OK) continue;
    if (rc != MPI_SUCCESS) {
      int cls = MPI_ERR_OTHER;
      MPI_Error_class(rc, &cls);
      st = mpi_status(rc, q->c, q->op, m->call, m->peer);
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
                          q->op, m->expect, m->peer, got, q->c->name, q->c->rank, q->c->size);
      }
    }
  }
  if (st == TS_OK && q->srcs) {
    sum_rank_order(q->dst, q->srcs, q->nsrc, q->count, q->dt, q->accumulate);
  }
  req_free(q);
  return st;
}

ts_status ts_comm_wait(ts_comm_request *req) {
  if (!req) return TS_OK;
  return req_complete(req);
}

/* Ends a start: after a failure while posting (st) abandons q; else gives q
 * to the caller (non-blocking, req != NULL) or completes it (blocking). */
static ts_status req_finish(ts_comm_request *q, ts_status st, ts_comm_request **req) {
  if (st != TS_OK) {
    req_abandon(q);
    return st;
  }
  if (req) {
    *req = q;
    return TS_OK;
  }
  return req_complete(q);
}

/* ---- the MPI library -------------------------------------------------------------- */

/* 1 if MPI is usable now (initialised, not finalised). */
static int mpi_live(void) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

ts_status ts_comm_init(int *argc, char ***argv) {
  static const char *op = "ts_comm_init";
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (fin) return ts_set_error(TS_ERR_MPI, "%s: MPI was finalised already; it cannot restart", op);
  if (!init) {
    int provided = MPI_THREAD_SINGLE;
    TS_CHECK(MPI_ST(NULL, op, -1, MPI_Init_thread, (argc, argv, MPI_THREAD_FUNNELED, &provided)));
    g_owns_mpi = 1;
    if (provided < MPI_THREAD_FUNNELED) {
      return ts_set_error(TS_ERR_MPI, "%s: MPI provides thread level %d, below MPI_THREAD_FUNNELED",
                          op, provided);
    }
  }
  TS_CHECK(MPI_ST(NULL, op, -1, MPI_Comm_set_errhandler, (MPI_COMM_WORLD, MPI_ERRORS_RETURN)));
  g_initialized = 1;
  return TS_OK;
}

int ts_comm_initialized(void) { return g_initialized; }

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

/* ---- groups --------------------------------------------------------------------- */

static void set_name(ts_comm *c, const char *name) {
  snprintf(c->name, sizeof c->name, "%s", name ? name : "");
}

static ts_status new_self(const char *op, const char *name, ts_comm **out) {
  ts_comm *c = (ts_comm *)calloc(1, sizeof *c);
  if (!c) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot allocate a group", op);
  c->rank = 0;
  c->size = 1;
  c->mpi = 0;
  c->user = MPI_COMM_NULL;
  c->coll = MPI_COMM_NULL;
  set_name(c, name);
  *out = c;
  return TS_OK;
}

/* Wraps `user` (a new communicator we own; freed on failure) into a group:
 * error handler, private duplicate, rank and size. */
static ts_status new_mpi(const char *op, MPI_Comm user, const char *name, ts_comm **out) {
  ts_status st = TS_OK;
  ts_comm *c = (ts_comm *)calloc(1, sizeof *c);
  if (!c) {
    MPI_Comm_free(&user);
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot allocate a group", op);
  }
  c->mpi = 1;
  c->user = user;
  c->coll = MPI_COMM_NULL;
  set_name(c, name);
  TS_CHECK_GOTO(MPI_ST(NULL, op, -1, MPI_Comm_set_errhandler, (user, MPI_ERRORS_RETURN)), st, fail);
  TS_CHECK_GOTO(MPI_ST(NULL, op, -1, MPI_Comm_rank, (user, &c->rank)), st, fail);
  TS_CHECK_GOTO(MPI_ST(NULL, op, -1, MPI_Comm_size, (user, &c->size)), st, fail);
  TS_CHECK_GOTO(MPI_ST(c, op, -1, MPI_Comm_dup, (user, &c->coll)), st, fail);
  TS_CHECK_GOTO(MPI_ST(c, op, -1, MPI_Comm_set_errhandler, (c->coll, MPI_ERRORS_RETURN)), st, fail);
  *out = c;
  return TS_OK;
fail:
  ts_comm_free(c);
  return st;
}

ts_status ts_comm_world(ts_comm **out) {
  static const char *op = "ts_comm_world";
  if (!mpi_live()) {
    return ts_set_error(TS_ERR_INVALID_USAGE, "%s: MPI is not initialised (call ts_comm_init)", op);
  }
  MPI_Comm user = MPI_COMM_NULL;
  TS_CHECK(MPI_ST(NULL, op, -1, MPI_Comm_dup, (MPI_COMM_WORLD, &user)));
  return new_mpi(op, user, "world", out);
}

ts_status ts_comm_self(ts_comm **out) { return new_self("ts_comm_self", "self", out); }

ts_status ts_comm_split(ts_comm *parent, int color, int key, const char *name, ts_comm **out) {
  static const char *op = "ts_comm_split";
  if (color < 0) {
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: color %d < 0 (group \"%s\")", op, color,
                        name ? name : "");
  }
  if (!parent->mpi) return new_self(op, name, out);
  MPI_Comm user = MPI_COMM_NULL;
  TS_CHECK(MPI_ST(parent, op, -1, MPI_Comm_split, (parent->user, color, key, &user)));
  return new_mpi(op, user, name, out);
}

void ts_comm_free(ts_comm *c) {
  if (!c) return;
  if (c->mpi && mpi_live()) {
    if (c->coll != MPI_COMM_NULL) MPI_Comm_free(&c->coll);
    if (c->user != MPI_COMM_NULL) MPI_Comm_free(&c->user);
  }
  free(c);
}

int ts_comm_rank(const ts_comm *c) { return c->rank; }
int ts_comm_size(const ts_comm *c) { return c->size; }
const char *ts_comm_name(const ts_comm *c) { return c->name; }

/* ---- collectives ------------------------------------------------------------------ */

ts_status ts_comm_barrier(ts_comm *c) {
  if (c->size == 1) return TS_OK;
  return MPI_ST(c, "ts_comm_barrier", -1, MPI_Barrier, (c->user));
}

/* (N-1) * chunk elements of dt, saturating at SIZE_MAX (too big for any scratch). */
size_t ts_comm_reduce_scatter_scratch_bytes_n(size_t ranks, size_t chunk, ts_dtype dt) {
  size_t es = ts_dtype_size(dt), n = ranks - 1;
  if (ranks <= 1) return 0;
  if (chunk > SIZE_MAX / es / n) return SIZE_MAX;
  return n * chunk * es;
}

static size_t scratch_for(const ts_comm *c, size_t chunk, ts_dtype dt) {
  return ts_comm_reduce_scatter_scratch_bytes_n((size_t)c->size, chunk, dt);
}

size_t ts_comm_reduce_scatter_scratch_bytes(const ts_comm *c, size_t count, ts_dtype dt) {
  return scratch_for(c, count, dt);
}

/* Chunk j of `count` elements over n ranks: [j*count/n, (j+1)*count/n),
 * computed without overflowing j*count. */
static size_t chunk_lo(size_t count, int n, int j) {
  size_t q = count / (size_t)n, m = count % (size_t)n;
  return q * (size_t)j + m * (size_t)j / (size_t)n;
}

/* The longest chunk_lo chunk: ceil(count / n) elements. */
static size_t chunk_max(size_t count, int n) {
  return count / (size_t)n + (count % (size_t)n != 0);
}

size_t ts_comm_all_reduce_scratch_bytes(const ts_comm *c, size_t count, ts_dtype dt) {
  return scratch_for(c, chunk_max(count, c->size), dt);
}

/* Starts a reduce-scatter's direct exchange on q over an MPI group: chunk j
 * of `base` goes to rank j, and the other ranks' chunks r arrive in scratch
 * slots of len_r elements (slot j for j < r, j - 1 for j > r). Chunk j is
 * elements [j*count, (j+1)*count) (reduce-scatter), or with `uneven`
 * [j*count/N, (j+1)*count/N) of `count` in all (all-reduce). Sets q to sum
 * the chunks in rank order into dst when it completes. */
static ts_status exchange_start(ts_comm_request *q, const char *base, size_t count, int uneven,
                                ts_dtype dt, void *dst, int accumulate, char *scratch) {
  ts_comm *c = q->c;
  int n = c->size, r = c->rank;
  size_t es = ts_dtype_size(dt);
  size_t lo_r = uneven ? chunk_lo(count, n, r) : (size_t)r * count;
  size_t len_r = uneven ? chunk_lo(count, n, r + 1) - lo_r : count;
  q->srcs = (const void **)calloc((size_t)n, sizeof *q->srcs);
  if (!q->srcs)
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot allocate %d pointers", q->op, n);
  q->nsrc = n;
  q->dst = dst;
  q->count = len_r;
  q->dt = dt;
  q->accumulate = accumulate;
  for (int j = 0; j < n; j++) { /* scratch may be NULL when there is nothing to receive */
    if (j == r) {
      q->srcs[j] = base + lo_r * es;
    } else if (len_r > 0) {
      q->srcs[j] = scratch + (size_t)(j < r ? j : j - 1) * len_r * es;
    }
  }
  TS_CHECK(req_reserve(q, exchange_slots(n, (uneven ? chunk_max(count, n) : count) * es)));
  if (len_r > 0) {
    for (int j = 0; j < n; j++) {
      if (j == r) continue;
      TS_CHECK(post_recv(q, c->coll, (void *)q->srcs[j], len_r * es, j, TAG_REDUCE_SCATTER, 0));
    }
  }
  for (int d = 1; d < n; d++) { /* rank r+1 first, so sends spread over the peers */
    int j = (r + d) % n;
    size_t lo_j = uneven ? chunk_lo(count, n, j) : (size_t)j * count;
    size_t len_j = uneven ? chunk_lo(count, n, j + 1) - lo_j : count;
    TS_CHECK(post_send(q, c->coll, base + lo_j * es, len_j * es, j, TAG_REDUCE_SCATTER, 0));
  }
  return TS_OK;
}

/* Checks a collective's (N, count) buffer `whole` and (count,) buffer `part`
 * in dt: part may be the own chunk whole + r*count (*in_place = 1), else the
 * two must not overlap. */
static ts_status check_whole_part(const ts_comm *c, const char *op, const char *whole_name,
                                  const void *whole, const char *part_name, const void *part,
                                  size_t count, ts_dtype dt, int *in_place) {
  TS_CHECK(check_dtype(op, dt));
  size_t es = ts_dtype_size(dt);
  TS_CHECK(check_count(op, count, es, (size_t)c->size));
  size_t nb = count * es, whole_bytes = nb * (size_t)c->size;
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

/* Checks a reduce-scatter's arguments (see the file comment for which
 * verdicts every rank shares). */
static ts_status rs_check(const ts_comm *c, const char *op, const void *send, void *recv,
                          size_t count, ts_dtype dt, int accumulate, const void *scratch,
                          size_t scratch_bytes) {
  int in_place = 0;
  TS_CHECK(check_whole_part(c, op, "send", send, "recv", recv, count, dt, &in_place));
  if (in_place && accumulate && count > 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: accumulate in place: recv is this rank's chunk of send, so there "
                        "is no previous recv to add; pass a separate recv",
                        op);
  size_t es = ts_dtype_size(dt), nb = count * es, send_bytes = nb * (size_t)c->size;
  size_t need = ts_comm_reduce_scatter_scratch_bytes(c, count, dt);
  if (scratch_bytes < need) {
    return ts_set_error(
        TS_ERR_INVALID_ARGUMENT,
        "%s: scratch has %zu bytes, needs %zu ((N-1)*count*%zu with N=%d, count=%zu)", op,
        scratch_bytes, need, es, c->size, count);
  }
  if (need > 0) {
    TS_CHECK(check_ptr(op, "scratch", scratch, need));
    if (overlap(scratch, need, send, send_bytes) || overlap(scratch, need, recv, nb)) {
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: scratch overlaps send or recv", op);
    }
  }
  return TS_OK;
}

/* One-rank reduce-scatter: recv = send [+ recv]. */
static void rs_local(const void *send, void *recv, size_t count, ts_dtype dt, int accumulate) {
  if (accumulate) {
    const void *src[1] = {send};
    sum_rank_order(recv, src, 1, count, dt, 1);
  } else if (recv != send) {
    memcpy(recv, send, count * ts_dtype_size(dt));
  }
}

/* Validates, charges and runs (req NULL) or starts a reduce-scatter. */
static ts_status rs_run(ts_comm *c, const char *op, const void *send, void *recv, size_t count,
                        ts_dtype dt, int accumulate, void *scratch, size_t scratch_bytes,
                        ts_comm_request **req) {
  TS_CHECK(rs_check(c, op, send, recv, count, dt, accumulate, scratch, scratch_bytes));
  ts_comm_request *q = NULL;
  TS_CHECK(req_new(c, op, &q));
  ts_status st = TS_OK;
  if (c->size == 1) {
    rs_local(send, recv, count, dt, accumulate);
  } else {
    charge(c, TS_COMM_REDUCE_SCATTER, (uint64_t)(c->size - 1) * count * ts_dtype_size(dt));
    st = exchange_start(q, (const char *)send, count, 0, dt, recv, accumulate, (char *)scratch);
  }
  return req_finish(q, st, req);
}

ts_status ts_comm_reduce_scatter(ts_comm *c, const void *send, void *recv, size_t count,
                                 ts_dtype dt, int accumulate, void *scratch, size_t scratch_bytes) {
  return rs_run(c, "ts_comm_reduce_scatter", send, recv, count, dt, accumulate, scratch,
                scratch_bytes, NULL);
}

ts_status ts_comm_ireduce_scatter(ts_comm *c, const void *send, void *recv, size_t count,
                                  ts_dtype dt, int accumulate, void *scratch, size_t scratch_bytes,
                                  ts_comm_request **req) {
  return rs_run(c, "ts_comm_ireduce_scatter", send, recv, count, dt, accumulate, scratch,
                scratch_bytes, req);
}

/* All-gather of nb bytes per rank over an MPI group. MPI_(I)Allgather when
 * nb fits MPI's counts, else a direct exchange on the private communicator.
 * Non-blocking pieces go on q; blocking ones complete here. */
static ts_status ag_post(ts_comm_request *q, int nonblocking, const void *send, char *recv,
                         size_t nb, int in_place) {
  ts_comm *c = q->c;
  if (nb <= g_max_message) {
    const void *sb = in_place ? MPI_IN_PLACE : send;
    if (!nonblocking) {
      return MPI_ST(c, q->op, -1, MPI_Allgather,
                    (sb, (int)nb, MPI_BYTE, recv, (int)nb, MPI_BYTE, c->user));
    }
    TS_CHECK(req_reserve(q, 1));
    TS_CHECK(MPI_ST(c, q->op, -1, MPI_Iallgather,
                    (sb, (int)nb, MPI_BYTE, recv, (int)nb, MPI_BYTE, c->user, &q->reqs[q->n])));
    req_push(q, "MPI_Iallgather", -1, -1);
    return TS_OK;
  }
  char *own = recv + (size_t)c->rank * nb;
  if (!in_place) memcpy(own, send, nb);
  TS_CHECK(req_reserve(q, exchange_slots(c->size, nb)));
  for (int j = 0; j < c->size; j++) {
    if (j != c->rank)
      TS_CHECK(post_recv(q, c->coll, recv + (size_t)j * nb, nb, j, TAG_ALL_GATHER, 0));
  }
  for (int d = 1; d < c->size; d++) {
    TS_CHECK(post_send(q, c->coll, own, nb, (c->rank + d) % c->size, TAG_ALL_GATHER, 0));
  }
  return TS_OK;
}

/* Validates, charges and runs (blocking) or starts (req != NULL) an all-gather. */
static ts_status ag_run(ts_comm *c, const char *op, const void *send, void *recv, size_t count,
                        ts_dtype dt, ts_comm_request **req) {
  int in_place = 0; /* send is recv + r*count */
  TS_CHECK(check_whole_part(c, op, "recv", recv, "send", send, count, dt, &in_place));
  size_t nb = count * ts_dtype_size(dt);
  ts_comm_request *q = NULL;
  TS_CHECK(req_new(c, op, &q));
  ts_status st = TS_OK;
  if (c->size == 1) {
    if (!in_place) memcpy(recv, send, nb);
  } else {
    charge(c, TS_COMM_ALL_GATHER, (uint64_t)(c->size - 1) * nb);
    st = ag_post(q, req != NULL, send, (char *)recv, nb, in_place);
  }
  return req_finish(q, st, req);
}

ts_status ts_comm_all_gather(ts_comm *c, const void *send, void *recv, size_t count, ts_dtype dt) {
  return ag_run(c, "ts_comm_all_gather", send, recv, count, dt, NULL);
}

ts_status ts_comm_iall_gather(ts_comm *c, const void *send, void *recv, size_t count, ts_dtype dt,
                              ts_comm_request **req) {
  return ag_run(c, "ts_comm_iall_gather", send, recv, count, dt, req);
}

/* In-place all-gather of the uneven chunks [j*count/N, (j+1)*count/N) of buf
 * (MPI_Allgatherv when the byte offsets fit an int, else a direct exchange),
 * pieces on q. */
static ts_status agv_post(ts_comm_request *q, char *buf, size_t count, size_t es) {
  ts_comm *c = q->c;
  int n = c->size, r = c->rank;
  if (count * es <= g_max_message) {
    int *counts = (int *)malloc(2 * (size_t)n * sizeof *counts);
    if (!counts) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot allocate counts", q->op);
    int *displs = counts + n;
    for (int j = 0; j < n; j++) {
      displs[j] = (int)(chunk_lo(count, n, j) * es);
      counts[j] = (int)(chunk_lo(count, n, j + 1) * es) - displs[j];
    }
    ts_status st =
        MPI_ST(c, q->op, -1, MPI_Allgatherv,
               (MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, MPI_BYTE, c->user));
    free(counts);
    return st;
  }
  size_t lo_r = chunk_lo(count, n, r), len_r = chunk_lo(count, n, r + 1) - lo_r;
  TS_CHECK(req_reserve(q, exchange_slots(n, chunk_max(count, n) * es)));
  for (int j = 0; j < n; j++) {
    size_t lo = chunk_lo(count, n, j), len = chunk_lo(count, n, j + 1) - lo;
    if (j != r) TS_CHECK(post_recv(q, c->coll, buf + lo * es, len * es, j, TAG_ALL_GATHER, 0));
  }
  for (int d = 1; d < n; d++) {
    TS_CHECK(post_send(q, c->coll, buf + lo_r * es, len_r * es, (r + d) % n, TAG_ALL_GATHER, 0));
  }
  return TS_OK;
}

ts_status ts_comm_all_reduce(ts_comm *c, void *buf, size_t count, ts_dtype dt, void *scratch,
                             size_t scratch_bytes) {
  static const char *op = "ts_comm_all_reduce";
  TS_CHECK(check_dtype(op, dt));
  size_t es = ts_dtype_size(dt);
  TS_CHECK(check_count(op, count, es, 1));
  TS_CHECK(check_ptr(op, "buf", buf, count * es));
  size_t need = ts_comm_all_reduce_scratch_bytes(c, count, dt);
  if (scratch_bytes < need) {
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: scratch has %zu bytes, needs %zu ((N-1)*ceil(count/N)*%zu with N=%d, "
                        "count=%zu)",
                        op, scratch_bytes, need, es, c->size, count);
  }
  if (need > 0) {
    TS_CHECK(check_ptr(op, "scratch", scratch, need));
    if (overlap(scratch, need, buf, count * es)) {
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: scratch overlaps buf", op);
    }
  }
  if (c->size == 1) return TS_OK;
  int n = c->size, r = c->rank;
  size_t lo_r = chunk_lo(count, n, r), len_r = chunk_lo(count, n, r + 1) - lo_r;
  /* Reduce-scatter: every chunk but the own one; all-gather: the own chunk
   * to each of the N-1 others. 2 (N-1)/N of the buffer when N divides it. */
  charge(c, TS_COMM_ALL_REDUCE, ((uint64_t)(count - len_r) + (uint64_t)(n - 1) * len_r) * es);
  char *base = (char *)buf;
  ts_comm_request *q = NULL;
  TS_CHECK(req_new(c, op, &q));
  ts_status st = exchange_start(q, base, count, 1, dt, base + lo_r * es, 0, (char *)scratch);
  TS_CHECK(req_finish(q, st, NULL)); /* the own chunk now holds the rank-order sum */
  TS_CHECK(req_new(c, op, &q));
  return req_finish(q, agv_post(q, base, count, es), NULL);
}

/* acc combined with x under op; NaN propagates through max and min. */
static double combine(double acc, double x, ts_comm_op op) {
  if (op == TS_COMM_SUM) return acc + x;
  if (acc != acc) return acc;
  if (x != x) return x;
  if (op == TS_COMM_MAX) return x > acc ? x : acc;
  return x < acc ? x : acc;
}

ts_status ts_comm_all_reduce_f64(ts_comm *c, double *buf, size_t count, ts_comm_op op) {
  static const char *name = "ts_comm_all_reduce_f64";
  if (op != TS_COMM_SUM && op != TS_COMM_MAX && op != TS_COMM_MIN) {
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: op %d is not sum, max or min", name, (int)op);
  }
  TS_CHECK(check_count(name, count, sizeof(double), (size_t)c->size));
  TS_CHECK(check_ptr(name, "buf", buf, count * sizeof(double)));
  if (c->size == 1) return TS_OK;
  size_t n = (size_t)c->size, nb = count * sizeof(double);
  charge(c, TS_COMM_ALL_REDUCE, (uint64_t)(n - 1) * nb);
  if (count == 0) return TS_OK;
  double *all = (double *)malloc(n * nb); /* (N, count) */
  if (!all) {
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", name, n * nb);
  }
  ts_comm_request *q = NULL;
  ts_status st = req_new(c, name, &q);
  if (st == TS_OK) st = req_finish(q, ag_post(q, 0, buf, (char *)all, nb, 0), NULL);
  if (st == TS_OK) {
    for (size_t i = 0; i < count; i++) {
      double acc = all[i];
      for (size_t j = 1; j < n; j++) acc = combine(acc, all[j * count + i], op);
      buf[i] = acc;
    }
  }
  free(all);
  return st;
}

/* Validates, charges and runs or starts (req != NULL) a broadcast. */
static ts_status bcast_run(ts_comm *c, const char *op, void *buf, size_t count, ts_dtype dt,
                           int root, ts_comm_request **req) {
  TS_CHECK(check_dtype(op, dt));
  if (root < 0 || root >= c->size) {
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: root %d is not a rank of group \"%s\" (size %d)", op, root, c->name,
                        c->size);
  }
  size_t es = ts_dtype_size(dt);
  TS_CHECK(check_count(op, count, es, (size_t)c->size));
  size_t nb = count * es;
  TS_CHECK(check_ptr(op, "buf", buf, nb));
  ts_comm_request *q = NULL;
  TS_CHECK(req_new(c, op, &q));
  ts_status st = TS_OK;
  if (c->size > 1) charge(c, TS_COMM_BROADCAST, c->rank == root ? (uint64_t)(c->size - 1) * nb : 0);
  if (req && c->size > 1) st = req_reserve(q, npieces(nb, 0));
  for (size_t p = 0, k = c->size > 1 ? npieces(nb, 0) : 0; p < k && st == TS_OK; p++) {
    char *at = (char *)buf + p * g_max_message;
    int len = piece_len(nb, p);
    if (!req) {
      st = MPI_ST(c, op, -1, MPI_Bcast, (at, len, MPI_BYTE, root, c->user));
      continue;
    }
    st = MPI_ST(c, op, -1, MPI_Ibcast, (at, len, MPI_BYTE, root, c->user, &q->reqs[q->n]));
    if (st == TS_OK) req_push(q, "MPI_Ibcast", -1, -1);
  }
  return req_finish(q, st, req);
}

ts_status ts_comm_broadcast(ts_comm *c, void *buf, size_t count, ts_dtype dt, int root) {
  return bcast_run(c, "ts_comm_broadcast", buf, count, dt, root, NULL);
}

ts_status ts_comm_ibroadcast(ts_comm *c, void *buf, size_t count, ts_dtype dt, int root,
                             ts_comm_request **req) {
  return bcast_run(c, "ts_comm_ibroadcast", buf, count, dt, root, req);
}

/* ---- point-to-point ---------------------------------------------------------------- */

/* Checks a send/recv's arguments; *nbytes receives the byte count. */
static ts_status p2p_check(const ts_comm *c, const char *op, const void *buf, size_t count,
                           ts_dtype dt, int peer, int tag, size_t *nbytes) {
  TS_CHECK(check_dtype(op, dt));
  TS_CHECK(check_peer(c, op, peer, tag));
  TS_CHECK(check_count(op, count, ts_dtype_size(dt), 1));
  *nbytes = count * ts_dtype_size(dt);
  return check_ptr(op, "buf", buf, *nbytes);
}

ts_status ts_comm_send(ts_comm *c, const void *buf, size_t count, ts_dtype dt, int peer, int tag) {
  static const char *op = "ts_comm_send";
  size_t nb = 0;
  TS_CHECK(p2p_check(c, op, buf, count, dt, peer, tag, &nb));
  charge(c, TS_COMM_SEND, nb);
  for (size_t p = 0, k = npieces(nb, 1); p < k; p++) {
    const char *at = (const char *)buf + p * g_max_message;
    TS_CHECK(MPI_ST(c, op, peer, MPI_Send, (at, piece_len(nb, p), MPI_BYTE, peer, tag, c->user)));
  }
  return TS_OK;
}

ts_status ts_comm_recv(ts_comm *c, void *buf, size_t count, ts_dtype dt, int peer, int tag) {
  static const char *op = "ts_comm_recv";
  size_t nb = 0;
  TS_CHECK(p2p_check(c, op, buf, count, dt, peer, tag, &nb));
  for (size_t p = 0, k = npieces(nb, 1); p < k; p++) {
    char *at = (char *)buf + p * g_max_message;
    int len = piece_len(nb, p);
    MPI_Status s;
    int got = -1;
    TS_CHECK(MPI_ST(c, op, peer, MPI_Probe, (peer, tag, c->user, &s)));
    TS_CHECK(MPI_ST(c, op, peer, MPI_Get_count, (&s, MPI_BYTE, &got)));
    if (got != len) { /* consume the message so it cannot match a later recv */
      void *tmp = malloc(got > 0 ? (size_t)got : 1);
      if (tmp) MPI_Recv(tmp, got, MPI_BYTE, peer, tag, c->user, MPI_STATUS_IGNORE);
      free(tmp);
      char piece[48] = "";
      if (k > 1) snprintf(piece, sizeof piece, " (piece %zu of %zu)", p + 1, k);
      return ts_set_error(TS_ERR_MPI,
                          "%s: expected %zu elements of %s (%d bytes%s) from rank %d with tag %d, "
                          "the message has %d bytes (%d elements), on group \"%s\" (rank %d of %d)",
                          op, count, ts_dtype_name(dt), len, piece, peer, tag, got,
                          got / (int)ts_dtype_size(dt), c->name, c->rank, c->size);
    }
    TS_CHECK(
        MPI_ST(c, op, peer, MPI_Recv, (at, len, MPI_BYTE, peer, tag, c->user, MPI_STATUS_IGNORE)));
  }
  return TS_OK;
}

/* Validates and starts an isend (send != 0, charged) or an irecv on the user
 * communicator. */
static ts_status p2p_start(ts_comm *c, const char *op, int send, void *buf, size_t count,
                           ts_dtype dt, int peer, int tag, ts_comm_request **req) {
  size_t nb = 0;
  TS_CHECK(p2p_check(c, op, buf, count, dt, peer, tag, &nb));
  ts_comm_request *q = NULL;
  TS_CHECK(req_new(c, op, &q));
  if (send) charge(c, TS_COMM_SEND, nb);
  ts_status st = req_reserve(q, npieces(nb, 1));
  if (st == TS_OK)
    st = send ? post_send(q, c->user, buf, nb, peer, tag, 1)
              : post_recv(q, c->user, buf, nb, peer, tag, 1);
  return req_finish(q, st, req);
}

ts_status ts_comm_isend(ts_comm *c, const void *buf, size_t count, ts_dtype dt, int peer, int tag,
                        ts_comm_request **req) {
  return p2p_start(c, "ts_comm_isend", 1, (void *)buf, count, dt, peer, tag, req);
}

ts_status ts_comm_irecv(ts_comm *c, void *buf, size_t count, ts_dtype dt, int peer, int tag,
                        ts_comm_request **req) {
  return p2p_start(c, "ts_comm_irecv", 0, buf, count, dt, peer, tag, req);
}
