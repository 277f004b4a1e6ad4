/*
 * watchdog.c — the watchdog's own parts (comm.h "the watchdog"): the
 * deadline and the caller's context, the world's host names, the one line
 * a rank prints when a wait passes the deadline, and the guard thread
 * over MPI's own blocking calls. The deadlines of the transfers are kept
 * where their requests are (mpi.c: ts_comm_watchdog_expired on each poll);
 * this file makes no MPI call.
 *
 * Invariants:
 * - Everything that ends a process for a deadline goes through fire():
 *   one line to stderr, written with write(2) (a hung rank may hold
 *   stdio's locks; stdout is flushed only if its lock is free), then
 *   _exit(TS_COMM_EXIT_TIMEOUT).
 * - Settings are process-wide and set before the calls they govern
 *   (ts_comm_set_timeout before ts_comm_init); the context is copied into
 *   each call by the front when it starts (comm.c), so a communication
 *   thread reads only its calls' copies.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/backend.h"

/* ---- settings ----------------------------------------------------------------- */

static double g_timeout_s;                           /* 0: no deadline */
static char g_setting[64] = "timeout";               /* how the user sets it, for the line */
static ts_comm_context g_context = {-1, -1, -1, -1}; /* copied into every call */

ts_status ts_comm_set_timeout(double seconds, const char *setting) {
  if (!(seconds >= 0 && seconds <= 1e9)) /* NaN fails too */
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "ts_comm_set_timeout: %g s: expected 0 (none) to 1e9 seconds", seconds);
  g_timeout_s = seconds;
  snprintf(g_setting, sizeof g_setting, "%s", setting && *setting ? setting : "timeout");
  return TS_OK;
}

double ts_comm_timeout(void) { return g_timeout_s; }

void ts_comm_set_context(const ts_comm_context *ctx) {
  static const ts_comm_context none = {-1, -1, -1, -1};
  g_context = ctx ? *ctx : none;
}

ts_comm_context ts_comm_get_context(void) { return g_context; }

