/*
 * comm.h — process groups and collectives on host memory over MPI, with
 * per-group byte counters (DESIGN.md "Layers", "Determinism contract").
 * One front (comm.c) checks every call and keeps the counters; backends
 * move the data: MPI (mpi.c) for groups of two or more ranks, a local one
 * (self.c) for every group of one rank. Their seam is comm/backend.h.
 *
 * A ts_comm is a group of ranks: the world (a duplicate of MPI_COMM_WORLD),
 * a sub-group split from another (the data-parallel group now, pipeline
 * groups later), or a one-rank group that needs no MPI at all
 * (ts_comm_self), so that one-rank code and tests run the same calls.
 *
 * Buffers are host memory, or a device's that its owner lends comm
 * (ts_comm_set_memory: on two or more ranks the host-staged transport,
 * staged.c, moves it through host staging). Counts are in elements of a
 * ts_dtype (fp32, bf16, fp16). Reductions sum: half-precision elements
 * are widened to fp32, summed in fp32 and rounded once to the storage
 * dtype (round to nearest even).
 *
 * Determinism: every reduction adds the ranks' contributions in rank order,
 * acc = x_0; acc += x_1; ...; acc += x_{N-1}, element by element, whatever
 * the message sizes, so a given element sums identically in every call that
 * reduces it, and every rank receives the same bits. Reduce-scatter is a
 * direct exchange (each rank sends chunk j to rank j and sums what it
 * receives); all-reduce is reduce-scatter followed by all-gather over the
 * same chunks (the engine's one reduction primitive).
 *
 * Counters: each call adds to its group's counters the bytes the call asks
 * this rank to send, computed from its arguments by the formula in the
 * call's comment ((N-1)/N of the buffer for reduce-scatter and all-gather,
 * what a ring or direct exchange sends: ZeRO paper §7 / Thakur et al. 2005).
 * They are not measured on the wire: MPI's own algorithm may move other
 * amounts, and the counters are charged when a call passes its checks,
 * before it runs (a call rejected by the checks counts nothing). A one-rank
 * group sends nothing and counts nothing.
 *
 * Errors: every MPI call runs with MPI_ERRORS_RETURN; a failure becomes
 * TS_ERR_MPI with MPI's own message (MPI_Error_string) and the collective's
 * name. A rank that dies makes Open MPI's launcher terminate the others;
 * tools call ts_comm_abort after printing their error so no rank hangs in a
 * collective its peer will never enter.
 *
 * Threading: MPI is initialised with MPI_THREAD_MULTIPLE (asked for; a
 * library that gives less still works, without communication threads).
 * Call a group's functions from one thread at a time (kernels may use
 * OpenMP inside); a ts_comm is not thread-safe. ts_comm_set_thread gives
 * a group a communication thread that runs its calls in submission order
 * beside the caller (thread.c), so non-blocking collectives progress while
 * the caller computes.
 *
 * Ownership: a ts_comm is opaque, created by ts_comm_world / ts_comm_self /
 * ts_comm_split and released by ts_comm_free (before ts_comm_finalize).
 */
#ifndef TS_COMM_COMM_H
#define TS_COMM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_comm ts_comm;

/* Collective kinds: index the counters. Values are stable. */
typedef enum ts_comm_kind {
  TS_COMM_ALL_REDUCE = 0,     /* ts_comm_all_reduce, ts_comm_all_reduce_f64 */
  TS_COMM_REDUCE_SCATTER = 1, /* ts_comm_(i)reduce_scatter */
  TS_COMM_ALL_GATHER = 2,     /* ts_comm_(i)all_gather */
  TS_COMM_BROADCAST = 3,      /* ts_comm_(i)broadcast (bytes sent by the root) */
  TS_COMM_SEND = 4,           /* ts_comm_(i)send */
  TS_COMM_NUM_KINDS = 5,
} ts_comm_kind;

/* "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send". */
const char *ts_comm_kind_name(ts_comm_kind k);

