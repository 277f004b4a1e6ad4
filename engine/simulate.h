/*
 * simulate.h — a step's time on a cluster this machine cannot hold
 * (DESIGN.md "Several nodes"): the engine's own step, replayed on the plan
 * device (ts_engine_plan_build: the allocations, the kernels' checks and
 * the groups' counted calls of a real step, nothing computed or moved),
 * with a clock. Each unit's forward, recompute, backward and AdamW costs
 * compute time; each collective and send costs link time by an α-β model
 * of its algorithm; a started call runs on its group's channel in the
 * order the step started it (the communication thread or stream as built)
 * and the step waits for it where the engine waits. What the step waited
 * for beyond its compute is the exposed communication.
 *
 * One rank per pipeline stage is simulated: data-parallel rank 0 of the
 * stage's first shard group, whose peers run the same schedule at the
 * same time. Pipeline stages (P > 1) each replay their own step (their
 * units, the schedule's action list: GPipe or 1F1B) and meet where the
 * engine's do: a receive ends when its send has crossed the link, and the
 * pipeline group's collectives (the loss, the norm) start when the last
 * stage starts them. The waits for other stages are the pipeline's
 * (the bubble and the transfers between stages), kept apart from the
 * exposed communication of the data-parallel groups.
 */
#ifndef TS_ENGINE_SIMULATE_H
#define TS_ENGINE_SIMULATE_H

#include <stdint.h>

#include "base/base.h"
#include "engine/engine.h"
#include "models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A link: bandwidth in bytes/s, latency (α) in seconds. */
typedef struct ts_sim_link {
  double bandwidth;
  double latency;
} ts_sim_link;

/* The algorithm a collective is timed by. With p ranks, n the buffer's
 * bytes (an all-gather's or reduce-scatter's whole (N, count) buffer, an
 * all-reduce's buffer), W the bottleneck bandwidth and α its latency:
 *  - direct: every rank sends its part to every other at once (tessera's
 *    CPU transport, comm/mpi.c): α + max(bytes within the node / W_intra,
 *    R x bytes across / W_node), R the node's ranks, who all run the same
 *    call at once (on their own groups when the group has fewer of them)
 *    and share the node's link. Within the node the bytes move by copies
 *    of the ranks' own cores (shared memory): W_intra is divided by the
 *    compute's slowdown (ranks sharing cores), and a started call's copies
 *    (bytes within / that W_intra) take the compute stream's time, since
 *    the cores that copy are the ones that compute;
 *  - ring: all-gather and reduce-scatter (p - 1)(α + n/(p W)), all-reduce
 *    twice that (Thakur, Rabenseifner and Gropp, "Optimization of
 *    Collective Communication Operations in MPICH", IJHPCA 2005, §4.1 and
 *    §4.4: (p-1)α + (p-1)/p nβ per half);
 *  - tree: all-reduce 2 ceil(log2 p) α + 2 n / W (two pipelined binary
 *    trees each carrying half the data, as NCCL's double binary tree:
 *    Sanders, Speck and Träff, "Two-tree algorithms for full bandwidth
 *    broadcast, reduction and scan", Parallel Computing 2009); others as
 *    ring;
 *  - best: per call the faster of ring and tree (NCCL's tuner picks).
 * A group within one node uses the intra link per rank; a group spanning
 * nodes uses, for ring and tree, the slower of the intra link and its
 * share of the node's link: W_node x local / R, where local of the node's
 * R ranks are in the group (R / local groups cross the node's link at
 * once, as hybrid sharding's replica groups do).
 * A broadcast is ceil(log2 p)(α) + n / W, a pipeline send α + n / W. */
typedef enum ts_sim_algorithm {
  TS_SIM_DIRECT = 0,
  TS_SIM_RING = 1,
  TS_SIM_TREE = 2,
  TS_SIM_BEST = 3,
} ts_sim_algorithm;

typedef struct ts_sim_cluster {
  int ranks_per_node;         /* L consecutive world ranks per node (devices per node) */
  ts_sim_link intra;          /* within a node, per rank (each GPU's NVLink) */
  ts_sim_link inter;          /* across nodes, per node (its NICs together) */
  ts_sim_algorithm algorithm; /* of every collective */
} ts_sim_cluster;

/* The compute: per unit and micro-batch either measured seconds (a
 * profile; < 0: not measured) or the FLOP model (models/model.h
 * ts_unit_forward_flops: 2 x its matrices' parameters + 4 T C for a
 * block's attention per token), a backward twice that, a recompute one forward, at efficiency x peak_flops; AdamW
 * of a shard of n elements moves 32 n bytes (parameter, gradient, master,
 * m, v read; parameter, master, m, v written) at mem_bandwidth, or, with a
 * measured optimizer step (one rank updating every parameter), that step's
 * seconds per parameter x n. Every time is multiplied by slowdown (>= 1:
 * ranks sharing cores). */