int ts_comm_watchdog_expired(double *t0) {
  if (g_timeout_s <= 0) return 0;
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  double now = (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
  if (*t0 == 0) *t0 = now;
  return now - *t0 > g_timeout_s;
}

/* ---- the world's hosts ---------------------------------------------------------- */

/* Every world rank's host, from ts_comm_watchdog_set_hosts; NULL before. */
static char (*g_hosts)[TS_COMM_HOST_CHARS];
static int g_world_rank, g_world_size = 1;

void ts_comm_watchdog_set_hosts(int rank, int size, char (*hosts)[TS_COMM_HOST_CHARS]) {
  ts_comm_dealloc(g_hosts);
  g_hosts = hosts;
  g_world_rank = rank;
  g_world_size = size;
}

const char *ts_comm_host(int world_rank) {
  if (!g_hosts || world_rank < 0 || world_rank >= g_world_size) return "?";
  return g_hosts[world_rank];
}

int ts_comm_local_size(void) {
  if (!g_hosts) return 1;
  int n = 0;
  for (int w = 0; w < g_world_size; w++)
    n += strncmp(g_hosts[w], g_hosts[g_world_rank], TS_COMM_HOST_CHARS) == 0;
  return n;
}

/* ---- the line ------------------------------------------------------------------- */

/* A line being written: text[0..len), at most sizeof text - 2 characters
 * (room for the newline). */
typedef struct line {
  char text[2048];
  size_t len;
} line;

/* Appends printf output to l, truncating. */
static void add(line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(line *l, const char *fmt, ...) {
  size_t cap = sizeof l->text - 1;
  if (l->len >= cap - 1) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(l->text + l->len, cap - l->len, fmt, ap);
  va_end(ap);
  if (k > 0) l->len = l->len + (size_t)k < cap - 1 ? l->len + (size_t)k : cap - 1;
}

/* "tessera: comm timeout on rank R of N (host H): " — before the hosts
 * are gathered, the launcher's rank and this machine's name. */
static void start(line *l) {
  if (g_hosts) {
    add(l, "tessera: comm timeout on rank %d of %d (host %s): ", g_world_rank, g_world_size,
        ts_comm_host(g_world_rank));
    return;
  }
  const char *rank = getenv("OMPI_COMM_WORLD_RANK");
  if (!rank) rank = getenv("PMIX_RANK");
  char host[TS_COMM_HOST_CHARS] = "?";
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
  host[sizeof host - 1] = '\0';
  add(l, "tessera: comm timeout on rank %s (host %s): ", rank ? rank : "?", host);
}

/* Ends l, writes it to stderr and ends the process with exit code 4. */
static void fire(line *l) __attribute__((noreturn));
static void fire(line *l) {
  add(l, "; stopping the job (exit code %d)", TS_COMM_EXIT_TIMEOUT);
  l->text[l->len++] = '\n';
  if (ftrylockfile(stdout) == 0) {
    fflush(stdout);
    funlockfile(stdout);
  }
  ssize_t w = write(2, l->text, l->len);
  (void)w;
  _exit(TS_COMM_EXIT_TIMEOUT);
}

/* The call's words for a line: "ts_comm_iall_gather" -> "all-gather". */
static void op_words(const char *name, char *out, size_t cap) {
  static const char *const started[] = {"ireduce_scatter", "iall_gather", "ibroadcast", "isend",
                                        "irecv"};
  const char *w = strncmp(name, "ts_comm_", 8) == 0 ? name + 8 : name;
  for (size_t i = 0; i < sizeof started / sizeof *started; i++)
    if (strcmp(w, started[i]) == 0) w++;
  snprintf(out, cap, "%s", w);
  for (char *p = out; *p; p++)
    if (*p == '_') *p = '-';
}

void ts_comm_watchdog_fire(const char *group, const char *name, ts_comm_call_kind kind,
                           const ts_comm_context *ctx, const int *missing, int n) {
  line l = {.len = 0};
  char op[48];
  op_words(name, op, sizeof op);
  start(&l);
  add(&l, "%s on group \"%s\" waited %g s (%s %g)", op, group, g_timeout_s, g_setting,
      g_timeout_s);
  if (ctx->step == 0) add(&l, " during setup");
  if (ctx->step > 0) add(&l, " at step %lld", ctx->step);
  if (ctx->unit >= 0) add(&l, ", unit %d", ctx->unit);
  if (ctx->stage >= 0) add(&l, ", pipeline stage %d", ctx->stage);
  if (ctx->micro_batch >= 0) add(&l, ", micro-batch %d", ctx->micro_batch);
  if (kind == TS_COMM_CALL_SEND || kind == TS_COMM_CALL_RECV) {
    int w = n > 0 ? missing[0] : -1;
    add(&l, ": peer rank %d (host %s) did not answer", w, ts_comm_host(w));
  } else {
    add(&l, ": ranks that did not arrive:");
    for (int i = 0; i < n && i < 16; i++)
      add(&l, "%s %d (host %s)", i ? "," : "", missing[i], ts_comm_host(missing[i]));
    if (n > 16) add(&l, " and %d more", n - 16);
  }
  fire(&l);
}

/* ---- the guard over MPI's own blocking calls ------------------------------------ */

/* MPI_Init_thread and the collectives that make communicators block inside
 * MPI, where no poll sees the deadline: this thread watches them. Started
 * on the first guarded call with a deadline set. */
static pthread_mutex_t g_guard_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_guard_cv = PTHREAD_COND_INITIALIZER;
static const char *g_guard_call;  /* the MPI call in progress; NULL: none */
static unsigned long g_guard_seq; /* counts ts_comm_guard_begin calls */
static int g_guard_started;       /* 1 once the thread runs (or failed to start: 2) */

static void *guard_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&g_guard_mu);
  for (;;) {
    while (!g_guard_call) pthread_cond_wait(&g_guard_cv, &g_guard_mu);
    unsigned long seq = g_guard_seq;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double end = (double)until.tv_sec + (double)until.tv_nsec * 1e-9 + g_timeout_s;
    until.tv_sec = (time_t)end;
    until.tv_nsec = (long)((end - (double)until.tv_sec) * 1e9);
    int rc = 0;
    while (g_guard_call && g_guard_seq == seq && rc != ETIMEDOUT)
      rc = pthread_cond_timedwait(&g_guard_cv, &g_guard_mu, &until);
    if (g_guard_call && g_guard_seq == seq) {
      line l = {.len = 0};
      start(&l);
      add(&l,
          "%s waited %g s (%s %g) during start-up: ranks that did not arrive: not known inside "
          "MPI",
          g_guard_call, g_timeout_s, g_setting, g_timeout_s);
      fire(&l);
    }
  }
  return NULL;
}

void ts_comm_guard_begin(const char *call) {
  if (g_timeout_s <= 0) return;
  pthread_mutex_lock(&g_guard_mu);
  if (!g_guard_started) {
    pthread_t th;
    g_guard_started = pthread_create(&th, NULL, guard_main, NULL) == 0 ? 1 : 2;
    if (g_guard_started == 1) pthread_detach(th);
  }
  g_guard_call = call;
  g_guard_seq++;
  pthread_cond_broadcast(&g_guard_cv);
  pthread_mutex_unlock(&g_guard_mu);
}

void ts_comm_guard_end(void) {
  pthread_mutex_lock(&g_guard_mu);
  g_guard_call = NULL;
  pthread_cond_broadcast(&g_guard_cv);
  pthread_mutex_unlock(&g_guard_mu);
}
