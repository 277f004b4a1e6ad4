/*
 * thread.c — the communication thread (DESIGN.md "Communication overlap"):
 * ts_comm_set_thread puts a group's calls on a thread of its own that runs
 * them on the group's transport in submission order, so a collective
 * started with a non-blocking call (ts_comm_iall_gather, ...) moves and
 * sums its data while the caller computes, and ts_comm_wait returns once
 * the thread has finished it. It is a backend (backend.h) wrapped around
 * the group's own one: the front still checks and counts every call on
 * the caller's thread; only the transport's work moves.
 *
 * Invariants:
 * - One queue per group, first in, first out: the thread runs one call at
 *   a time, blocking, on a shadow of the group that holds the transport's
 *   own backend and state. Every rank submits a group's collectives in the
 *   same order (comm.h), so the threads of the ranks meet in that order.
 * - Blocking calls go through the queue too (submit, then wait), so a call
 *   never overtakes an earlier non-blocking one and the transport's state
 *   is only ever touched by the thread. ts_comm_split drains the queue and
 *   splits on the caller's thread while the thread is idle.
 * - The data the thread writes (recv, the reduce-scatter's scratch) belongs
 *   to the call until its wait returns (comm.h's rule for non-blocking
 *   calls); the thread touches nothing else of the caller's.
 * - Sums are the transport's own (comm/sum.h, rank order): which thread
 *   runs them, and when, changes no bit.
 * - An error on the thread is kept (status and message) and returned by
 *   the call's wait on the caller's thread; the thread goes on with the
 *   next call.
 * - Needs MPI_THREAD_MULTIPLE (the caller's thread keeps making MPI calls
 *   on other groups, e.g. a pipeline's sends): ts_comm_init asks for it,
 *   and ts_comm_set_thread refuses a group of an MPI that gave less.
 *
 * Test hook (comm_testing.h): a delay before every call the thread runs,
 * drawn at random up to a bound, moves every completion in time without
 * moving any bit.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/backend.h"

/* One call in the queue. */
typedef struct thread_item {
  ts_comm_call d;           /* the call as checked by the front */
  int blocking;             /* the caller waits for it (run blocking on the thread) */
  ts_comm_request *inner;   /* a started non-blocking call: the transport's request */
  int done;                 /* 1 once the thread has finished it */
  ts_status st;             /* its status */
  char err[1024];           /* its message when st != TS_OK */
  double t_start, t_end;    /* when the thread began and finished it (us, CLOCK_REALTIME) */
  struct thread_item *next; /* the queue, then the list of started calls */
} thread_item;

/* A group's thread (ts_comm.impl while it runs). */
typedef struct thread_state {
  ts_comm inner;       /* the group on its own transport: backend, state, rank, size, name */
  pthread_t thread;    /* runs worker() */
  pthread_mutex_t mu;  /* guards everything below */
  pthread_cond_t work; /* signalled on a new item or stop */
  pthread_cond_t done; /* signalled when an item finishes */
  thread_item *head;   /* next to run */
  thread_item *tail;   /* last submitted */
  int busy;            /* items submitted and not yet finished */
  int stop;            /* 1: finish the queue and exit */
  int requests;        /* requests handed out and not yet waited */
  int waiters;         /* callers blocked in item_wait (the thread then polls at once) */
  int refs;            /* ts_comm_set_thread(c, 1) calls not yet undone */
  uint64_t rng;        /* the test delay's generator (xorshift64) */
} thread_state;

/* The request of a non-blocking call, its queue item inside (both from
 * the group's pool: nothing is allocated per call). */
typedef struct thread_request {
  ts_comm_request base; /* first member (backend.h) */
  thread_item item;     /* the call in the queue, until wait */
} thread_request;

/* ---- the test delay ------------------------------------------------------------ */

/* backend.h's knobs (tests set them: comm_testing.h) */
unsigned ts_comm_thread_delay_max_us;
uint64_t ts_comm_thread_delay_seed = 1;

/* The delay before the next call: uniform in [0, ts_comm_thread_delay_max_us] us. */
static unsigned next_delay(thread_state *t) {
  if (!ts_comm_thread_delay_max_us) return 0;
  uint64_t x = t->rng;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  t->rng = x;
  return (unsigned)(x % ((uint64_t)ts_comm_thread_delay_max_us + 1));
}

