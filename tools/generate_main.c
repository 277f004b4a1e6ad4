/* generate_main.c — `tessera generate`: text from a LLaMA model, a
 * tessera checkpoint or a Hugging Face folder, with its key/value cache
 * (models/generate.h) on the CPU or a GPU; and ts_tool_sample, the same
 * for `train --sample-every`. One process; no MPI. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "engine/checkpoint.h"
#include "models/generate.h"
#include "models/hf_folder.h"
#include "tools/flags.h"
#include "tools/sample.h"
#include "tools/text_tokenizer.h"
#include "tools/tools.h"

static const char *USAGE =
    "usage: tessera generate (--checkpoint DIR | --hf DIR) (--prompt TEXT | --prompt-ids IDS |\n"
    "                        --fill-mask TEXT)\n"
    "                        [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
    "                        [--seed S] [--tokenizer DIR] [--device cpu|cuda|auto] [--dtype D]\n"
    "  Prints the prompt and what the model writes after it. Greedy unless --temperature > 0\n"
    "  (then top-k, then top-p, as transformers' generate); a seed repeats its text.\n"
    "  --checkpoint: a step folder or a folder of them (its newest); its tokenizer is the\n"
    "  training data's (DATA/tokenizer.model, from trainer.json) unless --tokenizer names one.\n"
    "  --hf: a Hugging Face LLaMA folder; its own tokenizer.model.\n"
    "  --fill-mask \"... [MASK] ...\" (BERT): the --top-k likeliest tokens at each [MASK].\n";

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- printing tokens as they come -------------------------------------------- */

typedef struct printer {
  const ts_text_tokenizer *tok; /* NULL: print ids */
  int32_t *ids;                 /* the prompt's ids, then the new ones */
  size_t n_prompt, n;
  size_t printed; /* bytes of their text already printed (the prompt's at first) */
  FILE *out;
} printer;

/* Prints the part of the whole sequence's text not yet printed, holding
 * back a tail that ends in U+FFFD (a character whose bytes have not all
 * come). The prompt is decoded with the new ids (and its own text skipped)
 * because a piece's leading space is dropped at the start of a text. */
static int print_token(void *user, int32_t token) {
  printer *p = user;
  p->ids[p->n++] = token;
  if (!p->tok) {
    fprintf(p->out, "%s%d", p->n > p->n_prompt + 1 ? " " : "", token);
    fflush(p->out);
    return 0;
  }
  char *text = ts_text_tokenizer_decode(p->tok, p->ids, p->n);
  if (!text) return 0;
  size_t len = strlen(text);
  int partial = len >= 3 && !memcmp(text + len - 3, "\xef\xbf\xbd", 3);
  if (!partial && len > p->printed) {
    fputs(text + p->printed, p->out);
    fflush(p->out);
    p->printed = len;
  }
  free(text);
  return 0;
}

