/*
 * offload.c — the optimizer state in a scratch file, per piece (offload.h).
 *
 * Invariants:
 * - One I/O thread runs the jobs in queue order; a slot's jobs finish
 *   before anyone uses its buffers (acquire waits for pending == 0).
 * - A slot holds the newest bytes of its piece whenever it has one: a
 *   release's write-back copies them out and leaves them, so the next
 *   acquire of that piece reads nothing.
 * - The bits are those of the state in memory: the file holds fp32 values
 *   as they were, the same AdamW runs on them.
 */
#define _GNU_SOURCE /* O_DIRECT */
#include "engine/offload.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_testing.h"
#include "engine/observe.h"

enum { ALIGN = 4096, QUEUE = 16, MASTER = 0, M = 1, V = 2 };

typedef struct slot {
  int unit;         /* the unit whose state it holds or will hold; -1: none */
  int piece;        /* and which piece of it */
  int uses;         /* acquires not yet released */
  int pending;      /* queued jobs on it not finished */
  int dirty;        /* a release changed it: written back when the last use ends */
  int64_t last_job; /* the newest job queued on it, -1: none since the last wait */
  uint64_t used_at; /* the last acquire or prefetch (least recently used goes first) */
  void *block[3];   /* ledger blocks (host): master (NULL in fp32), m, v */
  int locked[3];    /* 1: registered (ts_engine_state_on_host: page-locked beside a GPU) */
  float *buf[3];    /* their ALIGN-aligned starts */
} slot;

typedef struct job {
  int slot, unit, piece, write;
  int64_t id; /* its number (observers, the test seam) */
} job;

struct ts_offload {
  int fd;            /* the scratch file (unlinked); -1 on a plan */
  int direct;        /* 1: opened O_DIRECT */
  char where[4200];  /* the folder, for messages */
  int first;         /* the first array: MASTER with master weights, else M */
  size_t *n;         /* [n_units] elements of a unit's state arrays (0: not this stage's) */
  size_t *off;       /* [n_units] byte offset of the unit's block */
  size_t piece;      /* elements per piece (a multiple of ALIGN / 4) */
  size_t slot_bytes; /* bytes of a slot's array: the largest piece, rounded up to ALIGN */
  size_t disk;       /* bytes of the file */
  size_t disk_master, disk_optim; /* of them charged to master and optim */
  slot slots[TS_OFFLOAD_SLOTS];
  uint64_t clock;
  pthread_t thread;
  int started;
  pthread_mutex_t mu;
  pthread_cond_t work, done;
  job queue[QUEUE];
  int head, count, stop;
  int64_t jobs;      /* jobs queued so far (their numbers for observers) */
  ts_status st;      /* the first job's error; TS_OK */
  char err[4800];    /* its message */
  float *peek;       /* ts_offload_peek's copy */
  size_t peek_n;
};

