/*
 * tools.h — the subcommands of the `tessera` binary (main.c dispatches to
 * them; their flags go through tools/flags.h). Each ts_tool_X(argc, argv)
 * gets argv[0] = "X" and returns the process exit status: 0 success (and
 * --help), 1 failure while running, 2 bad usage. These print to
 * stdout/stderr; nothing below tools/ does.
 */
#ifndef TS_TOOLS_TOOLS_H
#define TS_TOOLS_TOOLS_H

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The `tessera` command line: argv[1] names the subcommand (train,
 * prepare, estimate, compare, export, timeline); returns the exit status
 * (no argument: the usage on stderr, 2). tools/main.c. */
int ts_tool_main(int argc, char **argv);

/* --device of train, estimate and compare (tools/device.c). */
enum { TS_TOOL_DEVICE_CPU = 0, TS_TOOL_DEVICE_CUDA = 1, TS_TOOL_DEVICE_AUTO = 2 };
/* Flag parser: "cpu", "cuda" or "auto" into *(int *)choice. */
ts_status ts_tool_parse_device(const char *v, void *choice);
const char *ts_tool_device_choice_name(int choice);
/* The device and GPU ordinal of this rank for a --device choice: cpu; cuda
 * (GPU local_rank % GPUs seen; with none, TS_ERR_INVALID_ARGUMENT when
 * need_gpu, else CUDA ordinal 0 for a plan); auto (cuda when a GPU is seen,
 * else cpu). Local rank from OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or
 * SLURM_LOCALID (0 without). */
ts_status ts_tool_resolve_device(int choice, int need_gpu, ts_device *dev, int *index);

/* 1 when this node runs more ranks (comm.h ts_comm_local_size: call it
 * after ts_comm_init) than this process sees GPUs (at least one), so
 * ranks share a GPU (ts_engine_opts.gpu_shared); else 0. */
int ts_tool_gpu_shared(void);

/* Runs argv (argv[0] a path) with stdout and stderr to the file `log`,
 * waits, and returns its exit status: 128 + signal when killed, -1 when it
 * could not start (tools/spawn.c). */
int ts_tool_spawn(char *const argv[], const char *log);

/* The cores this process may run on (its CPU affinity: what `nproc`
 * counts without OMP_NUM_THREADS), at least 1 (tools/spawn.c). */
int ts_tool_cores(void);

/* `tessera timeline TRACE`: one step of a train --trace file, its measured
 * bubble and picture (tools/timeline.h). */
int ts_tool_timeline(int argc, char **argv);

/* `tessera export CHECKPOINT --out DIR`: a checkpoint as a Hugging Face
 * folder (tools/export_main.c). */
int ts_tool_export(int argc, char **argv);

/* `tessera generate`: text from a checkpoint or a Hugging Face LLaMA
 * folder (tools/generate_main.c; tools/sample.h). */
int ts_tool_generate(int argc, char **argv);

/* `tessera train`: parses the flags (--help lists them) into a
 * ts_train_config, runs ts_train_run with a progress line on stdout, prints a
 * summary with the validation loss next to the unigram baseline of
 * DATA/meta.json. */
int ts_tool_train(int argc, char **argv);
/* ts_tool_prepare: see tools/prepare.h */

/* `tessera estimate`: per-rank bytes by ledger category for a model config
 * (or Ψ alone) at ZeRO stages 0-3, from ts_engine_plan; no MPI. */
int ts_tool_estimate(int argc, char **argv);

/* Flag parsers shared by estimate and simulate (tools/flags.h
 * ts_flag_parse_fn): --zero a ZeRO stage 0-3 or all (-1) into an int;
 * --dtype into a ts_dtype; --activation-checkpointing
 * (ts_train_parse_recompute) into a size_t. */
ts_status ts_tool_parse_zero_stages(const char *v, void *stage);
ts_status ts_tool_parse_dtype(const char *v, void *dtype);
ts_status ts_tool_parse_recompute(const char *v, void *every);
/* --fp8: off, tensorwise or rowwise into a ts_fp8_scaling (train and
 * estimate). */
ts_status ts_tool_parse_fp8(const char *v, void *scaling);
/* --schedule: gpipe or 1f1b into a ts_schedule_kind. */
ts_status ts_tool_parse_schedule(const char *v, void *kind);
/* --offload none|optimizer|params into a ts_engine_opts (offload_optimizer;
 * params: offload_params and offload_optimizer). */
ts_status ts_tool_parse_offload(const char *v, void *opts);

/* `tessera simulate`: a step's predicted time, exposed communication,
 * bytes per link class, tokens/s per rank and MFU on a cluster
 * (engine/simulate.h), ZeRO stages 0-3 side by side. */
int ts_tool_simulate(int argc, char **argv);

/* `tessera compare`: trains one configuration at several ZeRO stages (and
 * dtypes, checkpointing settings) through tools/launch.sh and writes
 * compare.md, compare.csv and compare.png: measured memory beside the
 * estimate, speed, communication, and the identical-loss check. */
int ts_tool_compare(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif /* TS_TOOLS_TOOLS_H */