ts_status ts_tool_sample(const ts_model *m, ts_weights_fn read, void *user,
                         const ts_tool_sample_opts *o, FILE *out) {
  const ts_text_tokenizer *tok = o->tokenizer;
  int32_t *prompt = NULL;
  size_t n = 0;
  if (o->prompt_ids) {
    n = o->n_prompt_ids;
    prompt = malloc((n ? n : 1) * sizeof *prompt);
    if (!prompt) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "prompt");
    memcpy(prompt, o->prompt_ids, n * sizeof *prompt);
  } else {
    TS_CHECK(ts_text_tokenizer_encode(tok, o->prompt, &prompt, &n));
  }
  for (size_t i = 0; i < n; i++)
    if (prompt[i] < 0 || (size_t)prompt[i] >= m->vocab_size) {
      int32_t bad = prompt[i];
      free(prompt);
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "prompt token %d: expected 0..%zu of %s", bad,
                          m->vocab_size - 1, ts_model_origin(m));
    }
  size_t max_T = n + o->max_new;
  if (max_T > m->max_seq) {
    free(prompt);
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "a prompt of %zu tokens and %zu new ones: %zu positions, expected at "
                        "most max_position_embeddings = %zu of %s",
                        n, o->max_new, max_T, m->max_seq, ts_model_origin(m));
  }
  ts_generator_opts go = {o->device, o->dtype, max_T, o->recompute};
  ts_generator *g = NULL;
  double t0 = now();
  ts_status st = ts_generator_create(&g, m, &go, read, user);
  int32_t *ids = malloc((o->max_new ? o->max_new : 1) * sizeof *ids);
  printer pr = {o->prompt_ids ? NULL : tok, malloc((n + o->max_new) * sizeof(int32_t)), n, n, 0,
                out};
  if (st == TS_OK && (!ids || !pr.ids))
    st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "generate: %zu ids", o->max_new);
  if (st == TS_OK) {
    memcpy(pr.ids, prompt, n * sizeof *prompt);
    char *head = pr.tok ? ts_text_tokenizer_decode(pr.tok, prompt, n) : NULL;
    pr.printed = head ? strlen(head) : 0;
    free(head);
  }
  int32_t eos = tok && !o->ignore_eos ? ts_text_tokenizer_eos(tok) : -1;
  size_t got = 0;
  double t1 = now(), t2 = t1;
  if (st == TS_OK) {
    if (!o->prompt_ids) fputs(o->prompt, out);
    fflush(out);
    ts_sampling s = {o->temperature, o->top_k, o->top_p, o->seed};
    st = ts_generate(g, prompt, n, o->max_new, &s, &eos, eos >= 0, ids, &got, print_token, &pr);
    t2 = now();
    if (got || !o->prompt_ids) fputc('\n', out); /* the line printed so far ends */
    fflush(out);
  }
  if (st == TS_OK && o->stats)
    fprintf(stderr,
            "generate: %zu prompt tokens, %zu new in %.3f s (%.1f tokens/s; load %.2f s) "
            "on %s, %s, %s\n",
            n, got, t2 - t1, got / (t2 - t1 > 0 ? t2 - t1 : 1e-9), t1 - t0,
            o->device == TS_DEVICE_CUDA ? "cuda" : "cpu", ts_dtype_name(o->dtype),
            o->recompute ? "recomputing the prefix" : "key/value cache");
  ts_generator_free(g);
  free(prompt);
  free(ids);
  free(pr.ids);
  return st;
}

/* ---- BERT: the likeliest tokens at each [MASK] ---------------------------------- */

typedef struct ranked {
  double p;
  int32_t id;
} ranked;

/* Descending by probability, then ascending by id. */
static int by_p(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->p != y->p) return x->p > y->p ? -1 : 1;
  return (x->id > y->id) - (x->id < y->id);
}

/* The text, then a line per [MASK]: its k likeliest tokens and their
 * probabilities (softmax over the vocabulary at that position), as
 * transformers' fill-mask pipeline lists them. */