typedef struct ts_comm_counters {
  uint64_t bytes[TS_COMM_NUM_KINDS]; /* bytes the calls asked this rank to send, per kind */
  uint64_t calls[TS_COMM_NUM_KINDS]; /* calls made, per kind */
  /* Of bytes: those to members on another node (ts_comm_set_nodes), the
   * link class across nodes; bytes - remote went within this rank's node. */
  uint64_t remote[TS_COMM_NUM_KINDS];
} ts_comm_counters;

/* Reduction of ts_comm_all_reduce_f64. */
typedef enum ts_comm_op {
  TS_COMM_SUM = 0,
  TS_COMM_MAX = 1,
  TS_COMM_MIN = 2,
} ts_comm_op;

/* --- the MPI library ---------------------------------------------------- */

/* Initialises MPI (MPI_Init_thread asking MPI_THREAD_MULTIPLE, needing at
 * least MPI_THREAD_FUNNELED) unless it already
 * is; argc/argv may be NULL. Works without mpirun (a singleton world of one
 * rank). Returns TS_OK or TS_ERR_MPI (message from MPI). */
ts_status ts_comm_init(int *argc, char ***argv);

/* 1 between ts_comm_init and ts_comm_finalize, else 0. */
int ts_comm_initialized(void);

/* Finalises MPI if ts_comm_init initialised it; every ts_comm from
 * ts_comm_world / ts_comm_split must be freed first. TS_OK or TS_ERR_MPI. */
ts_status ts_comm_finalize(void);

/* Terminates every rank of the job with exit code `code` (MPI_Abort on
 * MPI_COMM_WORLD; plain exit when MPI is not initialised). For tools after
 * an error on one rank, so that peers do not wait forever. Does not return. */
void ts_comm_abort(int code);

/* --- the watchdog (DESIGN.md "Several nodes") ----------------------------
 * A rank that stops answering (a stopped process, a cut link, a deadlock)
 * would leave every peer waiting forever. With a timeout of T > 0 seconds,
 * every transfer a group of two or more ranks waits for on MPI (the
 * collectives, sends and receives, on the caller's thread or a
 * communication thread, and through the staged transport) has a deadline:
 * a wait that makes no progress for T seconds prints one line to stderr,
 *
 *   tessera: comm timeout on rank R of N (host H): OP on group "G" waited
 *   T s (SETTING T) at step S, unit U: ranks that did not arrive:
 *   2 (host n2), 3 (host n2); stopping the job (exit code 4)
 *
 * naming the call (all-gather, reduce-scatter, all-reduce, broadcast,
 * barrier, send, recv), the context the caller set when it started the
 * call (ts_comm_set_context), and the ranks this rank still waits for
 * (world ranks and their hosts: the senders of the messages that did not
 * arrive, else the receivers that did not take this rank's; for a send or
 * receive "peer rank P"), and ends the process with _exit(
 * TS_COMM_EXIT_TIMEOUT): a transfer that hung cannot be taken back, and
 * mpirun then stops every other rank. The clock of a call starts when
 * someone first waits for it (or tests it, on a communication thread), so
 * a non-blocking call started long before its wait is not charged for
 * the caller's compute. MPI's own blocking calls (MPI_Init_thread in
 * ts_comm_init: set the timeout first; the communicator-making
 * collectives of ts_comm_world and ts_comm_split) are watched by a thread
 * of comm's, whose line names the call and says the missing ranks are
 * not known inside MPI. NCCL's transfers (comm/nccl.h) run on the GPU and
 * are not watched here.
 *
 * Every collective on MPI groups runs as direct point-to-point exchanges
 * (no MPI collective), so a rank knows which peers' messages are missing. */

/* The exit status of a process the watchdog stopped. */
#define TS_COMM_EXIT_TIMEOUT 4

/* Sets the deadline of every later wait, in seconds (0: none, the
 * default); process-wide. `setting` says how the user sets it, for the
 * line ("--comm-timeout": "(--comm-timeout 30)"); NULL: "timeout".
 * TS_ERR_INVALID_ARGUMENT unless 0 <= seconds <= 1e9 (and finite). */