static size_t round_up(size_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

/* Bytes one array of unit u takes in the file. */
static size_t stride(const ts_offload *o, int u) { return round_up(o->n[u] * 4); }

/* Piece p of unit u: its first element and its length. */
static size_t piece_lo(const ts_offload *o, int p) { return (size_t)p * o->piece; }
static size_t piece_len(const ts_offload *o, int u, int p) {
  size_t lo = piece_lo(o, p);
  return o->n[u] - lo < o->piece ? o->n[u] - lo : o->piece;
}

/* Bytes a job of piece p of unit u moves per array (rounded up to ALIGN:
 * within the array's stride in the file and the slot's buffer). */
static size_t piece_bytes(const ts_offload *o, int u, int p) {
  return round_up(piece_len(o, u, p) * 4);
}

/* The I/O of job j: each array's part of the piece (short counts and
 * EINTR retried). Returns 0, or errno with the failing offset in *at. */
static int run_io(ts_offload *o, const job *j, size_t *at) {
  const slot *k = &o->slots[j->slot];
  size_t len = piece_bytes(o, j->unit, j->piece);
  for (int a = o->first; a <= V; a++) {
    char *p = (char *)k->buf[a];
    size_t base = o->off[j->unit] + (size_t)(a - o->first) * stride(o, j->unit) +
                  piece_lo(o, j->piece) * 4;
    for (size_t done = 0; done < len;) {
      ssize_t r = j->write ? pwrite(o->fd, p + done, len - done, (off_t)(base + done))
                           : pread(o->fd, p + done, len - done, (off_t)(base + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        *at = base + done;
        return r < 0 ? errno : EIO; /* 0: the file is shorter than it was sized */
      }
      done += (size_t)r;
    }
  }
  return 0;
}

static void *io_thread(void *arg) {
  ts_offload *o = arg;
  pthread_mutex_lock(&o->mu);
  for (;;) {
    while (!o->count && !o->stop) pthread_cond_wait(&o->work, &o->mu);
    if (!o->count) break; /* stopped with nothing queued */
    job j = o->queue[o->head];
    pthread_mutex_unlock(&o->mu);
    size_t at = o->off[j.unit] + piece_lo(o, j.piece) * 4;
    const ts_engine_hooks *h = ts_engine_get_hooks(); /* the test seam: a failing disk */
    int err = h && h->offload_io ? h->offload_io(h->user, j.write, j.unit, (long long)j.id) : 0;
    if (!err) err = run_io(o, &j, &at);
    pthread_mutex_lock(&o->mu);
    o->head = (o->head + 1) % QUEUE;
    o->count--;
    o->slots[j.slot].pending--;
    if (err && o->st == TS_OK) {
      o->st = TS_ERR_IO;
      snprintf(o->err, sizeof o->err,
               "`offload_dir` %s: %s of unit %d's optimizer state (%zu bytes at offset %zu of "
               "the scratch file): %s",
               o->where, j.write ? "write" : "read", j.unit,
               (size_t)(V - o->first + 1) * piece_bytes(o, j.unit, j.piece), at, strerror(err));
    }
    pthread_cond_broadcast(&o->done);
  }
  pthread_mutex_unlock(&o->mu);
  return NULL;
}

/* Queues job (slot k, piece p of unit u) and tells e's observers; o->mu
 * held. Without a file (the plan device's store) it is done at once. */
static void queue_job(ts_engine *e, ts_offload *o, int k, int u, int p, int write) {
  o->slots[k].last_job = o->jobs;
  ts_engine_observe_io(e, write, u, (uint64_t)(V - o->first + 1) * piece_bytes(o, u, p),
                       o->jobs++);
  if (o->fd < 0) return;
  while (o->count == QUEUE) pthread_cond_wait(&o->done, &o->mu);
  o->queue[(o->head + o->count) % QUEUE] = (job){k, u, p, write, o->jobs - 1};
  o->count++;
  o->slots[k].pending++;
  pthread_cond_signal(&o->work);
}

/* The first job error as this thread's error; o->mu held. */
static ts_status job_error(const ts_offload *o) {
  return o->st == TS_OK ? TS_OK : ts_set_error(o->st, "%s", o->err);
}

static int slot_of(const ts_offload *o, int u, int p) {
  for (int k = 0; k < TS_OFFLOAD_SLOTS; k++)
    if (o->slots[k].unit == u && o->slots[k].piece == p) return k;
  return -1;
}

/* The slot no one holds that was used least recently, or -1. */
static int victim(const ts_offload *o) {
  int best = -1;
  for (int k = 0; k < TS_OFFLOAD_SLOTS; k++)
    if (!o->slots[k].uses && (best < 0 || o->slots[k].used_at < o->slots[best].used_at)) best = k;
  return best;
}

ts_status ts_offload_open(ts_engine *e) {
  const ts_model *m = e->model;
  ts_offload *o = calloc(1, sizeof *o);
  if (!o) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "offload: its state");
  e->offload = o;
  o->fd = -1;
  o->first = e->opts.dtype == TS_FP32 ? M : MASTER;
  o->piece = e->opts.offload_piece ? e->opts.offload_piece : TS_OFFLOAD_PIECE;
  snprintf(o->where, sizeof o->where, "%s", e->opts.offload_dir);
  for (int k = 0; k < TS_OFFLOAD_SLOTS; k++) o->slots[k].unit = o->slots[k].last_job = -1;
  pthread_mutex_init(&o->mu, NULL);
  pthread_cond_init(&o->work, NULL);
  pthread_cond_init(&o->done, NULL);
  o->n = calloc((size_t)m->n_units, sizeof *o->n);
  o->off = calloc((size_t)m->n_units, sizeof *o->off);
  if (!o->n || !o->off) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "offload: unit tables");
  int arrays = V - o->first + 1;
  TS_ENGINE_FOR_UNITS(e, u) {
    const ts_flat_layout *l = &e->units[u].layout;
    o->n[u] = e->zero->shard_optim ? l->shard : l->padded;
    o->off[u] = o->disk;
    o->disk += (size_t)arrays * stride(o, u);
    if (o->first == MASTER) o->disk_master += stride(o, u);
    o->disk_optim += 2 * stride(o, u);
    if (piece_bytes(o, u, 0) > o->slot_bytes) o->slot_bytes = piece_bytes(o, u, 0);
  }
  /* the slots: ALIGN more than the largest piece, for O_DIRECT's alignment */
  for (int k = 0; k < TS_OFFLOAD_SLOTS; k++)
    for (int a = o->first; a <= V; a++) {
      TS_CHECK(ts_ledger_alloc(&e->ledger, TS_DEVICE_CPU, a == MASTER ? TS_MEM_MASTER : TS_MEM_OPTIM,
                               o->slot_bytes + ALIGN, &o->slots[k].block[a]));
      /* beside a GPU page-locked: the update's copies read and write them */
      if (ts_engine_state_on_host(e) &&
          ts_k_host_register(&e->ctx, o->slots[k].block[a], o->slot_bytes + ALIGN) != TS_OK)
        return ts_set_error(TS_ERR_OUT_OF_MEMORY,
                            "`offload_dir` %s: cannot page-lock %zu bytes of host memory for a "
                            "piece of the optimizer state (%s): expected a higher locked-memory "
                            "limit (ulimit -l) or a smaller `offload_piece`",
                            o->where, o->slot_bytes + ALIGN, ts_last_error());
      o->slots[k].locked[a] = ts_engine_state_on_host(e);
      uintptr_t p = (uintptr_t)o->slots[k].block[a];
      o->slots[k].buf[a] = (float *)((p + ALIGN - 1) / ALIGN * ALIGN);
    }
  ts_ledger_charge_disk(&e->ledger, TS_MEM_MASTER, o->disk_master);
  ts_ledger_charge_disk(&e->ledger, TS_MEM_OPTIM, o->disk_optim);
  const ts_offload_store *store = e->offload_store ? e->offload_store : &ts_offload_file_store;
  return store->open(o, e);
}

