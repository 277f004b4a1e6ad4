/* main.c — ts_tool_main (tools.h): the `tessera` command line, dispatched
 * to a subcommand; tessera.c and tessera_testing.c are the binaries. */
#include <stdio.h>
#include <string.h>

#include "tools/flags.h"
#include "tools/prepare.h"
#include "tools/tools.h"

static const char *USAGE =
    "usage: tessera <command> [flags]\n"
    "commands:\n"
    "  prepare   tokenize a corpus (a new tokenizer, or a model's) into token shards\n"
    "  train     train a model (several ranks: tessera launch -n N train ...)\n"
    "  estimate  per-rank memory by ledger category at ZeRO stages 0-3 (no MPI)\n"
    "  simulate  predicted step time, exposed communication and MFU on a cluster (no MPI)\n"
    "  compare   train at ZeRO stages 0-3 and compare measured memory, speed, losses\n"
    "  export    a checkpoint as a Hugging Face folder (config.json + safetensors)\n"
    "  generate  text from a checkpoint or a Hugging Face LLaMA folder\n"
    "  timeline  one step of a train --trace file: the pipeline's bubble and picture\n"
    "run `tessera <command> --help` for its flags\n";

int ts_tool_main(int argc, char **argv) {
  /* under a launcher, only the lead rank prints the usage (every rank
   * parses alike, so every rank exits the same) */
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    if (ts_flags_is_lead()) fputs(USAGE, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "train")) return ts_tool_train(argc - 1, argv + 1);
  if (!strcmp(cmd, "prepare")) return ts_tool_prepare(argc - 1, argv + 1);
  if (!strcmp(cmd, "estimate")) return ts_tool_estimate(argc - 1, argv + 1);
  if (!strcmp(cmd, "simulate")) return ts_tool_simulate(argc - 1, argv + 1);
  if (!strcmp(cmd, "compare")) return ts_tool_compare(argc - 1, argv + 1);
  if (!strcmp(cmd, "export")) return ts_tool_export(argc - 1, argv + 1);
  if (!strcmp(cmd, "generate")) return ts_tool_generate(argc - 1, argv + 1);
  if (!strcmp(cmd, "timeline")) return ts_tool_timeline(argc - 1, argv + 1);
  if (ts_flags_is_lead()) fprintf(stderr, "tessera: unknown command '%s'\n%s", cmd, USAGE);
  return 2;
}