ts_status ts_comm_set_timeout(double seconds, const char *setting);

/* The deadline set, in seconds (0: none). */
double ts_comm_timeout(void);

/* What the caller is doing, for the watchdog's line: -1 where it does not
 * apply. Each call keeps a copy of the context set when it starts. */
typedef struct ts_comm_context {
  long long step;  /* the training step, counted from 1; 0: setup; -1: none given */
  int unit;        /* the model unit whose parameters or gradients move */
  int stage;       /* this rank's pipeline stage, with two or more */
  int micro_batch; /* the micro-batch, counted from 0 */
} ts_comm_context;

/* Sets the context of calls started from now on (process-wide; the last
 * one set applies). ctx NULL: none (every field -1). */
void ts_comm_set_context(const ts_comm_context *ctx);

/* The context now set. */
ts_comm_context ts_comm_get_context(void);

/* Seconds this process's callers have spent inside blocking calls and
 * ts_comm_wait / ts_comm_wait_timed on groups of two or more ranks since
 * it started (CLOCK_REALTIME differences): the time a rank waited for its
 * peers and its transfers, which a straggler's peers accumulate. Callers
 * of comm on one thread (the communication thread's own work is not
 * counted: only the caller's waits for it). */
double ts_comm_wait_seconds(void);

/* World rank w's host (MPI_Get_processor_name, at most 63 characters),
 * gathered by ts_comm_init; "?" before it or for a rank outside the
 * world. */
const char *ts_comm_host(int world_rank);

/* The world ranks on this rank's host (this one included): those whose
 * ts_comm_host is this rank's, whatever launched them (mpirun, srun); 1
 * before ts_comm_init. */
int ts_comm_local_size(void);

/* --- groups --------------------------------------------------------------- */

/* The world: a duplicate of MPI_COMM_WORLD named "world", with fresh
 * counters (in a job of one rank, a one-rank group that keeps no
 * communicator, like ts_comm_self). TS_ERR_INVALID_USAGE if MPI is not
 * initialised; TS_ERR_MPI; TS_ERR_OUT_OF_MEMORY. */
ts_status ts_comm_world(ts_comm **out);

/* A one-rank group ("self") that makes no MPI call: rank 0 of size 1,
 * collectives copy (or do nothing in place). Needs no ts_comm_init.
 * TS_ERR_OUT_OF_MEMORY. */
ts_status ts_comm_self(ts_comm **out);

/* A plan group (the memory plan's communicator): rank `rank` of `size`
 * ranks whose calls are checked and counted exactly as on a real group of
 * that size (ts_comm_get_counters says what they would send) and then move
 * nothing: no buffer is read or written, so they may be addresses without
 * memory (the kernels' plan context, TS_K_PLAN); all_reduce_f64 leaves its
 * doubles as they are. No MPI. TS_ERR_INVALID_ARGUMENT (rank outside
 * [0, size)), TS_ERR_OUT_OF_MEMORY. */
ts_status ts_comm_plan(int rank, int size, const char *name, ts_comm **out);

/* Collective over `parent`: ranks with the same color form one new group,
 * ordered by key (then parent rank), named `name` (copied, up to 31 chars;
 * e.g. "dp"). color must be >= 0. A one-rank parent (ts_comm_self) gives
 * another one-rank group without any MPI call; every group of one rank runs
 * its calls locally, like ts_comm_self. TS_ERR_INVALID_ARGUMENT (color < 0),
 * TS_ERR_MPI, TS_ERR_OUT_OF_MEMORY. */
ts_status ts_comm_split(ts_comm *parent, int color, int key, const char *name, ts_comm **out);

/* Frees the group (MPI_Comm_free for MPI groups). NULL is a no-op. */
void ts_comm_free(ts_comm *c);