static void sleep_us(unsigned us) {
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* ---- the thread -------------------------------------------------------------------- */

/* Marks it finished with status st (its message kept), under the lock. */
static void finish(thread_state *t, thread_item *it, ts_status st) {
  it->t_end = ts_comm_now_us();
  if (st != TS_OK) snprintf(it->err, sizeof it->err, "%s", ts_last_error());
  pthread_mutex_lock(&t->mu);
  it->st = st;
  it->done = 1;
  t->busy--;
  pthread_cond_broadcast(&t->done);
  pthread_mutex_unlock(&t->mu);
}

/* Starts it on the transport: a blocking call runs to its end, a
 * non-blocking one is started and appended to *started (finished at once
 * if the start fails). */
static void start(thread_state *t, thread_item *it, thread_item ***started) {
  unsigned delay = next_delay(t);
  if (delay) sleep_us(delay);
  it->t_start = ts_comm_now_us();
  it->d.blocking = it->blocking;
  ts_status st = t->inner.be->run(&t->inner, &it->d, it->blocking ? NULL : &it->inner);
  if (st != TS_OK || it->blocking) {
    finish(t, it, st);
    return;
  }
  it->next = NULL;
  **started = it;
  *started = &it->next;
}

static void *worker(void *arg) {
  thread_state *t = (thread_state *)arg;
  thread_item *running = NULL, **tail = &running; /* started, not finished, in order */
  unsigned nap = 0;                               /* us slept between idle polls */
  for (;;) {
    pthread_mutex_lock(&t->mu);
    while (!t->head && !running && !t->stop) pthread_cond_wait(&t->work, &t->mu);
    thread_item *todo = t->head;
    t->head = t->tail = NULL;
    int stop = t->stop;
    pthread_mutex_unlock(&t->mu);
    if (!todo && !running && stop) return NULL; /* stopped with nothing left */
    int progress = todo != NULL;
    while (todo) {
      thread_item *next = todo->next;
      start(t, todo, &tail);
      todo = next;
    }
    /* Test every started call; finish the ones that are done. */
    for (thread_item **p = &running; *p;) {
      thread_item *it = *p;
      int done = 0;
      ts_status st = TS_OK;
      if (t->inner.be->test) {
        st = t->inner.be->test(it->inner, &done);
      } else {
        st = t->inner.be->wait(it->inner);
        done = 1;
      }
      if (!done) {
        p = &it->next;
        continue;
      }
      *p = it->next;
      if (!*p) tail = p;
      finish(t, it, st);
      progress = 1;
    }
    if (progress || !running) {
      nap = 0;
      continue;
    }
    /* Nothing finished: nap unless the caller is waiting (then poll on). */
    pthread_mutex_lock(&t->mu);
    if (t->waiters == 0 && !t->head && !t->stop) {
      nap = nap ? (nap * 2 > 400 ? 400 : nap * 2) : 10;
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += (long)nap * 1000;
      if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&t->work, &t->mu, &until);
    } else {
      nap = 0;
    }
    pthread_mutex_unlock(&t->mu);
  }
}

/* Waits until the thread has finished it; its status, with its message
 * set on this thread. Does not free it. */
static ts_status item_wait(thread_state *t, thread_item *it) {
  pthread_mutex_lock(&t->mu);
  if (!it->done) {
    t->waiters++;
    pthread_cond_signal(&t->work); /* cut the thread's nap short */
    while (!it->done) pthread_cond_wait(&t->done, &t->mu);
    t->waiters--;
  }
  pthread_mutex_unlock(&t->mu);
  if (it->st != TS_OK) return ts_set_error(it->st, "%s", it->err);
  return TS_OK;
}

/* Waits until every submitted item has finished. */
static void drain(thread_state *t) {
  pthread_mutex_lock(&t->mu);
  while (t->busy > 0) pthread_cond_wait(&t->done, &t->mu);
  pthread_mutex_unlock(&t->mu);
}

/* ---- the backend ------------------------------------------------------------------ */

static ts_status thread_run(ts_comm *c, const ts_comm_call *d, ts_comm_request **req) {
  thread_state *t = (thread_state *)c->impl;
  thread_item blocking_item; /* a blocking call's: the caller waits for it here */
  thread_item *it = &blocking_item;
  thread_request *q = NULL;
  if (req) {
    /* the transport's requests this call and those in flight may take on
     * the thread (one more: a blocking call's), made here ahead */
    pthread_mutex_lock(&t->mu);
    int in_flight = t->requests;
    pthread_mutex_unlock(&t->mu);
    TS_CHECK(ts_comm_pool_reserve(&t->inner, in_flight + 2));
    ts_comm_request *r = NULL;
    TS_CHECK(ts_comm_request_new(c, d->name, sizeof *q, &r));
    q = (thread_request *)r;
    it = &q->item;
  }
  memset(it, 0, sizeof *it);
  it->d = *d;
  it->blocking = req == NULL;
  pthread_mutex_lock(&t->mu);
  if (t->tail)
    t->tail->next = it;
  else
    t->head = it;
  t->tail = it;
  t->busy++;
  if (q) t->requests++;
  pthread_cond_signal(&t->work);
  pthread_mutex_unlock(&t->mu);
  if (q) {
    *req = &q->base;
    return TS_OK;
  }
  return item_wait(t, it);
}

