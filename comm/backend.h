/*
 * backend.h — comm's private seam between the front (comm.c) and its
 * transports (mpi.c, self.c): the descriptor of one call, the backend
 * interface table, and the group and request structs. Not part of the
 * public API; only comm's own .c files include it.
 *
 * The front turns every public collective and point-to-point call into one
 * ts_comm_call, validates it once, charges the counters once, and hands it
 * to the group's backend through the table (in the manner of NCCL's
 * src/collectives.cc and ggml's backend interface). A backend only moves
 * data: it sees calls that passed every check, never touches the counters,
 * and never sees TS_COMM_CALL_ALL_REDUCE (the front runs all-reduce as a
 * reduce-scatter and an all-gather over uneven chunks, comm.h).
 *
 * Ownership: the front allocates and frees a ts_comm (ts_comm_new,
 * ts_comm_free); the backend owns what `impl` points to and releases it in
 * its free_group. A request is a struct whose first member is a
 * ts_comm_request: the backend takes it from its group's pool
 * (ts_comm_request_new) and gives it back there when its wait or test
 * ends it (ts_comm_request_release), so that after a step's first calls
 * no call allocates (the pool is freed with the group). Every allocation
 * comm makes goes through ts_comm_alloc / ts_comm_realloc / ts_comm_dealloc,
 * which count them (ts_comm_allocations).
 *
 * Transports are told apart by what they can do (caps), never by which
 * table they are.
 */
#ifndef TS_COMM_BACKEND_H
#define TS_COMM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a call does. The values are private and may change. */
typedef enum ts_comm_call_kind {
  TS_COMM_CALL_BARRIER = 0,
  TS_COMM_CALL_REDUCE_SCATTER = 1,
  TS_COMM_CALL_ALL_GATHER = 2,
  TS_COMM_CALL_ALL_REDUCE = 3, /* front only: backends get its two halves */
  TS_COMM_CALL_ALL_REDUCE_F64 = 4,
  TS_COMM_CALL_BROADCAST = 5,
  TS_COMM_CALL_SEND = 6,
  TS_COMM_CALL_RECV = 7,
} ts_comm_call_kind;

/* One public call, as the front hands it to a backend. Buffers are host
 * memory; fields a kind does not use are zero. Shapes in elements of dt:
 *   reduce-scatter  send (N, count) -> recv (count,)
 *   all-gather      send (count,)   -> recv (N, count)
 *   all-reduce, all_reduce_f64 (doubles), broadcast, send, recv: buf (count,)
 * With uneven (all-reduce's halves only), count is the whole buffer, split
 * into chunks [j*count/N, (j+1)*count/N): reduce-scatter sends the whole
 * (count,) and recv is the own chunk in it; all-gather's send is the own
 * chunk of recv (count,). */
typedef struct ts_comm_call {
  ts_comm_call_kind kind; /* what to do */
  const char *name;       /* the public function, for messages */
  const void *send;       /* reduce-scatter, all-gather: the outgoing data */
  void *recv;             /* reduce-scatter, all-gather: the result */
  void *buf;              /* the other kinds: the data, in place */
  size_t count;           /* elements per rank; with uneven, elements in all */
  ts_dtype dt;            /* element type; unused by all_reduce_f64 */
  int accumulate;         /* reduce-scatter: add the previous recv last */
  void *scratch;          /* reduce-scatter: room for the N-1 received chunks */
  size_t scratch_bytes;   /* bytes at scratch */
  int root;               /* broadcast: the sending rank */
  int peer;               /* send, recv: the other rank */
  int tag;                /* send, recv: >= 0 */
  ts_comm_op reduce;      /* all_reduce_f64: sum, max or min */
  int blocking;           /* 1: run to completion, no request */
  int uneven;             /* 1: chunks [j*count/N, (j+1)*count/N) of count */
  int in_place;           /* set by the front: the own chunk is already in place */
  ts_comm_context ctx;    /* set by the front: the caller's context at the start (watchdog) */
} ts_comm_call;

/* What a transport can do: the front and the wrapping transports (staged,
 * thread, nccl) decide by these, not by the transport's identity. */
typedef struct ts_comm_caps {
  int moves;         /* 0: a plan group, which counts calls and moves nothing */
  int device_memory; /* its calls take device buffers (lent memory, ts_comm_set_memory) */
  int host_ranks;    /* it moves host buffers between two or more processes, tagged
                        point-to-point included (MPI): what staging and NCCL's
                        bootstrap wrap, and what a communication thread may drive */
  int async;         /* started calls progress without the caller (a thread, a stream) */
  int device_sums;   /* its sums run on the device (NCCL's rank-order sum), else on the
                        host in rank order (comm/sum.h) or, not moving, nowhere */
} ts_comm_caps;