/* Memory that is not the host's (a GPU's, DESIGN.md "GPU"): comm knows
 * nothing of devices, so the owner of the buffers lends the operations
 * comm needs on them. Each is ordered after every earlier operation on
 * that memory (a CUDA stream) and may return before it finishes.
 *
 * A one-rank group needs copy and add. A group of two or more ranks runs
 * on the host-staged transport (staged.c): it also needs to_host,
 * to_device and sync, and host memory to stage through, `staging`, of at
 * least ts_comm_staging_bytes(N, TS_COMM_STAGING_MIN_PIECE) bytes, the
 * same size on every rank (it fixes the chunks every rank's MPI calls
 * move). A collective then moves in chunks of staging_bytes / 4N bytes per
 * rank (reduce-scatter; all-gather twice that, broadcast 2N times): chunk
 * k+1 is copied to the host while MPI moves chunk k. Sends and receives
 * stage through host memory of their own (malloc), held until their wait.
 * Every sum is MPI's on the host (fp32, rank order): the bits are those of
 * the same calls on host memory. */
typedef struct ts_comm_memory {
  void *user; /* passed back to every operation */
  /* dst = src, nbytes bytes, not overlapping */
  ts_status (*copy)(void *user, void *dst, const void *src, size_t nbytes);
  /* out[i] = a[i] + b[i] for i < count, summed in fp32 and rounded once to
   * dt (the one-rank case of comm/sum.h's rank-order sum with accumulate);
   * out may alias b */
  ts_status (*add)(void *user, void *out, const void *a, const void *b, size_t count, ts_dtype dt);
  /* h_dst (host) = src (lent), nbytes bytes; may return before it finishes */
  ts_status (*to_host)(void *user, void *h_dst, const void *src, size_t nbytes);
  /* dst (lent) = h_src (host), nbytes bytes; may return before it finishes */
  ts_status (*to_device)(void *user, void *dst, const void *h_src, size_t nbytes);
  /* returns once every to_host and to_device called so far has finished */
  ts_status (*sync)(void *user);
  void *staging;        /* host memory for the staged transport (page-locked is best) */
  size_t staging_bytes; /* its size in bytes */
} ts_comm_memory;

/* The smallest per-rank piece of a chunk a staging may give, in bytes. */
#define TS_COMM_STAGING_MIN_PIECE 64

/* Bytes of staging (ts_comm_memory.staging) that move a collective of
 * `ranks` ranks in chunks of piece_bytes per rank: two slots of 2N pieces
 * (a reduce-scatter's N sent, one received and N-1 of scratch). */
size_t ts_comm_staging_bytes(int ranks, size_t piece_bytes);

/* From now on the data buffers of c's collectives and sends live in mem's
 * memory (NULL: host memory again); all_reduce_f64's buffer stays on the
 * host. mem is borrowed and must outlive c's calls. On two or more ranks
 * the group's calls go through the host-staged transport (a group on the
 * NCCL transport, comm/nccl.h, leaves it first). Call it with no
 * request outstanding and before ts_comm_set_thread (a group on a thread
 * is refused, TS_ERR_INVALID_USAGE, as is lending a group other memory
 * while it has some). TS_ERR_INVALID_ARGUMENT (a required
 * operation missing, staging too small, naming both), TS_ERR_OUT_OF_MEMORY. */
ts_status ts_comm_set_memory(ts_comm *c, const ts_comm_memory *mem);

/* The transport group c's calls run on: "self" (one rank), "mpi", "staged"
 * (lent memory over two or more ranks), "nccl" (comm/nccl.h), "thread" (a
 * communication thread over one of those), "plan". */
const char *ts_comm_transport(const ts_comm *c);

int ts_comm_rank(const ts_comm *c);      /* 0 .. size-1 */
int ts_comm_size(const ts_comm *c);      /* N >= 1 */
const char *ts_comm_name(const ts_comm *c);
/* Members of c on another node than this rank's (ts_comm_set_nodes; 0
 * without nodes). */
int ts_comm_remote_peers(const ts_comm *c);

