/* main.c — the `tessera` binary: dispatches to a subcommand. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/prepare.h"
#include "tools/tools.h"

/* The subcommand running, for the prefix of shared flag errors. */
static const char *tool_name = "";

int ts_tool_is_lead(void) {
  static const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *v = getenv(vars[i]);
    if (v) return strcmp(v, "0") == 0;
  }
  return 1;
}

int ts_parse_size(const char *flag, const char *value, size_t min, size_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(value, &end, 10);
  if (errno || end == value || *end || value[0] == '-' || v < min) {
    if (ts_tool_is_lead())
      fprintf(stderr, "tessera%s%s: %s %s: expected an integer >= %zu\n", *tool_name ? " " : "",
              tool_name, flag, value, min);
    return 0;
  }
  *out = (size_t)v;
  return 1;
}

int ts_parse_float(const char *flag, const char *value, float *out) {
  char *end;
  errno = 0;
  float v = strtof(value, &end);
  if (errno || end == value || *end || !isfinite(v)) {
    if (ts_tool_is_lead())
      fprintf(stderr, "tessera%s%s: %s %s: expected a finite number\n", *tool_name ? " " : "",
              tool_name, flag, value);
    return 0;
  }
  *out = v;
  return 1;
}

static const char *USAGE =
    "usage: tessera <command> [flags]\n"
    "commands:\n"
    "  prepare   train a SentencePiece tokenizer and write token shards\n"
    "  train     train a model (several ranks: tessera launch -n N train ...)\n"
    "  estimate  per-rank memory by ledger category at ZeRO stages 0-3 (no MPI)\n"
    "  compare   train at ZeRO stages 0-3 and compare measured memory, speed, losses\n"
    "run `tessera <command> --help` for its flags\n";

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    fputs(USAGE, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char *cmd = argv[1];
  tool_name = cmd;
  if (!strcmp(cmd, "train")) return ts_tool_train(argc - 1, argv + 1);
  if (!strcmp(cmd, "prepare")) return ts_tool_prepare(argc - 1, argv + 1);
  if (!strcmp(cmd, "estimate")) return ts_tool_estimate(argc - 1, argv + 1);
  if (!strcmp(cmd, "compare")) return ts_tool_compare(argc - 1, argv + 1);
  fprintf(stderr, "tessera: unknown command '%s'\n%s", cmd, USAGE);
  return 2;
}