/* A transport. Every entry but test, unwrap and drop_request is required. */
typedef struct ts_comm_backend {
  const char *name; /* "mpi", "self" */
  ts_comm_caps caps; /* what it can do */
  /* Runs call d on group c to completion when d->blocking (req is NULL
   * then), else starts it and stores its request in *req, which is written
   * only on success. TS_ERR_MPI, TS_ERR_OUT_OF_MEMORY. */
  ts_status (*run)(ts_comm *c, const ts_comm_call *d, ts_comm_request **req);
  /* Completes req (started by run on a group of this backend) and frees it,
   * even on error. */
  ts_status (*wait)(ts_comm_request *req);
  /* Whether req has finished: *done = 1 after completing and freeing it
   * exactly as wait does (its status returned), else *done = 0, TS_OK and
   * req untouched; it also lets the transport progress. NULL: the backend
   * has no test (a communication thread then waits). */
  ts_status (*test)(ts_comm_request *req, int *done);
  /* Collective over parent: the ranks with the same color (>= 0, checked by
   * the front) form a new group ordered by key, named name. */
  ts_status (*split)(ts_comm *parent, int color, int key, const char *name, ts_comm **out);
  /* Releases c->impl (the front frees c itself). */
  void (*free_group)(ts_comm *c);
  /* A transport wrapped around the group's own (staged, nccl): returns c to
   * that one, releasing what the wrap made. NULL for the others. */
  void (*unwrap)(ts_comm *c);
  /* Frees what a pooled request of this backend keeps between uses (its
   * arrays, events) when the pool is freed. NULL: nothing kept. */
  void (*drop_request)(ts_comm_request *q);
  /* Readies a new block of this backend for group c when the pool makes
   * it (its arrays at the sizes c's calls need, so that a block serves any
   * call without growing). NULL: nothing to ready. TS_ERR_OUT_OF_MEMORY. */
  ts_status (*init_request)(ts_comm *c, ts_comm_request *q);
  /* Bytes of this backend's request struct, for ts_comm_pool_reserve; 0:
   * its requests are not reserved ahead. */
  size_t request_bytes;
} ts_comm_backend;

typedef struct ts_comm_pool ts_comm_pool; /* comm.c: requests released, for reuse */

/* A group: the front's part. */
struct ts_comm {
  int rank;                  /* this rank in the group, 0 .. size-1 */
  int size;                  /* ranks in the group, >= 1 */
  char name[32];             /* NUL-terminated, e.g. "world", "dp" */
  ts_comm_counters counters; /* bytes the calls were asked to send, and calls made */
  const ts_comm_backend *be; /* the transport that runs this group's calls */
  void *impl;                /* the backend's state (MPI: communicators); NULL for self */
  const ts_comm_memory *mem; /* ts_comm_set_memory: where data buffers live; NULL: host */
  int *node;                 /* ts_comm_set_nodes: (size,) each member's node, or NULL */
  int remote_peers;          /* members on another node than this rank's */
  const ts_comm_watcher *watcher; /* ts_comm_set_watcher: who watches the calls, or NULL */
  ts_comm_pool *pool;        /* released requests (ts_comm_new's; a wrap's inner copy of the
                                group shares it, each block tagged with its backend) */
};

/* The head of every backend's request struct. */
struct ts_comm_request {
  ts_comm *c;     /* the group (borrowed); c->be->wait completes and frees the request */
  const char *op; /* the public call that started it, for messages */
  double *times;  /* ts_comm_wait_timed: where wait stores when the transport began and
                     finished the call (us); NULL otherwise. Backends without a thread
                     leave it. */
  int done_in_start; /* set by a backend whose start ran the call to its end on the
                        caller's thread (staged collectives): the front then times it */
  int64_t watch_id;  /* ts_comm_set_watcher: the watcher's number for the call, or -1 */
  double started[2]; /* the front: when that start began and ended (us, CLOCK_REALTIME);
                        -1, -1 when the start only started the call */
  /* the pool's (ts_comm_request_new): */
  const ts_comm_backend *be;  /* the backend of the group that took it */
  size_t bytes;               /* the block's size */
  ts_comm_request *next_free; /* the next released block of the pool */
};

/* Chunk j of count elements over n ranks, as comm.h's all-reduce divides
 * them, starts at element j*count/n; computed without overflowing j*count. */
static inline size_t ts_comm_chunk_lo(size_t count, int n, int j) {
  size_t q = count / (size_t)n, m = count % (size_t)n;
  return q * (size_t)j + m * (size_t)j / (size_t)n;
}

/* The longest such chunk: ceil(count / n) elements. */
static inline size_t ts_comm_chunk_max(size_t count, int n) {
  return count / (size_t)n + (count % (size_t)n != 0);
}

/* The transports. */
extern const ts_comm_backend ts_comm_mpi_backend;  /* mpi.c */
extern const ts_comm_backend ts_comm_self_backend; /* self.c */
extern const ts_comm_backend ts_comm_staged_backend; /* staged.c */
extern const ts_comm_backend ts_comm_plan_backend;   /* plan.c */

/* Puts group c (two or more ranks, on MPI) on the staged transport over
 * mem (staged.c); checks mem's staging operations and size. */
ts_status ts_comm_staged_wrap(ts_comm *c, const ts_comm_memory *mem);
/* Returns a staged group to its MPI transport. */
void ts_comm_staged_unwrap(ts_comm *c);

