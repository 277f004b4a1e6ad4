/* export_main.c — `tessera export CHECKPOINT --out DIR`: a tessera
 * checkpoint (any layout it was saved at) as a Hugging Face model folder
 * (models/hf_folder.h) that transformers' from_pretrained loads. The
 * weights are the fp32 master weights (the parameters of an fp32 run),
 * consolidated from every rank's slices, written in --dtype. One process;
 * no MPI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/checkpoint.h"
#include "models/hf_folder.h"
#include "tools/flags.h"
#include "tools/tools.h"

static const char *USAGE =
    "usage: tessera export CHECKPOINT --out DIR [--dtype fp32|bf16|fp16] [--max-shard-size BYTES]\n"
    "  CHECKPOINT: a step folder (with index.json) or a folder of them (its newest).\n"
    "  DIR gets config.json and model.safetensors (sharded with model.safetensors.index.json\n"
    "  past --max-shard-size), loadable with transformers' from_pretrained.\n";

/* The exporter's source: the checkpoint's fp32 master weights. */
typedef struct source {
  ts_checkpoint *ck;
  ts_checkpoint_kind kind; /* master, or param of an fp32 checkpoint */
} source;

static ts_status read_weights(void *user, const char *name, float *dst, size_t numel) {
  source *s = user;
  return ts_checkpoint_read_tensor(s->ck, name, s->kind, dst, numel);
}

static ts_status parse_dtype(const char *v, void *dtype) { return ts_dtype_parse(v, dtype); }

int ts_tool_export(int argc, char **argv) {
  const char *out = NULL, *dtype_set = NULL;
  ts_dtype dtype = TS_FP32;
  size_t max_shard = TS_HF_MAX_SHARD_BYTES;
  const ts_flag flags[] = {
      TS_FLAG_STRING("--out", "-o", &out, "DIR", "the Hugging Face folder to write; required",
                     NULL),
      TS_FLAG_CUSTOM("--dtype", NULL, &dtype, parse_dtype, "fp32|bf16|fp16",
                     "dtype of the weights written (default: the checkpoint's compute dtype)",
                     &dtype_set),
      TS_FLAG_SIZE("--max-shard-size", NULL, &max_shard, 1, "BYTES",
                   "largest safetensors file before sharding (default 5000000000, "
                   "transformers' 5GB)",
                   NULL),
  };
  /* the checkpoint is the one positional word, first */
  if (argc < 2 || argv[1][0] == '-') {
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
      ts_flags_parse("export", flags, sizeof flags / sizeof *flags, argc, argv, USAGE);
      return 0;
    }
    return ts_flags_error("export", "expected the checkpoint folder first: %s", "tessera export CHECKPOINT --out DIR");
  }
  const char *where = argv[1];
  argv[1] = argv[0];
  int r = ts_flags_parse("export", flags, sizeof flags / sizeof *flags, argc - 1, argv + 1, USAGE);
  if (r != TS_FLAGS_OK) return r == TS_FLAGS_HELP ? 0 : 2;
  if (!out) return ts_flags_error("export", "--out DIR is required " TS_FLAGS_HINT);
  char dir[4096];
  if (!ts_checkpoint_latest(where, dir, sizeof dir, NULL))
    return fprintf(stderr,
                   "tessera export: %s: no complete checkpoint there (a folder "
                   "with " TS_CHECKPOINT_INDEX ", or step-N folders holding one)\n",
                   where),
           1;
  char config[4200], *text = NULL;
  snprintf(config, sizeof config, "%s/config.json", dir);
  ts_model model;
  memset(&model, 0, sizeof model);
  source src = {NULL, TS_CHECKPOINT_MASTER};
  ts_status st = ts_model_load(config, &model);
  if (st == TS_OK) st = ts_checkpoint_open(&src.ck, dir, &model);
  if (st == TS_OK) st = ts_checkpoint_verify(src.ck, 0, 1);
  if (st == TS_OK) st = ts_checkpoint_read_extra(src.ck, "config.json", &text, NULL);
  if (st == TS_OK) {
    ts_checkpoint_info info;
    ts_checkpoint_get_info(src.ck, &info);
    if (!strcmp(info.dtype, "fp32")) src.kind = TS_CHECKPOINT_PARAM;
    if (!dtype_set) ts_dtype_parse(info.dtype, &dtype);
    st = ts_hf_export(out, &model, text, dtype, max_shard, read_weights, &src);
  }
  free(text);
  ts_checkpoint_close(src.ck);
  ts_model_free(&model);
  if (st != TS_OK) {
    fprintf(stderr, "tessera export: %s\n", ts_flags_last_error());
    return 1;
  }
  printf("exported %s (%s) to %s\n", dir, ts_dtype_name(dtype), out);
  return 0;
}
