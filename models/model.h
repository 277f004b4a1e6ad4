/*
 * model.h — the one interface the engine sees (DESIGN.md "The unit and the
 * model interface"): a model is an ordered list of units, each with an ops
 * table; a model family (LLaMA, BERT) is files behind it, and the
 * engine, the trainer, estimate and compare include only this header.
 *
 * A unit is the granule of sharding, gathering, recompute and pipeline
 * placement (FSDP's wrapped module, DeepSpeed's layer). Its parameters are
 * one flat buffer: its tensors back to back in layout order (Hugging Face
 * names and shapes, row-major), so export and import are lookups. The first
 * unit reads the token batch, every later one reads the previous unit's
 * output (B, T, C), and the last one writes the loss.
 *
 * Memory: units allocate nothing. Forward writes the unit's output and its
 * saved activations into caller buffers of the declared saved bytes; both
 * passes take scratch only from ctx->workspace (the declared workspace
 * bytes for ctx->device). Every pointer in ts_unit_args lives on
 * ctx->device but host_targets (host memory). Backward accumulates (+=)
 * into parameter gradients and writes (=) the input's gradient.
 *
 * Initialisation is shared by every family (ts_model_init_unit): each
 * tensor is filled from a stream seeded by (seed, tensor name) alone, so
 * every world size, ZeRO stage, pipeline layout and unit order starts from
 * identical weights.
 */
#ifndef TS_MODELS_MODEL_H
#define TS_MODELS_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a unit does in the model's chain. */
typedef enum ts_unit_role {
  TS_UNIT_EMBEDDING = 0, /* first: tokens (B, T) -> activations (B, T, C) */
  TS_UNIT_BLOCK = 1,     /* (B, T, C) -> (B, T, C); may be recomputed */
  TS_UNIT_HEAD = 2,      /* last: (B, T, C) and targets -> loss (and logits) */
} ts_unit_role;

/* How ts_model_init_unit fills a tensor. */
typedef enum ts_init_kind {
  TS_INIT_NORMAL = 0, /* N(0, init_std^2), Box-Muller on the tensor's stream */
  TS_INIT_ONES = 1,   /* norm weights */
  TS_INIT_ZEROS = 2,  /* biases */
} ts_init_kind;

typedef struct ts_tensor_spec {
  char name[96];     /* Hugging Face name, e.g. "model.layers.0.mlp.up_proj.weight" */
  int ndim;          /* 1 or 2 */
  size_t shape[2];   /* row-major shape; shape[1] = 1 when ndim == 1 */
  size_t numel;      /* shape[0] * shape[1] */
  size_t offset;     /* elements from the start of the unit's flat buffer */
  int decay;         /* 1 if AdamW weight decay applies (matrices), 0 (norms, biases) */
  ts_init_kind init; /* how it starts */
  double init_std;   /* TS_INIT_NORMAL: standard deviation (e.g. initializer_range) */
} ts_tensor_spec;

typedef struct ts_model ts_model;
typedef struct ts_unit ts_unit;

/* Largest parameter count a config of any family may describe (2^48 ≈
 * 2.8e14): far above any model trained, far below where byte counts wrap
 * size_t in unit layouts and plans. */
#define TS_MODEL_MAX_PARAMS 281474976710656.0
/* The most transformer blocks a config may declare (2^16; the largest
 * published models have ~120): the model's unit table is sized by them
 * before any parameter is, so the parameter bound alone does not hold
 * them (a config of 10^8 one-wide layers asked for 436 GB of units). */
#define TS_MODEL_MAX_LAYERS 65536

/* What a model's targets are, so the trainer builds the right batches. */
typedef enum ts_objective {
  TS_OBJECTIVE_CAUSAL_LM = 0, /* targets are the inputs shifted by one (LLaMA) */
  TS_OBJECTIVE_MASKED_LM = 1, /* targets are the original ids at masked positions, -100
                                 elsewhere; inputs [CLS] ... [SEP] (BERT; Devlin et al.
                                 2019 §3.1) */
} ts_objective;

/* Arguments of one unit call. Pointers a unit does not use are NULL; every
 * pointer but host_targets is on the ctx's device. B, T: micro-batch and
 * sequence length. */