/* This rank's counters since creation or the last reset: bytes the calls
 * asked this rank to send, from their arguments (see the header comment). */
const ts_comm_counters *ts_comm_get_counters(const ts_comm *c);
/* Sum of bytes[] over all kinds (computed, not measured on the wire). */
uint64_t ts_comm_bytes_sent(const ts_comm *c);
/* Of ts_comm_bytes_sent: the bytes to members on another node. */
uint64_t ts_comm_bytes_remote(const ts_comm *c);

/* Heap allocations comm has made in this process so far (groups, their
 * state, requests, the arrays a request keeps), counted as they are made:
 * after a step's first calls, the requests and buffers of each group come
 * from its pool, so a training step on any transport adds nothing (a
 * test counts steps 2-5). Thread-safe. */
uint64_t ts_comm_allocations(void);

/* Link classes: which members of c share a node (host). node (size,) gives
 * each member's node as a small integer, equal for members on the same
 * node; it is copied. From then on every call's bytes also count under
 * counters.remote when they go to a member on another node than this
 * rank's: per member, the bytes comm.h's formula for the call sends it
 * (a reduce-scatter member j's chunk, an all-gather the own chunk, an
 * all-reduce both halves, a send its peer). NULL: every member on this
 * rank's node (the default of a new group, and of ts_comm_self and
 * ts_comm_plan). MPI groups are given it at creation from the world's host
 * names (ts_comm_host). TS_ERR_OUT_OF_MEMORY. */
ts_status ts_comm_set_nodes(ts_comm *c, const int *node);

/* ---- a watcher of a group's calls ---- */

/* One counted call as a watcher sees it: its kind (ts_comm_kind), the
 * bytes this rank sends and of them those to other nodes (the counters'
 * formula), and the buffer's bytes n of the collective's algorithm (an
 * all-gather's or reduce-scatter's whole (N, count) buffer, an all-reduce's
 * or broadcast's buffer, a send's message). A receive sends nothing and
 * counts nothing: kind -1 with recv 1 (a watcher that times calls makes it
 * end when its send does). peer and tag: a send's or receive's (else -1). */
typedef struct ts_comm_call_info {
  int kind;
  uint64_t bytes, remote, buffer;
  int recv;
  int peer, tag;
} ts_comm_call_info;

/* Who watches a group's calls: the engine, for its observers (engine/
 * observer.h; engine/observe.c puts one on its groups while an observer
 * watches calls). started() is told every counted call and every receive
 * when it is made, on the caller's thread (blocking: the caller waits for
 * it to end there), and returns a number of its own for it; waited() is
 * told that number when the caller begins to wait for the started call
 * (-1 for a call started() was not told of). Nothing else in comm knows
 * who watches. */
typedef struct ts_comm_watcher {
  void *user;
  int64_t (*started)(void *user, const ts_comm *c, const ts_comm_call_info *call, int blocking);
  void (*waited)(void *user, int64_t id);
} ts_comm_watcher;

/* Puts watcher w (borrowed; NULL: none) on c, for the calls started from
 * then on. */
void ts_comm_set_watcher(ts_comm *c, const ts_comm_watcher *w);
void ts_comm_reset_counters(ts_comm *c);

/* --- collectives (blocking; every rank of the group must call) ------------ */

/* Synchronises the group. TS_ERR_MPI. */
ts_status ts_comm_barrier(ts_comm *c);

/* Scratch bytes ts_comm_reduce_scatter needs: (N-1) * count elements of dt
 * (the chunks received from the other ranks). 0 for a one-rank group. */
size_t ts_comm_reduce_scatter_scratch_bytes(const ts_comm *c, size_t count, ts_dtype dt);
/* The same for a group of n ranks, without a group (memory estimates). */
size_t ts_comm_reduce_scatter_scratch_bytes_n(size_t n, size_t count, ts_dtype dt);

