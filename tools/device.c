/*
 * device.c — `--device cpu|cuda|auto` of train, estimate and compare, and
 * which GPU a rank takes (tools.h).
 *
 * A rank's GPU is its local rank modulo the GPUs it sees, the local rank
 * read from the launcher's environment (Open MPI's
 * OMPI_COMM_WORLD_LOCAL_RANK, else MPICH's MPI_LOCALRANKID, else Slurm's
 * SLURM_LOCALID, else 0) — what torchrun's LOCAL_RANK gives a PyTorch job.
 * The ranks of a node share GPUs when the node runs more of them (the
 * world's ranks on this host, comm.h ts_comm_local_size: under mpirun or
 * srun alike) than it has GPUs.
 */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "kernels/kernels.h"
#include "tools/tools.h"

ts_status ts_tool_parse_device(const char *v, void *choice) {
  int *c = (int *)choice;
  if (strcmp(v, "cpu") == 0) *c = TS_TOOL_DEVICE_CPU;
  else if (strcmp(v, "cuda") == 0) *c = TS_TOOL_DEVICE_CUDA;
  else if (strcmp(v, "auto") == 0) *c = TS_TOOL_DEVICE_AUTO;
  else return ts_set_error(TS_ERR_INVALID_ARGUMENT, "expected cpu, cuda or auto");
  return TS_OK;
}

const char *ts_tool_device_choice_name(int choice) {
  return choice == TS_TOOL_DEVICE_CUDA ? "cuda" : choice == TS_TOOL_DEVICE_AUTO ? "auto" : "cpu";
}

/* The first of vars set in the environment, as an integer; dflt without. */
static int env_int(const char *const *vars, size_t n, int dflt) {
  for (size_t i = 0; i < n; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return atoi(v);
  }
  return dflt;
}

/* This process's rank on its node, from the launcher's environment. */
static int local_rank(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                     "SLURM_LOCALID"};
  return env_int(vars, sizeof vars / sizeof *vars, 0);
}

int ts_tool_gpu_shared(void) {
  int n = ts_k_device_count(TS_DEVICE_CUDA);
  return n > 0 && ts_comm_local_size() > n;
}

ts_status ts_tool_resolve_device(int choice, int need_gpu, ts_device *dev, int *index) {
  *dev = TS_DEVICE_CPU;
  *index = 0;
  if (choice == TS_TOOL_DEVICE_CPU) return TS_OK;
  int n = ts_k_device_count(TS_DEVICE_CUDA);
  if (n == 0) {
    if (choice == TS_TOOL_DEVICE_AUTO) return TS_OK;
    if (need_gpu)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "--device cuda: this process sees no CUDA GPU (no driver, no device, or "
                          "CUDA_VISIBLE_DEVICES hides them); use --device cpu or auto");
    *dev = TS_DEVICE_CUDA; /* a plan needs no GPU */
    return TS_OK;
  }
  *dev = TS_DEVICE_CUDA;
  *index = local_rank() % n;
  return TS_OK;
}
