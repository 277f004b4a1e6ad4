/* tessera_testing.c — a test-only `tessera` (//tools:tessera_testing):
 * the same command line, with the engine's test seam (engine_testing.h)
 * set from the environment before it runs, for the shell tests that kill a
 * rank mid-run (tools/checkpoint_test.sh, launch --max-restarts):
 *
 *   TESSERA_TEST_KILL="RANK:STEP:MARKER"   world rank RANK raises SIGKILL
 *       after training step STEP (and its save), once: only while the file
 *       MARKER does not exist (it is created first), so a restarted job
 *       runs through.
 *
 * The production binary (tessera.c) has no such hook and reads no such
 * variable. */
#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/engine_testing.h"
#include "tools/tools.h"

static int kill_rank = -1;
static size_t kill_step;
static char kill_marker[4096];

/* after_step: the kill, at most once per marker. */
static void kill_after_step(void *user, size_t step, int rank) {
  (void)user;
  if (rank != kill_rank || step != kill_step || access(kill_marker, F_OK) == 0) return;
  FILE *f = fopen(kill_marker, "w");
  if (f) fclose(f);
  raise(SIGKILL);
}

static const ts_engine_hooks kill_hooks = {.after_step = kill_after_step};

int main(int argc, char **argv) {
  const char *spec = getenv("TESSERA_TEST_KILL");
  if (spec) {
    if (sscanf(spec, "%d:%zu:%4095s", &kill_rank, &kill_step, kill_marker) != 3) {
      fprintf(stderr, "tessera_testing: TESSERA_TEST_KILL=%s: expected RANK:STEP:MARKER\n", spec);
      return 2;
    }
    ts_engine_set_hooks(&kill_hooks);
  }
  return ts_tool_main(argc, argv);
}