typedef struct ts_unit_args {
  size_t B, T;
  ts_dtype dt;             /* storage dtype of params, activations, grads */
  const int32_t *tokens;   /* (B, T) the micro-batch's input ids, given to every unit (the
                              first embeds them; an encoder's blocks mask padded keys) */
  const int32_t *targets;  /* (B, T) last unit's targets, -100 = ignore */
  const int32_t *host_targets; /* (B, T) the same targets in host memory, unchanged from a
                              forward to its backward, or NULL; read by a last unit that
                              picks its rows on the host (BERT's head in training: the
                              masked rows only), which without them runs every row */
  const void *x;           /* (B, T, C) input of every unit but the first (kept by the engine) */
  void *y;                 /* (B, T, C) output of every unit but the last */
  void *saved;             /* the unit's saved bytes */
  const void *tied_weight; /* the tensor this unit borrows (ts_unit.tied_unit), full */
  void *tied_grad;         /* its gradient (+=) */
  const void *dy;          /* (B, T, C) gradient of y */
  void *dx;                /* (B, T, C) gradient of x, written (=) */
  float dloss;             /* last unit's backward (and fused forward): d(loss)/d(row loss),
                              e.g. 1/count */
  int fused_loss_grad;     /* last unit in training, forward and backward alike: forward
                              also turns its logits into their gradient (dloss-scaled, one
                              pass: ts_k_cross_entropy_fused) and backward starts from it */
  double *loss;            /* last unit's forward: (2) fp64 = (sum of row losses, rows
                              with a target), written (=) */
} ts_unit_args;

/* Arguments of one decoding call (ts_unit_decode): T new positions
 * pos0 .. pos0 + T - 1 of one sequence (B = 1), every pointer on the
 * ctx's device. */
typedef struct ts_decode_args {
  size_t T;                /* new positions this call (the prompt, then 1 per token) */
  size_t pos0;             /* positions already in the cache */
  size_t max_T;            /* positions the cache holds (its ts_unit_cache_bytes T) */
  ts_dtype dt;             /* storage dtype of params, activations, cache */
  const int32_t *tokens;   /* (T) the new ids (the first unit embeds them) */
  const void *x;           /* (T, C) input of every unit but the first */
  void *y;                 /* (T, C) output of every unit but the last */
  void *cache;             /* the unit's key/value cache, ts_unit_cache_bytes(max_T) bytes: its
                              rows 0 .. pos0 - 1 read, rows pos0 .. pos0 + T - 1 written */
  void *scratch;           /* ts_unit_saved_bytes(m, u, 1, T) bytes, overwritten */
  const void *tied_weight; /* the tensor this unit borrows (ts_unit.tied_unit), full */
  void *logits;            /* last unit: (V) of dt, the logits of position pos0 + T - 1 */
} ts_decode_args;

/* A unit kind's operations. Contracts in the comment of each wrapper below. */
typedef struct ts_unit_ops {
  const char *kind; /* "embedding", "block", "head", ... */
  /* ts_unit_saved_bytes */
  size_t (*saved_bytes)(const ts_model *m, const ts_unit *u, size_t B, size_t T, ts_dtype dt,
                        ts_device dev);
  /* ts_unit_workspace_bytes */
  size_t (*workspace_bytes)(const ts_model *m, const ts_unit *u, size_t B, size_t T, ts_dtype dt,
                            ts_device dev);
  /* ts_unit_forward (arguments checked) */
  ts_status (*forward)(const ts_model *m, const ts_unit *u, const ts_kctx *ctx,
                       const void *params, ts_unit_args *a);
  /* ts_unit_backward (arguments checked) */
  ts_status (*backward)(const ts_model *m, const ts_unit *u, const ts_kctx *ctx,
                        const void *params, void *grads, ts_unit_args *a);
  /* last unit: its logits (B, T, V) in its saved buffer; NULL otherwise */
  void *(*logits)(const ts_model *m, const ts_unit *u, void *saved, size_t B, size_t T,
                  ts_dtype dt);
  /* ts_unit_cache_bytes; NULL: the family cannot decode */
  size_t (*cache_bytes)(const ts_model *m, const ts_unit *u, size_t T, ts_dtype dt);
  /* ts_unit_decode (arguments checked); NULL: the family cannot decode */
  ts_status (*decode)(const ts_model *m, const ts_unit *u, const ts_kctx *ctx,
                      const void *params, ts_decode_args *a);
  /* ts_unit_splits_backward: 1 when backward reaches its gradients (grads,
   * tied_grad) only through the kernels' weight-gradient ops and leaves
   * their other operands unchanged until it returns, so that a ctx->wgrad
   * store can defer them (kernels.h); 0 otherwise */
  int split_backward;
} ts_unit_ops;