/* A new group of backend be, rank 0 of size 1 (a larger group sets both),
 * the given name (copied, truncated to 31 chars) and impl, zero counters.
 * TS_ERR_OUT_OF_MEMORY naming op. */
ts_status ts_comm_new(const char *op, const ts_comm_backend *be, const char *name, void *impl,
                      ts_comm **out);

/* Microseconds since 1970 on CLOCK_REALTIME, the clock of the calls' times
 * (ts_comm_wait_timed) and of engine/trace.h. */
double ts_comm_now_us(void);

/* A request of `bytes` (>= sizeof(ts_comm_request), `started` -1) for group
 * c and public call op: a block of c's backend and this size that c's
 * pool holds, its backend part as ts_comm_request_release left it (the
 * backend's fields reset but for what it keeps: arrays with their
 * capacities), else a new zeroed one. Thread-safe (the pool has a lock:
 * a communication thread takes and releases requests of the group's
 * inner copy beside the caller). TS_ERR_OUT_OF_MEMORY. */
ts_status ts_comm_request_new(ts_comm *c, const char *op, size_t bytes, ts_comm_request **out);
/* Gives request q back to its group's pool (the backend has reset its
 * part); NULL is a no-op. */
void ts_comm_request_release(ts_comm_request *q);
/* Makes blocks of c's backend (request_bytes, init_request) until c's pool
 * has made n of them in all, so that up to n of its requests at once need
 * no allocation. A wrapping transport whose inner calls start on another
 * thread (thread.c) reserves ahead from the caller's thread, where the
 * count of calls in flight is the step's own, not the thread's timing.
 * TS_ERR_OUT_OF_MEMORY. */
ts_status ts_comm_pool_reserve(ts_comm *c, int n);

/* comm's heap, counted (ts_comm_allocations): malloc, calloc (zeroed),
 * realloc and free. Every allocation in comm/ goes through these
 * (tests/source_rules_test.sh checks). */
void *ts_comm_alloc(size_t bytes, int zeroed);
void *ts_comm_realloc(void *p, size_t bytes);
void ts_comm_dealloc(void *p);

/* ---- the watchdog (watchdog.c; comm.h "the watchdog") ---- */

/* Characters kept of each host name (NUL included). */
#define TS_COMM_HOST_CHARS 64

/* Whether a wait that began at *t0 (seconds on the monotonic clock; 0:
 * not yet, then set to now) has passed the deadline; 0 without one. */
int ts_comm_watchdog_expired(double *t0);

/* The watchdog's line for call `name` (kind) on group `group`, with the
 * caller's context, naming the world ranks missing[0..n) (a send or
 * receive: the peer, missing[0]); then _exit(TS_COMM_EXIT_TIMEOUT). */
void ts_comm_watchdog_fire(const char *group, const char *name, ts_comm_call_kind kind,
                           const ts_comm_context *ctx, const int *missing, int n)
    __attribute__((noreturn));

/* Arms the guard thread for MPI call `call` (a string literal), which
 * blocks inside MPI, when a deadline is set; ts_comm_guard_end disarms it.
 * Past the deadline the thread prints the line naming the call and ends
 * the process (exit 4). */
void ts_comm_guard_begin(const char *call);
void ts_comm_guard_end(void);

/* Takes ownership of hosts (size,) (MPI_Get_processor_name of each world
 * rank, malloc'd) and this process's world rank, for the lines and
 * ts_comm_host / ts_comm_local_size. */
void ts_comm_watchdog_set_hosts(int rank, int size, char (*hosts)[TS_COMM_HOST_CHARS]);

/* ts_comm_set_nodes from the world's host names (ts_comm_host): member i
 * of c is world rank world[i], on the node of the first member with its
 * host name. TS_ERR_OUT_OF_MEMORY. */
ts_status ts_comm_set_nodes_of_world(ts_comm *c, const int *world);

/* Knobs only tests turn (comm_testing.h, //comm:testing, sets them;
 * production builds never do): the largest MPI message in bytes, 1 .. 1
 * GiB (mpi.c; 1 GiB), and the random delay, up to max_us microseconds from
 * a generator seeded by seed and the rank, before each call a
 * communication thread runs (thread.c; 0: none). */
extern size_t ts_comm_max_message;
extern unsigned ts_comm_thread_delay_max_us;
extern uint64_t ts_comm_thread_delay_seed;

/* 1 when MPI runs with MPI_THREAD_MULTIPLE (mpi.c): a communication
 * thread may call MPI beside the caller's thread (thread.c). */
int ts_comm_mpi_thread_multiple(void);

/* A one-rank group on the local backend (self.c): no MPI call, ever. */
ts_status ts_comm_self_new(const char *op, const char *name, ts_comm **out);

/* The world group on the MPI backend (mpi.c), or on the local backend when
 * the job has one rank. TS_ERR_INVALID_USAGE if MPI is not initialised. */
ts_status ts_comm_mpi_world(ts_comm **out);

#ifdef __cplusplus
}
#endif

#endif /* TS_COMM_BACKEND_H */
