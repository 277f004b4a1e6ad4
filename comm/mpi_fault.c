/*
 * mpi_fault.c — a two-rank job in which rank 1 fails while rank 0 waits in
 * a collective that rank 1 never enters (for rank_exit_test and
 * rank_abort_test, see BUILD):
 *   mpi_fault exit    rank 1 calls _exit(3), as a crashing rank would;
 *   mpi_fault abort   rank 1 calls ts_comm_abort(5), as a tool does after
 *                     printing its error.
 * mpirun must then end the job with that status instead of leaving rank 0
 * waiting. Exit status 0 would mean rank 0 completed its all-reduce (it
 * cannot: rank 1 never sends), 1 a setup failure.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"

int main(int argc, char **argv) {
  ts_comm *world = NULL;
  if (ts_comm_init(&argc, &argv) != TS_OK || ts_comm_world(&world) != TS_OK) {
    fprintf(stderr, "mpi_fault: %s\n", ts_last_error());
    return 1;
  }
  if (argc != 2 || (strcmp(argv[1], "exit") != 0 && strcmp(argv[1], "abort") != 0) ||
      ts_comm_size(world) != 2) {
    fprintf(stderr, "usage: mpirun -n 2 mpi_fault exit|abort\n");
    return 1;
  }
  if (ts_comm_rank(world) == 1) {
    /* Give rank 0 time to enter its all-reduce first. */
    struct timespec pause = {0, 200 * 1000 * 1000};
    nanosleep(&pause, NULL);
    fprintf(stderr, "mpi_fault: rank 1 leaves (%s)\n", argv[1]);
    if (strcmp(argv[1], "exit") == 0) _exit(3);
    ts_comm_abort(5);
  }
  float buf[1024] = {0};
  char scratch[sizeof buf];
  ts_status st = ts_comm_all_reduce(world, buf, 1024, TS_FP32, scratch, sizeof scratch);
  fprintf(stderr, "mpi_fault: rank 0's all-reduce returned: %s %s\n", ts_status_str(st),
          ts_last_error());
  ts_comm_free(world);
  ts_comm_finalize();
  return 0;
}