struct ts_unit {
  const ts_unit_ops *ops; /* the kind's operations (static, owned by the family) */
  ts_unit_role role;
  int layer;              /* block index among the blocks, -1 for other roles */
  int tied_unit;          /* a unit whose tensor this one also uses (tied embeddings), -1 */
  int tied_tensor;        /* that tensor's index in tied_unit, -1 */
  int n_tensors;          /* tensors in the flat buffer, layout order */
  ts_tensor_spec tensors[TS_UNIT_MAX_TENSORS]; /* [n_tensors] */
  size_t numel;           /* sum of tensor numels (unpadded) */
};

/* One hyper-parameter of a family's own config (m->impl): its config.json
 * name, where it lies in the family's struct, and its C type. */
typedef enum ts_config_type {
  TS_CONFIG_SIZE,   /* size_t */
  TS_CONFIG_INT,    /* int (enums and booleans too) */
  TS_CONFIG_INT32,  /* int32_t */
  TS_CONFIG_FLOAT,  /* float */
  TS_CONFIG_DOUBLE, /* double */
} ts_config_type;
typedef struct ts_config_field {
  const char *name;
  size_t offset; /* bytes from the start of m->impl */
  ts_config_type type;
} ts_config_field;

/* A family: how a config.json of its model_type becomes units. */
typedef struct ts_model_family {
  const char *model_type;   /* config.json "model_type", e.g. "llama" */
  const char *architecture; /* the transformers class it computes, "LlamaForCausalLM" */
  /* Fills m (zeroed, name and source set) from the parsed config.json
   * object `root` (a cJSON *): checks every field (TS_ERR_FORMAT naming the
   * file, the field and the expected value), sets the ts_model fields and
   * units, and keeps its own config in m->impl. */
  ts_status (*init)(ts_model *m, const void *root);
  void (*free)(ts_model *m);  /* frees m->impl */
  /* 1 if a Hugging Face checkpoint of this family may carry tensor `name`
   * that m does not hold (a buffer, a tied copy, another task's head), as
   * transformers' from_pretrained skips it; NULL: none may. */
  int (*ignorable)(const ts_model *m, const char *name);
  /* The name under which a Hugging Face folder of a tied model may also
   * hold the head's weight, a copy of the tensor the head borrows
   * ("lm_head.weight"); NULL: none. */
  const char *tied_copy;
  /* A second copy such a folder may hold, of one of the head's own tensors
   * ("cls.predictions.decoder.bias" of "cls.predictions.bias"); transformers
   * ties it too only when equal. NULL: none. */
  const char *tied_copy2;
  const char *tied_copy2_of;
  /* Every hyper-parameter of m->impl that its config.json sets (n_fields),
   * for ts_model_config_diff. */
  const ts_config_field *fields;
  int n_fields;
} ts_model_family;

struct ts_model {
  const ts_model_family *family;
  char name[64];      /* preset or file stem, for logs */
  char source[256];   /* the config.json it came from, for errors */
  size_t hidden_size; /* C: width of the activations between units */
  size_t vocab_size;  /* V */
  size_t max_seq;     /* largest T (max_position_embeddings) */
  size_t num_params;  /* Ψ, unpadded (tied tensors counted once) */
  ts_objective objective; /* what its targets are */
  int32_t pad_token_id;   /* masked LM: the id whose keys attention masks; -1 none */
  int32_t sep_token_id;   /* masked LM: the id that ends a segment (token types); -1 none */
  ts_fp8_scaling fp8;     /* the blocks' linear layers' products in fp8 (kernels.h "fp8
                             linear layer"); TS_FP8_OFF (0) as loaded. Set before the model's
                             workspace is sized (the engine's create): it changes that size.
                             LLaMA only (ts_model_set_fp8) */
  int n_units;
  ts_unit *units;     /* owned; [0] the first unit ... [n_units - 1] the last */
  void *impl;         /* the family's own config (owned by the family) */
};

/* ---- loading ---------------------------------------------------------------- */