static ts_status fill_mask(const ts_model *m, ts_weights_fn read, void *user,
                           const ts_text_tokenizer *tok, const char *text, size_t k,
                           ts_device dev, ts_dtype dt, FILE *out) {
  int32_t *ids = NULL;
  size_t n = 0, *masks = NULL, n_masks = 0, V = m->vocab_size;
  TS_CHECK(ts_text_tokenizer_encode_masked(tok, text, &ids, &n, &masks, &n_masks));
  ts_status st = TS_OK;
  if (n > m->max_seq)
    st = ts_set_error(TS_ERR_INVALID_ARGUMENT,
                      "--fill-mask: %zu tokens with [CLS] and [SEP], expected at most "
                      "max_position_embeddings = %zu of %s",
                      n, m->max_seq, ts_model_origin(m));
  ts_generator_opts go = {dev, dt, n, 1};
  ts_generator *g = NULL;
  float *logits = malloc(n_masks * V * sizeof *logits);
  ranked *r = malloc(V * sizeof *r);
  if (st == TS_OK && (!logits || !r)) st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "--fill-mask");
  if (st == TS_OK) st = ts_generator_create(&g, m, &go, read, user);
  if (st == TS_OK) st = ts_generator_forward(g, ids, n, masks, n_masks, logits);
  if (st == TS_OK) fprintf(out, "%s\n", text);
  for (size_t j = 0; st == TS_OK && j < n_masks; j++) {
    const float *x = logits + j * V;
    double mx = x[0], z = 0;
    for (size_t v = 1; v < V; v++) mx = x[v] > mx ? x[v] : mx;
    for (size_t v = 0; v < V; v++) z += exp((double)x[v] - mx);
    for (size_t v = 0; v < V; v++) r[v] = (ranked){exp((double)x[v] - mx) / z, (int32_t)v};
    qsort(r, V, sizeof *r, by_p);
    fprintf(out, "[MASK] %zu:", j + 1);
    for (size_t i = 0; i < k && i < V; i++) {
      char *piece = ts_text_tokenizer_decode(tok, &r[i].id, 1);
      fprintf(out, "%s \"%s\" %.4f", i ? " |" : "", piece ? piece : "?", r[i].p);
      free(piece);
    }
    fputc('\n', out);
  }
  ts_generator_free(g);
  free(ids);
  free(masks);
  free(logits);
  free(r);
  return st;
}

/* ---- where the weights come from ---------------------------------------------- */

typedef struct source {
  ts_checkpoint *ck;
  ts_checkpoint_kind kind;
  ts_hf_folder *hf;
} source;

static ts_status read_weights(void *user, const char *name, float *dst, size_t numel) {
  source *s = user;
  if (s->hf) return ts_hf_folder_read(s->hf, name, dst, numel);
  return ts_checkpoint_read_tensor(s->ck, name, s->kind, dst, numel);
}

static int is_dir(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The checkpoint's training data folder (trainer.json "data") into out. */
static int data_dir_of(const ts_checkpoint *ck, char *out, size_t cap) {
  char *text = NULL;
  if (ts_checkpoint_read_extra(ck, "trainer.json", &text, NULL) != TS_OK) return 0;
  cJSON *j = cJSON_Parse(text);
  const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "data");
  int ok = cJSON_IsString(d) && d->valuestring[0];
  if (ok) snprintf(out, cap, "%s", d->valuestring);
  cJSON_Delete(j);
  free(text);
  return ok;
}

/* "1,2,3" into ids (malloc'd). */
static ts_status parse_ids(const char *v, int32_t **ids, size_t *n) {
  size_t cap = 1;
  for (const char *c = v; *c; c++) cap += *c == ',';
  *ids = malloc(cap * sizeof **ids);
  *n = 0;
  if (!*ids) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "--prompt-ids");
  const char *c = v;
  while (*c) {
    char *end;
    long x = strtol(c, &end, 10);
    if (end == c || x < 0 || x > INT32_MAX || (*end && *end != ','))
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "--prompt-ids %s: expected token ids separated by commas (\"1,2,3\")", v);
    (*ids)[(*n)++] = (int32_t)x;
    c = *end ? end + 1 : end;
  }
  if (*n == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--prompt-ids: empty, expected at least one id");
  return TS_OK;
}