static ts_status thread_wait(ts_comm_request *req) {
  thread_request *q = (thread_request *)req;
  thread_state *t = (thread_state *)req->c->impl;
  ts_status st = item_wait(t, &q->item);
  if (req->times) {
    req->times[0] = q->item.t_start;
    req->times[1] = q->item.t_end;
  }
  pthread_mutex_lock(&t->mu);
  t->requests--;
  pthread_mutex_unlock(&t->mu);
  ts_comm_request_release(req);
  return st;
}

static ts_status thread_split(ts_comm *parent, int color, int key, const char *name,
                              ts_comm **out) {
  thread_state *t = (thread_state *)parent->impl;
  drain(t); /* the transport is idle: the split may use it from this thread */
  return t->inner.be->split(&t->inner, color, key, name, out);
}

/* Stops the thread after its queue and frees it; the transport's state
 * stays (the caller restores or frees it). */
static void thread_stop(thread_state *t) {
  pthread_mutex_lock(&t->mu);
  t->stop = 1;
  pthread_cond_signal(&t->work);
  pthread_mutex_unlock(&t->mu);
  pthread_join(t->thread, NULL);
  pthread_cond_destroy(&t->work);
  pthread_cond_destroy(&t->done);
  pthread_mutex_destroy(&t->mu);
}

static void thread_free_group(ts_comm *c) {
  thread_state *t = (thread_state *)c->impl;
  thread_stop(t);
  t->inner.be->free_group(&t->inner);
  ts_comm_dealloc(t);
}

static const ts_comm_backend thread_backend = {
    .name = "thread",
    .caps = {.moves = 1, .async = 1},
    .run = thread_run,
    .wait = thread_wait,
    .split = thread_split,
    .free_group = thread_free_group,
};

int ts_comm_thread_active(const ts_comm *c) { return c && c->be == &thread_backend; }

ts_status ts_comm_set_thread(ts_comm *c, int on) {
  static const char *op = "ts_comm_set_thread";
  if (!c) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: c is NULL", op);
  if (c->be == &thread_backend) {
    thread_state *t = (thread_state *)c->impl;
    if (on) {
      t->refs++;
      return TS_OK;
    }
    if (t->refs > 1) {
      t->refs--;
      return TS_OK;
    }
    drain(t);
    if (t->requests > 0)
      return ts_set_error(TS_ERR_INVALID_USAGE,
                          "%s: group %s has %d requests not yet waited (ts_comm_wait them first)",
                          op, c->name, t->requests);
    thread_stop(t);
    c->be = t->inner.be;
    c->impl = t->inner.impl;
    ts_comm_dealloc(t);
    return TS_OK;
  }
  if (!on) return TS_OK;
  /* calls the caller's thread drives among two or more ranks (MPI, staged
   * or not): a stream's (NCCL) are asynchronous already, a plan moves
   * nothing, one rank (self) has nothing to overlap */
  if (!c->be->caps.moves || c->be->caps.async || c->size < 2)
    return ts_set_error(TS_ERR_UNSUPPORTED,
                        "%s: group %s has %d rank(s) on the %s transport: only MPI groups "
                        "(staged or not) run beside the caller",
                        op, c->name, c->size, c->be->name);
  if (!ts_comm_mpi_thread_multiple())
    return ts_set_error(TS_ERR_UNSUPPORTED,
                        "%s: MPI was initialised without MPI_THREAD_MULTIPLE (ts_comm_init asks "
                        "for it)",
                        op);
  thread_state *t = (thread_state *)ts_comm_alloc(sizeof *t, 1);
  if (!t) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot allocate the thread", op);
  t->inner = *c;
  t->refs = 1;
  t->rng = (ts_comm_thread_delay_seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(c->rank + 1))) | 1;
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->work, NULL);
  pthread_cond_init(&t->done, NULL);
  int rc = pthread_create(&t->thread, NULL, worker, t);
  if (rc != 0) {
    pthread_cond_destroy(&t->work);
    pthread_cond_destroy(&t->done);
    pthread_mutex_destroy(&t->mu);
    ts_comm_dealloc(t);
    return ts_set_error(TS_ERR_UNSUPPORTED, "%s: pthread_create: %s", op, strerror(rc));
  }
  c->be = &thread_backend;
  c->impl = t;
  return TS_OK;
}