/* Resolves --model: a path to a file is used as is; a folder (a Hugging
 * Face model folder, a tessera checkpoint) means its config.json; a bare preset name
 * ("llama-tiny") maps to models/configs/<name>.json under $TESSERA_HOME (or
 * the current directory). Writes the path to out (size cap). Returns
 * TS_ERR_INVALID_ARGUMENT naming the preset and the presets folder when
 * neither exists, TS_ERR_IO for a missing path. */
ts_status ts_model_resolve(const char *model, char *out, size_t cap);

/* Builds the model of a Hugging Face config.json's text: its "model_type"
 * picks the family (absent: the family whose architecture "architectures"
 * names, else "llama", the first family), which checks every
 * field it reads. `source` names the file in messages. TS_ERR_FORMAT (not
 * a JSON object, a model_type no family computes — the message lists those
 * that exist — or the family's own checks), TS_ERR_OUT_OF_MEMORY. On
 * failure *out holds nothing to free. */
ts_status ts_model_parse(const char *json, const char *source, ts_model *out);

/* Reads and parses a config.json file (TS_ERR_IO if unreadable). */
ts_status ts_model_load(const char *path, ts_model *out);

/* Trains m's blocks' linear layers with fp8 products of the given scaling
 * (kernels.h "fp8 linear layer"; TS_FP8_OFF: none), before anything sizes
 * its workspace. TS_ERR_INVALID_ARGUMENT, m unchanged: a family without an
 * fp8 path (LLaMA only), a compute dtype other than bf16, or a hidden
 * width that is not a multiple of 16 (the fp8 products' layout rule), each
 * in one line naming `fp8`. The other widths and B x T meet the same rule
 * in the kernels' checks, which the memory plan runs before any step. */
ts_status ts_model_set_fp8(ts_model *m, ts_fp8_scaling scaling, ts_dtype dt);

/* Frees what the model owns; m may be loaded again. A zeroed m is fine. */
void ts_model_free(ts_model *m);

/* The first hyper-parameter where a and b differ: the family's
 * "model_type", else a field of its config (ts_model_family.fields, in
 * their order), its name into field and the two values, printed with %g or
 * as integers, into va and vb (32 bytes each). Returns 1 if they differ, 0
 * if every hyper-parameter is equal (the same math; names, sources and
 * fields tessera does not read, such as "architectures" or "torch_dtype",
 * are not compared). Host; no allocation. */
int ts_model_config_diff(const ts_model *a, const ts_model *b, const char **field, char va[32],
                         char vb[32]);

/* What messages call the model: its file, or its name if built by hand. */
const char *ts_model_origin(const ts_model *m);

/* The FLOP model, the one every count uses (metrics' GFLOP/s and MFU,
 * the pipeline split's unit costs, the simulator's compute): PaLM's
 * (Chowdhery et al. 2022, App. B), per unit. Unit u's forward costs, per
 * token at sequence length T, 2 FLOPs per parameter of each matrix it
 * multiplies (its 2-D tensors, a tied head's borrowed one included; the
 * embedding's table is a gather: none) plus, for a block, 4 T C for the
 * attention scores and values; a backward twice its forward. */
double ts_unit_forward_flops(const ts_model *m, int u, size_t T);

/* Model FLOPs per token of one forward+backward at sequence length T: 3
 * times the units' forward FLOPs summed (= 6 x matmul parameters + 12 L C
 * T, PaLM's count). */
double ts_model_flops_per_token(const ts_model *m, size_t T);

/* 1 if `name`, not a tensor of m, may stand in a Hugging Face checkpoint
 * of m's family and be skipped (ts_model_family.ignorable). */
int ts_model_ignorable(const ts_model *m, const char *name);

/* Unit u and tensor i of the tensor named `name`; TS_ERR_INVALID_ARGUMENT
 * ("tensor X: not a parameter of model M") when there is none. */
ts_status ts_model_find_tensor(const ts_model *m, const char *name, int *u, int *i);

/* ---- units -------------------------------------------------------------------- */

/* Fills unit u's flat buffer, (numel) fp32 on ctx->device, with its initial
 * values (ts_tensor_spec.init). Each tensor's stream is seeded from (seed,
 * tensor name): splitmix64 from seed ^ FNV-1a(name) (base/rng.h), one
 * Box-Muller normal per pair of 53-bit uniforms. Values go through a host
 * buffer and ts_k_from_host. u in [0, n_units) (asserted). */