/* Reduce-scatter (sum): send is (N, count) in dt — rank j's contribution to
 * chunk j at send + j*count — and recv (count,) receives, on rank r,
 *   recv = [recv +] send_0[r] + send_1[r] + ... + send_{N-1}[r]
 * summed in rank order in fp32 for half dtypes (see the header comment);
 * with accumulate != 0 the previous recv is added last, after the rank sum.
 * In place: recv may equal send + r*count (the own chunk), without
 * accumulate (TS_ERR_INVALID_ARGUMENT: there is no previous recv then);
 * otherwise recv must not overlap send. scratch: at least
 * ts_comm_reduce_scatter_scratch_bytes(c, count, dt) bytes, host, not
 * overlapping send or recv. Counts (N-1) * count * sizeof(dt) bytes sent.
 * Errors: TS_ERR_INVALID_ARGUMENT (bad dtype, scratch too small: the message
 * gives both sizes), TS_ERR_MPI. */
ts_status ts_comm_reduce_scatter(ts_comm *c, const void *send, void *recv, size_t count,
                                 ts_dtype dt, int accumulate, void *scratch,
                                 size_t scratch_bytes);

/* All-gather: send (count,) of rank r lands in recv + r*count on every rank;
 * recv is (N, count). In place: send may equal recv + r*count; otherwise the
 * two must not overlap. Counts (N-1) * count * sizeof(dt) bytes sent (what a
 * ring or recursive-doubling all-gather sends). TS_ERR_INVALID_ARGUMENT,
 * TS_ERR_MPI. */
ts_status ts_comm_all_gather(ts_comm *c, const void *send, void *recv, size_t count,
                             ts_dtype dt);

/* Scratch bytes ts_comm_all_reduce needs for `count` elements. */
size_t ts_comm_all_reduce_scratch_bytes(const ts_comm *c, size_t count, ts_dtype dt);

/* All-reduce (sum), in place on buf (count,) in dt: reduce-scatter over the
 * chunks [j*count/N, (j+1)*count/N) followed by all-gather of the same
 * chunks, so every rank gets the same bits and each element is summed in
 * rank order. Counts ((count - own chunk) + (N-1) * own chunk) * sizeof(dt)
 * bytes sent as TS_COMM_ALL_REDUCE: the reduce-scatter half sends every
 * chunk but the own one, the all-gather half the own chunk to N-1 ranks
 * (2 (N-1)/N of the buffer when N divides count).
 * scratch as for reduce-scatter. TS_ERR_INVALID_ARGUMENT, TS_ERR_MPI. */
ts_status ts_comm_all_reduce(ts_comm *c, void *buf, size_t count, ts_dtype dt, void *scratch,
                             size_t scratch_bytes);

/* All-reduce of a few host doubles (norms, loss sums, flags), in place:
 * every rank's buf is gathered and reduced with op in rank order, so every
 * rank gets the same bits. Counts (N-1) * count * 8 bytes sent as
 * TS_COMM_ALL_REDUCE. Meant for small counts (it moves N * count doubles to
 * every rank). TS_ERR_INVALID_ARGUMENT (bad op), TS_ERR_MPI. */
ts_status ts_comm_all_reduce_f64(ts_comm *c, double *buf, size_t count, ts_comm_op op);

/* Agreement on a status: every rank passes its own st; returns TS_OK on
 * every rank when every st is TS_OK. Else the lowest failing rank gets its
 * own st back (its message kept) and every other rank that rank's status
 * with the message "rank R of N failed WHAT" (what: e.g. "during setup").
 * *first (NULL: not wanted) receives that rank, or -1 when none failed. One
 * ts_comm_all_reduce_f64 (min of rank * 64 + status). Errors of its own:
 * TS_ERR_MPI (*first -1). */
ts_status ts_comm_agree(ts_comm *c, ts_status st, const char *what, int *first);

/* Broadcast buf (count,) in dt from rank `root` to every rank. The root
 * counts (N-1) * count * sizeof(dt) bytes; other ranks count 0.
 * TS_ERR_INVALID_ARGUMENT (root out of range), TS_ERR_MPI. */