/* The file store: a unique file under the folder, unlinked at once,
 * O_DIRECT where the file system takes it, sized whole (a disk too small
 * fails here), and the I/O thread. */
static ts_status open_file(ts_offload *o, ts_engine *e) {
  char path[4300];
  snprintf(path, sizeof path, "%s/.tessera-offload-%ld-%d-XXXXXX", o->where, (long)getpid(),
           e->rank);
  int fd = mkstemp(path);
  if (fd < 0)
    return ts_set_error(TS_ERR_IO, "`offload_dir` %s: cannot create a scratch file there: %s",
                        o->where, strerror(errno));
  unlink(path); /* scratch: gone when the file is closed, however the run ends */
  /* O_DIRECT through /proc/self/fd: the same file, the page cache bypassed
   * where the file system allows it (not tmpfs) */
  char self[64];
  snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
  int dfd = open(self, O_RDWR | O_DIRECT);
  if (dfd >= 0) {
    close(fd);
    fd = dfd;
    o->direct = 1;
  }
  o->fd = fd;
  int err = o->disk ? posix_fallocate(fd, 0, (off_t)o->disk) : 0;
  if (err)
    return ts_set_error(TS_ERR_IO, "`offload_dir` %s: %zu bytes of optimizer state do not fit: %s",
                        o->where, o->disk, strerror(err));
  if (pthread_create(&o->thread, NULL, io_thread, o) != 0)
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "offload: its I/O thread");
  o->started = 1;
  return TS_OK;
}

void ts_offload_close(ts_engine *e) {
  ts_offload *o = e->offload;
  if (!o) return;
  if (o->started) {
    pthread_mutex_lock(&o->mu);
    o->stop = 1;
    pthread_cond_signal(&o->work);
    pthread_mutex_unlock(&o->mu);
    pthread_join(o->thread, NULL); /* it ends the queue first */
  }
  if (o->fd >= 0) close(o->fd);
  for (int k = 0; k < TS_OFFLOAD_SLOTS; k++)
    for (int a = MASTER; a <= V; a++) {
      if (o->slots[k].locked[a]) ts_k_host_unregister(&e->ctx, o->slots[k].block[a]);
      ts_ledger_free(&e->ledger, o->slots[k].block[a]);
    }
  ts_ledger_discharge_disk(&e->ledger, TS_MEM_MASTER, o->disk_master);
  ts_ledger_discharge_disk(&e->ledger, TS_MEM_OPTIM, o->disk_optim);
  pthread_mutex_destroy(&o->mu);
  pthread_cond_destroy(&o->work);
  pthread_cond_destroy(&o->done);
  free(o->n);
  free(o->off);
  free(o->peek);
  free(o);
  e->offload = NULL;
}

int ts_offload_pieces(const ts_engine *e, int u) {
  const ts_offload *o = e->offload;
  return o->n[u] ? (int)((o->n[u] + o->piece - 1) / o->piece) : 0;
}

size_t ts_offload_piece_first(const ts_engine *e, int p) { return piece_lo(e->offload, p); }