ts_status ts_model_init_unit(const ts_model *m, int u, const ts_kctx *ctx, float *params,
                             uint64_t seed);

/* Bytes unit u keeps from forward for backward per micro-batch of (B, T)
 * on device dev (attention keeps different state per device: kernels.h),
 * besides its input (which the engine keeps). u asserted in range. */
size_t ts_unit_saved_bytes(const ts_model *m, int u, size_t B, size_t T, ts_dtype dt,
                           ts_device dev);

/* Bytes of ctx->workspace unit u's forward or backward needs on device dev
 * (the larger). */
size_t ts_unit_workspace_bytes(const ts_model *m, int u, size_t B, size_t T, ts_dtype dt,
                               ts_device dev);

/* Forward of unit u: the first writes y; a block writes y and saved; the
 * last writes saved (logits included) and *loss. Errors:
 * TS_ERR_INVALID_ARGUMENT (a token or target out of range, T too long:
 * messages name the value), TS_ERR_OUT_OF_MEMORY (workspace small), the
 * kernels' errors. */
ts_status ts_unit_forward(const ts_model *m, int u, const ts_kctx *ctx, const void *params,
                          ts_unit_args *a);

/* Backward of unit u after its forward with the same args: accumulates
 * (+=) into grads (the unit's flat gradient) and tied_grad, writes dx (=)
 * for every unit but the first. May overwrite the last unit's saved logits.
 * With ctx->wgrad set and ts_unit_splits_backward, it is B alone (Qi et
 * al. 2024): dx written, grads and tied_grad untouched, their updates
 * recorded in the store for ts_k_wgrad_run (W), which then leaves them as
 * the undivided backward would, bit for bit; what the records read from
 * the workspace, dx and dy is copied into the store's memory, and the
 * operands they keep as pointers (the saved bytes, x, tokens) must stay
 * as they are until then. */
ts_status ts_unit_backward(const ts_model *m, int u, const ts_kctx *ctx, const void *params,
                           void *grads, ts_unit_args *a);

/* 1 if unit u's backward can be split into B and a deferred W
 * (ts_unit_ops.split_backward): every LLaMA unit, BERT's blocks (its
 * embeddings keep the [PAD] row's gradient by copying it, and its head
 * reuses saved buffers after their weight-gradient ops). */
int ts_unit_splits_backward(const ts_model *m, int u);

/* The last unit's logits (B, T, V) of dt inside its saved buffer, valid
 * after forward and before backward; NULL for a unit without logits. */
void *ts_unit_logits(const ts_model *m, int u, void *saved, size_t B, size_t T, ts_dtype dt);

/* ---- decoding (autoregressive generation with a key/value cache) -------------- */

/* 1 if every unit of m can decode (a causal LM family: LLaMA), else 0. */
int ts_model_can_decode(const ts_model *m);

/* Bytes of unit u's key/value cache for one sequence of up to T positions
 * on any device: a block's keys then values, (T, NKV, HS) each of dt after
 * RoPE; 0 for units that keep none. u asserted in range, m can decode. */
size_t ts_unit_cache_bytes(const ts_model *m, int u, size_t T, ts_dtype dt);

/* Unit u's forward over the new positions a->pos0 .. a->pos0 + a->T - 1 of
 * one sequence, the earlier ones read from its cache: the first unit embeds
 * a->tokens into y, a block writes its new keys and values into its cache
 * and y (T, C), the last unit writes the logits of the newest position
 * into a->logits (V). The same math as ts_unit_forward of the whole
 * sequence row by row, attention through ts_k_attention_cached. Workspace:
 * ts_unit_workspace_bytes(m, u, 1, a->T, dt, ctx->device). Errors:
 * TS_ERR_INVALID_ARGUMENT (T == 0, pos0 + T past max_T or the model's
 * max_position_embeddings, a token out of range), TS_ERR_UNSUPPORTED (a
 * family that cannot decode), the kernels'. */
ts_status ts_unit_decode(const ts_model *m, int u, const ts_kctx *ctx, const void *params,
                         ts_decode_args *a);

#ifdef __cplusplus
}
#endif

#endif /* TS_MODELS_MODEL_H */