ts_status ts_comm_broadcast(ts_comm *c, void *buf, size_t count, ts_dtype dt, int root);

/* Point-to-point: send buf (count,) to rank `peer` with tag >= 0, or
 * receive exactly count elements from `peer` with that tag (a different
 * size is TS_ERR_MPI naming both counts). The sender counts
 * count * sizeof(dt) bytes. TS_ERR_INVALID_ARGUMENT (peer out of range or
 * equal to this rank, tag < 0), TS_ERR_MPI. */
ts_status ts_comm_send(ts_comm *c, const void *buf, size_t count, ts_dtype dt, int peer, int tag);
ts_status ts_comm_recv(ts_comm *c, void *buf, size_t count, ts_dtype dt, int peer, int tag);

/* --- non-blocking forms ---------------------------------------------------
 * Each starts the operation and returns a request; the buffers (and the
 * scratch) must stay valid and untouched until ts_comm_wait returns. Requests
 * of one group complete in any order; collectives must be started in the
 * same order on every rank. Counters are charged when the call starts. */
typedef struct ts_comm_request ts_comm_request;

ts_status ts_comm_ireduce_scatter(ts_comm *c, const void *send, void *recv, size_t count,
                                  ts_dtype dt, int accumulate, void *scratch,
                                  size_t scratch_bytes, ts_comm_request **req);
ts_status ts_comm_iall_gather(ts_comm *c, const void *send, void *recv, size_t count,
                              ts_dtype dt, ts_comm_request **req);
ts_status ts_comm_ibroadcast(ts_comm *c, void *buf, size_t count, ts_dtype dt, int root,
                             ts_comm_request **req);
ts_status ts_comm_isend(ts_comm *c, const void *buf, size_t count, ts_dtype dt, int peer,
                        int tag, ts_comm_request **req);
ts_status ts_comm_irecv(ts_comm *c, void *buf, size_t count, ts_dtype dt, int peer, int tag,
                        ts_comm_request **req);

/* Completes the request (for reduce-scatter this is where the received
 * chunks are summed into recv) and frees it; NULL is a no-op returning TS_OK.
 * TS_ERR_MPI. The request is freed even on error. */
ts_status ts_comm_wait(ts_comm_request *req);

/* ts_comm_wait, and times[0], times[1] receive when the group's
 * communication thread began and finished the call (microseconds,
 * CLOCK_REALTIME, the axis of engine/trace.h), or -1 and -1 when the group
 * has no thread (the call then ran inside its start and its wait);
 * times[2], times[3] when its start began and ended where the start ran the
 * call to its end on the caller's thread (the staged transport's
 * collectives without a thread), else -1 and -1. */
ts_status ts_comm_wait_timed(ts_comm_request *req, double times[4]);

/* --- the communication thread ---------------------------------------------
 * DESIGN.md "Communication overlap". With on = 1, group c's calls from now
 * on run on a thread of their own, one at a time in submission order
 * (blocking calls too: they are queued and waited), so a non-blocking
 * collective moves and sums its data while the caller computes, and its
 * ts_comm_wait only waits for what is not done yet. The bits of every
 * result are those without the thread (the same transport and rank-order
 * sums). Calls nest: each on = 1 needs an on = 0; the last one drains the
 * queue, stops the thread and returns the group to its transport (every
 * request must have been waited: else TS_ERR_INVALID_USAGE). ts_comm_free
 * stops it too. Only groups of two or more ranks on MPI, with MPI
 * initialised at MPI_THREAD_MULTIPLE, can have one: other groups give
 * TS_ERR_UNSUPPORTED with the reason (there is nothing to overlap on one
 * rank; a plan group moves nothing), as does a failed pthread_create.
 * TS_ERR_INVALID_ARGUMENT (c NULL). */
ts_status ts_comm_set_thread(ts_comm *c, int on);

/* 1 while c has a communication thread. */
int ts_comm_thread_active(const ts_comm *c);

#ifdef __cplusplus
}
#endif

#endif /* TS_COMM_COMM_H */
