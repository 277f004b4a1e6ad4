/*
 * tools.h — the subcommands of the `tessera` binary (main.c dispatches to
 * them; their flags go through tools/flags.h). Each ts_tool_X(argc, argv)
 * gets argv[0] = "X" and returns the process exit status: 0 success (and
 * --help), 1 failure while running, 2 bad usage. These print to
 * stdout/stderr; nothing below tools/ does.
 */
#ifndef TS_TOOLS_TOOLS_H
#define TS_TOOLS_TOOLS_H

#ifdef __cplusplus
extern "C" {
#endif

/* `tessera train`: parses the flags (--help lists them) into a
 * ts_train_config, runs ts_train_run with a progress line on stdout, prints a
 * summary with the validation loss next to the unigram baseline of
 * DATA/meta.json. */
int ts_tool_train(int argc, char **argv);
/* ts_tool_prepare: see tools/prepare.h */

/* `tessera estimate`: per-rank bytes by ledger category for a model config
 * (or Ψ alone) at ZeRO stages 0-3, from ts_engine_plan; no MPI. */
int ts_tool_estimate(int argc, char **argv);

/* `tessera compare`: trains one configuration at several ZeRO stages (and
 * dtypes, checkpointing settings) through tools/launch.sh and writes
 * compare.md, compare.csv and compare.png: measured memory beside the
 * estimate, speed, communication, and the identical-loss check. */
int ts_tool_compare(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif /* TS_TOOLS_TOOLS_H */
