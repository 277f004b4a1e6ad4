/*
 * mpi_hang.c — a job in which the last rank stops (SIGSTOP: alive, never
 * answering) while the others wait for it, under the watchdog
 * (ts_comm_set_timeout 2 s), for watchdog_test.sh:
 *   mpi_hang all-reduce   ranks 0..N-2 all-reduce on the world
 *   mpi_hang thread       ranks 0..N-2 all-gather on the world through a
 *                         communication thread (its polled path)
 *   mpi_hang recv         rank 0 receives from the last rank, the others
 *                         exit 0 at once
 *   mpi_hang init         the last rank stops before MPI_Init_thread, so the
 *                         others wait inside it (the watchdog's guard thread)
 * Each waiting rank sets a context first (step 7, unit 3, micro-batch 1;
 * recv: step 4, pipeline stage 0) so the line it prints can be checked. The
 * job must end with status 4 (TS_COMM_EXIT_TIMEOUT) within the timeout plus
 * a few seconds of the stop, the stopped rank killed by mpirun; 0 would mean
 * a wait returned without the stopped rank, 1 a setup failure. With
 * TS_HANG_MARK set, the stopping rank creates that file just before it
 * stops, so the time to the job's end is measured from the stop (not from
 * a start-up that a loaded machine makes slow).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"

/* Stops this process (SIGSTOP), first creating $TS_HANG_MARK if set. */
static void stop_here(void) {
  const char *mark = getenv("TS_HANG_MARK");
  FILE *f = mark ? fopen(mark, "w") : NULL;
  if (f) fclose(f);
  raise(SIGSTOP);
}

int main(int argc, char **argv) {
  ts_comm *world = NULL;
  const char *env_rank = getenv("OMPI_COMM_WORLD_RANK"), *env_size = getenv("OMPI_COMM_WORLD_SIZE");
  if (argc == 2 && !strcmp(argv[1], "init") && env_rank && env_size) {
    ts_comm_set_timeout(2, "--comm-timeout");
    if (atoi(env_rank) == atoi(env_size) - 1) {
      fprintf(stderr, "mpi_hang: rank %s stops before MPI_Init_thread\n", env_rank);
      stop_here();
    }
  }
  if (ts_comm_init(&argc, &argv) != TS_OK || ts_comm_world(&world) != TS_OK) {
    fprintf(stderr, "mpi_hang: %s\n", ts_last_error());
    return 1;
  }
  int n = ts_comm_size(world), r = ts_comm_rank(world);
  const char *mode = argc == 2 ? argv[1] : "";
  int all_reduce = !strcmp(mode, "all-reduce"), thread = !strcmp(mode, "thread"),
      recv = !strcmp(mode, "recv");
  if (!(all_reduce || thread || recv) || n < 2) {
    fprintf(stderr, "usage: mpirun -n N (N >= 2) mpi_hang all-reduce|thread|recv|init\n");
    return 1;
  }
  if (ts_comm_set_timeout(2, "--comm-timeout") != TS_OK || ts_comm_barrier(world) != TS_OK) {
    fprintf(stderr, "mpi_hang: %s\n", ts_last_error());
    return 1;
  }
  if (r == n - 1) {
    fprintf(stderr, "mpi_hang: rank %d stops\n", r);
    stop_here();
    return 0; /* never reached: mpirun kills it */
  }
  if (recv && r != 0) return 0;
  ts_comm_context ctx = {7, 3, -1, 1};
  if (recv) ctx = (ts_comm_context){4, -1, 0, -1};
  ts_comm_set_context(&ctx);
  enum { COUNT = 1024 };
  static float buf[COUNT * 8], out[COUNT * 8];
  static char scratch[sizeof buf];
  ts_status st;
  if (recv) {
    st = ts_comm_recv(world, buf, COUNT, TS_FP32, n - 1, 9);
  } else if (all_reduce) {
    st = ts_comm_all_reduce(world, buf, COUNT, TS_FP32, scratch, sizeof scratch);
  } else {
    ts_comm_request *q = NULL;
    st = ts_comm_set_thread(world, 1);
    if (st == TS_OK) st = ts_comm_iall_gather(world, buf, out, COUNT, TS_FP32, &q);
    if (st == TS_OK) st = ts_comm_wait(q);
  }
  fprintf(stderr, "mpi_hang: rank %d's %s returned: %s %s\n", r, mode, ts_status_str(st),
          ts_last_error());
  return 0;
}