ts_status ts_offload_acquire(ts_engine *e, int u, int p, float *arr[3]) {
  ts_offload *o = e->offload;
  pthread_mutex_lock(&o->mu);
  ts_status st = job_error(o);
  int k = st == TS_OK ? slot_of(o, u, p) : -1;
  if (st == TS_OK && k < 0) {
    k = victim(o);
    if (k < 0) {
      st = ts_set_error(TS_ERR_INTERNAL, "offload: unit %d piece %d acquired with all %d slots held",
                        u, p, TS_OFFLOAD_SLOTS);
    } else {
      o->slots[k].unit = u;
      o->slots[k].piece = p;
      queue_job(e, o, k, u, p, 0);
    }
  }
  if (st == TS_OK) {
    slot *s = &o->slots[k];
    s->uses++;
    s->used_at = ++o->clock;
    if (s->last_job >= 0) ts_engine_observe_io_wait(e, s->last_job);
    s->last_job = -1;
    while (s->pending) pthread_cond_wait(&o->done, &o->mu);
    st = job_error(o);
    for (int a = MASTER; a <= V; a++) arr[a] = s->buf[a]; /* master NULL in fp32 */
    if (st != TS_OK) s->uses--;
  }
  pthread_mutex_unlock(&o->mu);
  return st;
}

ts_status ts_offload_release(ts_engine *e, int u, int p, int dirty) {
  ts_offload *o = e->offload;
  pthread_mutex_lock(&o->mu);
  int k = slot_of(o, u, p);
  TS_ASSERT(k >= 0 && o->slots[k].uses > 0);
  o->slots[k].dirty |= dirty;
  if (--o->slots[k].uses == 0) {
    if (o->slots[k].dirty) queue_job(e, o, k, u, p, 1);
    o->slots[k].dirty = 0;
  }
  ts_status st = job_error(o);
  pthread_mutex_unlock(&o->mu);
  return st;
}

void ts_offload_prefetch(ts_engine *e, int u, int p) {
  ts_offload *o = e->offload;
  if (u < 0 || !ts_engine_owns(e, u) || p < 0 || p >= ts_offload_pieces(e, u)) return;
  pthread_mutex_lock(&o->mu);
  if (slot_of(o, u, p) < 0) {
    int k = victim(o);
    if (k >= 0) {
      o->slots[k].unit = u;
      o->slots[k].piece = p;
      o->slots[k].used_at = ++o->clock;
      queue_job(e, o, k, u, p, 0);
    }
  }
  pthread_mutex_unlock(&o->mu);
}

ts_status ts_offload_each(ts_engine *e, int u, size_t lo, size_t n, int dirty,
                          ts_status (*fn)(void *arg, float *const arr[3], size_t first,
                                          size_t count),
                          void *arg) {
  const ts_offload *o = e->offload;
  ts_status st = TS_OK;
  for (size_t i = lo; i < lo + n && st == TS_OK;) {
    int p = (int)(i / o->piece);
    size_t end = piece_lo(o, p) + piece_len(o, u, p);
    if (end > lo + n) end = lo + n;
    float *arr[3];
    TS_CHECK(ts_offload_acquire(e, u, p, arr));
    float *at[3]; /* element i of each array */
    for (int a = MASTER; a <= V; a++) at[a] = arr[a] ? arr[a] + (i - piece_lo(o, p)) : NULL;
    st = fn(arg, at, i, end - i);
    ts_status r = ts_offload_release(e, u, p, dirty && st == TS_OK);
    if (st == TS_OK) st = r;
    i = end;
  }
  return st;
}

/* ts_offload_peek's part: a piece's elements of one array into the copy. */
typedef struct peek_arg {
  float *dst;
  int array;
} peek_arg;

static ts_status peek_part(void *arg, float *const arr[3], size_t first, size_t count) {
  const peek_arg *q = arg;
  memcpy(q->dst + first, arr[q->array], count * sizeof(float));
  return TS_OK;
}

const float *ts_offload_peek(ts_engine *e, int u, int array) {
  ts_offload *o = e->offload;
  if (array < o->first || o->fd < 0) return NULL; /* nothing to look at without a file */
  size_t n = o->n[u];
  if (n > o->peek_n) {
    float *p = realloc(o->peek, n * sizeof *p);
    if (!p) {
      ts_set_error(TS_ERR_OUT_OF_MEMORY, "offload: %zu elements to look at", n);
      return NULL;
    }
    o->peek = p;
    o->peek_n = n;
  }
  peek_arg q = {o->peek, array};
  return ts_offload_each(e, u, 0, n, 0, peek_part, &q) == TS_OK ? o->peek : NULL;
}

/* The plan device's store: the bytes charged, no file, no thread (every
 * job is done at once: queue_job queues nothing without a file). */
static ts_status open_none(ts_offload *o, ts_engine *e) {
  (void)o;
  (void)e;
  return TS_OK;
}

const ts_offload_store ts_offload_file_store = {open_file}, ts_offload_no_store = {open_none};
