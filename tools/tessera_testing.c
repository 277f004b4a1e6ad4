/* tessera_testing.c — a test-only `tessera` (//tools:tessera_testing):
 * the same command line, with the engine's test seam (engine_testing.h)
 * set from the environment before it runs, for the shell tests that kill,
 * stop or slow a rank mid-run (tools/checkpoint_test.sh, launch
 * --max-restarts, tools/watchdog_train_test.sh):
 *
 *   TESSERA_TEST_KILL="RANK:STEP:MARKER"   world rank RANK raises SIGKILL
 *       after training step STEP (and its save), once: only while the file
 *       MARKER does not exist (it is created first), so a restarted job
 *       runs through.
 *   TESSERA_TEST_STOP="RANK:STEP:MARKER"   the same with SIGSTOP: the rank
 *       stays alive and never answers (the watchdog's case).
 *   TESSERA_TEST_SLOW="RANK:MS"            world rank RANK sleeps MS
 *       milliseconds after unit 0's backward in every micro-step: a
 *       straggler whose compute is slow.
 *   TESSERA_TEST_KILL_LOAD="RANK:MARKER"   world rank RANK raises SIGKILL
 *       in a resume's checkpoint read, before its first tensor, once
 *       (while MARKER does not exist).
 *   TESSERA_TEST_DISK_FAIL="RANK:JOB"      on world rank RANK the first
 *       offload write-back numbered JOB or later fails with EIO, as a disk
 *       failing mid-run would (train --offload-dir).
 *
 * RANK is the world rank Open MPI gives (OMPI_COMM_WORLD_RANK, else
 * PMIX_RANK). The production binary (tessera.c) has no such hook and
 * reads no such variable. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine_testing.h"
#include "tools/tools.h"

static int fault_rank = -1, fault_signal;
static size_t fault_step;
static char fault_marker[4096];
static int slow_rank = -1, slow_ms, my_rank = -1;
static int disk_rank = -1, disk_failed;
static long long disk_job;

/* after_step: the kill or stop, at most once per marker. */
static void fault_after_step(void *user, size_t step, int rank) {
  (void)user;
  if (rank != fault_rank || step != fault_step || access(fault_marker, F_OK) == 0) return;
  FILE *f = fopen(fault_marker, "w");
  if (f) fclose(f);
  raise(fault_signal);
}

/* after_backward: the straggler's sleep. */
static ts_status slow_after_backward(void *user, struct ts_engine *e, int step, int unit,
                                     void *grads) {
  (void)user, (void)e, (void)step, (void)grads;
  if (my_rank != slow_rank || unit != 0) return TS_OK;
  struct timespec t = {slow_ms / 1000, (long)(slow_ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
  return TS_OK;
}

/* offload_io: one failing write-back (the I/O thread; one engine per rank). */
static int disk_offload_io(void *user, int write, int unit, long long job) {
  (void)user, (void)unit;
  if (my_rank != disk_rank || !write || job < disk_job || disk_failed) return 0;
  disk_failed = 1;
  return EIO;
}

static ts_engine_hooks hooks;

/* load_point: SIGKILL in a resume's checkpoint read, at most once per
 * marker (TESSERA_TEST_KILL_LOAD). */
static int load_rank = -1;
static char load_marker[4096];
static void kill_load_point(void *user) {
  (void)user;
  if (my_rank != load_rank || access(load_marker, F_OK) == 0) return;
  FILE *f = fopen(load_marker, "w");
  if (f) fclose(f);
  raise(SIGKILL);
}

/* This process's world rank (Open MPI's OMPI_COMM_WORLD_RANK, else
 * PMIX_RANK; 0 outside a job). */
static int world_rank(void) {
  const char *r = getenv("OMPI_COMM_WORLD_RANK");
  if (!r) r = getenv("PMIX_RANK");
  return r ? atoi(r) : 0;
}

/* Parses "RANK:STEP:MARKER" of variable name for signal sig. */
static int parse_fault(const char *name, int sig) {
  const char *spec = getenv(name);
  if (!spec) return 0;
  if (sscanf(spec, "%d:%zu:%4095s", &fault_rank, &fault_step, fault_marker) != 3) {
    fprintf(stderr, "tessera_testing: %s=%s: expected RANK:STEP:MARKER\n", name, spec);
    return -1;
  }
  fault_signal = sig;
  hooks.after_step = fault_after_step;
  return 0;
}

int main(int argc, char **argv) {
  if (parse_fault("TESSERA_TEST_KILL", SIGKILL) || parse_fault("TESSERA_TEST_STOP", SIGSTOP))
    return 2;
  const char *slow = getenv("TESSERA_TEST_SLOW");
  if (slow) {
    if (sscanf(slow, "%d:%d", &slow_rank, &slow_ms) != 2 || slow_ms < 0) {
      fprintf(stderr, "tessera_testing: TESSERA_TEST_SLOW=%s: expected RANK:MS\n", slow);
      return 2;
    }
    my_rank = world_rank();
    hooks.after_backward = slow_after_backward;
  }
  const char *disk = getenv("TESSERA_TEST_DISK_FAIL");
  if (disk) {
    if (sscanf(disk, "%d:%lld", &disk_rank, &disk_job) != 2 || disk_job < 0) {
      fprintf(stderr, "tessera_testing: TESSERA_TEST_DISK_FAIL=%s: expected RANK:JOB\n", disk);
      return 2;
    }
    my_rank = world_rank();
    hooks.offload_io = disk_offload_io;
  }
  const char *load = getenv("TESSERA_TEST_KILL_LOAD");
  if (load) {
    if (sscanf(load, "%d:%4095s", &load_rank, load_marker) != 2) {
      fprintf(stderr, "tessera_testing: TESSERA_TEST_KILL_LOAD=%s: expected RANK:MARKER\n", load);
      return 2;
    }
    my_rank = world_rank();
    hooks.load_point = kill_load_point;
  }
  if (hooks.after_step || hooks.after_backward || hooks.offload_io || hooks.load_point)
    ts_engine_set_hooks(&hooks);
  return ts_tool_main(argc, argv);
}