typedef struct ts_sim_compute {
  double peak_flops;    /* per rank, FLOP/s: the MFU's denominator */
  double efficiency;    /* fraction of peak_flops the products reach, (0, 1] */
  double mem_bandwidth; /* bytes/s for AdamW */
  double slowdown;      /* >= 1 */
  /* measured seconds per micro-batch, per unit ([n_units], or NULL): */
  const double *forward, *backward, *recompute;
  double optimizer; /* measured seconds of the whole optimizer step's compute on one rank
                       holding every parameter, < 0: model */
  double other;     /* seconds per step outside the unit ops (the batch's load, the norm,
                       the host's bookkeeping), added once; 0: none */
  /* > 0: all the ranks (N, of every stage) run on one machine of this many
   * cores, as on this machine or its test bed. A rank computing, copying
   * or waiting for its data-parallel group holds a core (an MPI wait
   * polls; the group's ranks wait together, so no other wants the core);
   * a rank waiting for another pipeline stage leaves its core to the
   * stages that compute (Open MPI yields when ranks oversubscribe the
   * cores). Compute and copies then take share x their time, share =
   * max(1, the ranks holding a core on average over the step / cores),
   * found by simulating again until it settles: N / cores without
   * pipelines. 0: a device per rank. Times slowdown, if both. */
  double shared_cores;
  /* opts->offload_dir: the offload folder's disk, bytes/s read and written
   * (> 0; a job at a time, in queue order: offload.h's I/O thread) */
  double disk_read, disk_write;
  /* opts->offload_optimizer: the state in host memory beside each device
   * (ZeRO-Offload), updated as train does it: a unit's gradient copied to
   * the host over host_link (bytes/s each way; fp32 its parameters too),
   * AdamW at host_mem_bandwidth (bytes/s, 32 per element as on the
   * device), the parameters copied back; one after another (> 0 each) */
  double host_link, host_mem_bandwidth;
} ts_sim_compute;

typedef struct ts_sim_result {
  double step_s;         /* the step: the compute stream's end (a pipeline's: its slowest
                            stage's; the other figures are the bottleneck stage's, whose
                            compute and exposed communication are the most, with the
                            time it waits for the step's end as pipeline wait) */
  double compute_s;      /* the compute in it */
  double exposed_comm_s; /* the step's waits for its data-parallel communication */
  double pipeline_wait_s; /* its waits for other pipeline stages: the bubble, the
                             transfers between stages, the pipeline group's collectives */
  double comm_busy_s;    /* the channels' busy time (overlapped or not) */
  double exposed_io_s;   /* opts->offload_dir: the step's waits for the disk (a unit's state
                            not yet read when its update needs it) */
  double io_busy_s;      /* the disk's busy time in the step (reads and write-backs) */
  uint64_t bytes;        /* sent by the rank in the step (the comm counters; a pipeline's:
                            the most any stage's rank sends) */
  uint64_t remote_bytes; /* of them across nodes (likewise) */
  double tokens_per_s;   /* per rank: B T K / step_s / P */
  double mfu;            /* tokens_per_s x flops_per_token / peak_flops */
  size_t peak_bytes;     /* the plan's peak total on the device (ledger), bytes (a
                            pipeline's: its largest stage's) */
  int ops;               /* unit ops (forward, recompute, backward, AdamW) replayed (a
                            pipeline's: all stages') */
  int calls;             /* collectives and sends replayed (likewise) */
} ts_sim_result;

/* Simulates the second of two steps of `model` under opts on dp_size
 * data-parallel ranks (hybrid sharding: opts->shard_group) per pipeline
 * stage (opts->pipeline_stages P; world rank = stage x dp_size + dp rank)
 * laid on `cluster`, computing by `compute`. TS_ERR_INVALID_ARGUMENT (a
 * bandwidth, rate or efficiency <= 0, a latency < 0, slowdown < 1,
 * ranks_per_node < 1: naming the field), the plan's errors
 * (ts_engine_plan_stage), TS_ERR_INTERNAL (stages whose sends and
 * receives do not pair). */
ts_status ts_simulate(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                      const ts_sim_cluster *cluster, const ts_sim_compute *compute,
                      ts_sim_result *out);
/* ts_simulate, with each stage's own result in stages[P] (NULL: not
 * wanted): its step, compute, waits, bytes, peak, ops and calls. */
ts_status ts_simulate_stages(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                             const ts_sim_cluster *cluster, const ts_sim_compute *compute,
                             ts_sim_result *out, ts_sim_result *stages);

/* The seconds one call costs under cluster: kind (ts_comm_kind), bytes
 * this rank sends (of them remote across nodes), buffer n, on a group of p
 * ranks of which `local` share this rank's node, whose R ranks
 * (node_ranks >= local) all run it at once. Exposed for tests. */
double ts_sim_call_seconds(const ts_sim_cluster *cluster, int kind, uint64_t bytes, uint64_t remote,
                           uint64_t buffer, int p, int local, int node_ranks);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_SIMULATE_H */