int ts_tool_generate(int argc, char **argv) {
  const char *ck_dir = NULL, *hf_dir = NULL, *tok_dir = NULL, *prompt = NULL, *prompt_ids = NULL,
             *fill = NULL;
  size_t max_new = 64, top_k = 0, seed = 0;
  float temperature = 0.0f, top_p = 1.0f;
  int device = TS_TOOL_DEVICE_CPU, no_cache = 0, ignore_eos = 0;
  ts_dtype dtype = TS_FP32;
  const ts_flag flags[] = {
      TS_FLAG_STRING("--checkpoint", NULL, &ck_dir, "DIR",
                     "a tessera checkpoint (a step folder, or a folder of them: the newest)", NULL),
      TS_FLAG_STRING("--hf", NULL, &hf_dir, "DIR", "a Hugging Face LLaMA folder", NULL),
      TS_FLAG_STRING("--prompt", "-p", &prompt, "TEXT", "the text to continue", NULL),
      TS_FLAG_STRING("--prompt-ids", NULL, &prompt_ids, "IDS",
                     "token ids to continue (\"1,2,3\"); prints ids, needs no tokenizer", NULL),
      TS_FLAG_STRING("--fill-mask", NULL, &fill, "TEXT",
                     "BERT: the --top-k (default 5) likeliest tokens at each [MASK] of TEXT", NULL),
      TS_FLAG_SIZE("--max-new-tokens", "-n", &max_new, 1, "N",
                   "tokens to generate at most (default 64; fewer at the end-of-sequence id)",
                   NULL),
      TS_FLAG_FLOAT("--temperature", NULL, &temperature, "T",
                    "0: greedy (default); > 0: sample from softmax(logits / T)", NULL),
      TS_FLAG_SIZE("--top-k", NULL, &top_k, 0, "K", "sample among the K likeliest (default 0: all)",
                   NULL),
      TS_FLAG_FLOAT("--top-p", NULL, &top_p, "P",
                    "sample among the likeliest whose probability reaches P (default 1: all)",
                    NULL),
      TS_FLAG_SIZE("--seed", NULL, &seed, 0, "S", "the sampler's seed (default 0)", NULL),
      TS_FLAG_STRING("--tokenizer", NULL, &tok_dir, "DIR",
                     "a folder with the model's tokenizer.model (prepare's output or a Hugging "
                     "Face folder)",
                     NULL),
      TS_FLAG_CUSTOM("--device", NULL, &device, ts_tool_parse_device, "cpu|cuda|auto",
                     "where to run (default cpu)", NULL),
      TS_FLAG_CUSTOM("--dtype", NULL, &dtype, ts_tool_parse_dtype, "fp32|bf16|fp16",
                     "weights, activations and cache (default fp32)", NULL),
      TS_FLAG_SWITCH("--no-cache", NULL, &no_cache,
                     "recompute the whole prefix for each token (a check of the cache; slower)"),
      TS_FLAG_SWITCH("--ignore-eos", NULL, &ignore_eos,
                     "go on past the tokenizer's end-of-sequence id"),
  };
  int r = ts_flags_parse("generate", flags, sizeof flags / sizeof *flags, argc, argv, USAGE);
  if (r != TS_FLAGS_OK) return r == TS_FLAGS_HELP ? 0 : 2;
  if (!ck_dir == !hf_dir)
    return ts_flags_error("generate", "give one of --checkpoint DIR and --hf DIR " TS_FLAGS_HINT);
  if ((prompt != NULL) + (prompt_ids != NULL) + (fill != NULL) != 1)
    return ts_flags_error("generate",
                          "give one of --prompt TEXT, --prompt-ids IDS and --fill-mask TEXT "
                          TS_FLAGS_HINT);
  if (!(temperature >= 0.0f))
    return ts_flags_error("generate", "--temperature %g: expected >= 0", (double)temperature);
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return ts_flags_error("generate", "--top-p %g: expected in (0, 1]", (double)top_p);
  ts_device dev;
  int index;
  if (ts_tool_resolve_device(device, 1, &dev, &index) != TS_OK)
    return fprintf(stderr, "tessera generate: %s\n", ts_flags_last_error()), 2;

  char dir[4096], config[4200], data[4096];
  ts_model model;
  memset(&model, 0, sizeof model);
  source src = {NULL, TS_CHECKPOINT_MASTER, NULL};
  ts_text_tokenizer *tok = NULL;
  int32_t *ids = NULL;
  size_t n_ids = 0;
  ts_status st = TS_OK;
  if (hf_dir) {
    snprintf(dir, sizeof dir, "%s", hf_dir);
  } else if (!ts_checkpoint_latest(ck_dir, dir, sizeof dir, NULL)) {
    fprintf(stderr,
            "tessera generate: --checkpoint %s: no complete checkpoint there (a folder with "
            TS_CHECKPOINT_INDEX ", or step-N folders holding one)\n",
            ck_dir);
    return 1;
  }
  snprintf(config, sizeof config, "%s/config.json", dir);
  st = ts_model_load(config, &model);
  if (st == TS_OK && hf_dir) {
    st = ts_hf_folder_open(&src.hf, dir);
    if (st == TS_OK) st = ts_hf_folder_check(src.hf, &model);
  } else if (st == TS_OK) {
    st = ts_checkpoint_open(&src.ck, dir, &model);
    if (st == TS_OK) st = ts_checkpoint_verify(src.ck, 0, 1);
    if (st == TS_OK) {
      ts_checkpoint_info info;
      ts_checkpoint_get_info(src.ck, &info);
      if (!strcmp(info.dtype, "fp32")) src.kind = TS_CHECKPOINT_PARAM;
    }
  }
  if (st == TS_OK && (model.objective == TS_OBJECTIVE_MASKED_LM) != (fill != NULL))
    st = ts_set_error(TS_ERR_INVALID_ARGUMENT,
                      fill ? "--fill-mask needs a masked LM (BERT): %s is a causal LM, expected "
                             "--prompt"
                           : "%s is a masked LM (BERT): it fills masks, expected --fill-mask "
                             "\"... [MASK] ...\"",
                      config);
  if (st == TS_OK && prompt_ids) st = parse_ids(prompt_ids, &ids, &n_ids);
  if (st == TS_OK && (prompt || fill)) {
    const char *from = tok_dir;
    if (!from && hf_dir) from = hf_dir;
    if (!from && src.ck && data_dir_of(src.ck, data, sizeof data) && is_dir(data)) from = data;
    char model_file[4200], json_file[4200];
    snprintf(model_file, sizeof model_file, "%s/tokenizer.model", from ? from : "");
    snprintf(json_file, sizeof json_file, "%s/tokenizer.json", from ? from : "");
    struct stat sb;
    if (!from)
      st = ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s needs the model's tokenizer: the checkpoint's training data "
                        "folder is gone; give --tokenizer DIR",
                        fill ? "--fill-mask" : "--prompt");
    else if (from == data && stat(model_file, &sb) != 0 && stat(json_file, &sb) != 0)
      st = ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s needs the model's tokenizer: %s (the checkpoint's training "
                        "data) has no tokenizer.model nor tokenizer.json; give --tokenizer DIR%s",
                        fill ? "--fill-mask" : "--prompt", data, fill ? "" : " (or --prompt-ids)");
    else
      st = ts_text_tokenizer_open(&tok, from);
    if (st == TS_OK && ts_text_tokenizer_vocab(tok) > model.vocab_size)
      st = ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: the tokenizer has %zu pieces, the model %zu: expected the model's "
                        "own tokenizer",
                        from, ts_text_tokenizer_vocab(tok), model.vocab_size);
  }
  if (st == TS_OK && fill)
    st = fill_mask(&model, read_weights, &src, tok, fill, top_k ? top_k : 5, dev, dtype, stdout);
  else if (st == TS_OK) {
    ts_tool_sample_opts o = {
        .tokenizer = tok,
        .prompt = prompt,
        .prompt_ids = ids,
        .n_prompt_ids = n_ids,
        .max_new = max_new,
        .temperature = temperature,
        .top_k = top_k,
        .top_p = top_p,
        .seed = seed,
        .device = dev,
        .dtype = dtype,
        .recompute = no_cache,
        .ignore_eos = ignore_eos,
        .stats = 1,
    };
    st = ts_tool_sample(&model, read_weights, &src, &o, stdout);
  }
  free(ids);
  ts_text_tokenizer_free(tok);
  ts_hf_folder_close(src.hf);
  ts_checkpoint_close(src.ck);
  ts_model_free(&model);
  if (st != TS_OK) {
    fprintf(stderr, "tessera generate: %s\n", ts_flags_last_error());
    return 1;
  }
  return 0;
}
