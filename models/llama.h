/*
 * llama.h — a LLaMA-style decoder as an ordered list of units
 * (DESIGN.md "The unit"): unit 0 is the token embedding, units 1..L the
 * transformer blocks (RMSNorm → GQA attention with RoPE → residual → RMSNorm
 * → SwiGLU → residual), unit L+1 the final RMSNorm and the LM head.
 *
 * A unit's parameters are one flat buffer: its tensors back to back in
 * layout order (Hugging Face names and shapes, row-major). models/ knows
 * nothing of sharding; the engine hands each call the unit's full flat
 * parameters and gradients. The math matches transformers'
 * LlamaForCausalLM (checked by tests/hf_parity).
 *
 * Memory: units allocate nothing. Forward writes the unit's output and its
 * saved activations into caller buffers of ts_llama_saved_bytes(); both
 * passes take scratch from ctx->workspace (ts_llama_workspace_bytes()).
 * With tie_word_embeddings the head reads the embedding unit's weight and
 * accumulates into its gradient (the caller passes both).
 */
#ifndef TS_MODELS_LLAMA_H
#define TS_MODELS_LLAMA_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "models/config.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_UNIT_MAX_TENSORS 9

typedef enum ts_unit_kind {
  TS_UNIT_EMBEDDING = 0, /* model.embed_tokens */
  TS_UNIT_BLOCK = 1,     /* model.layers.<i> */
  TS_UNIT_HEAD = 2,      /* model.norm (+ lm_head when untied) */
} ts_unit_kind;

typedef struct ts_tensor_spec {
  char name[80];   /* Hugging Face name, e.g. "model.layers.0.mlp.up_proj.weight" */
  int ndim;        /* 1 or 2 */
  size_t shape[2]; /* row-major shape; shape[1] = 1 when ndim == 1 */
  size_t numel;    /* shape[0] * shape[1] */
  size_t offset;   /* elements from the start of the unit's flat buffer */
  int decay;       /* 1 if AdamW weight decay applies (matrices), 0 (norms) */
} ts_tensor_spec;

typedef struct ts_unit {
  ts_unit_kind kind;
  int layer;                                /* block index, -1 otherwise */
  int n_tensors;
  ts_tensor_spec tensors[TS_UNIT_MAX_TENSORS];
  size_t numel;                             /* sum of tensor numels (unpadded) */
} ts_unit;

typedef struct ts_llama {
  ts_llama_config cfg;
  int n_units;      /* L + 2 */
  ts_unit *units;   /* owned; [0] embedding, [1..L] blocks, [L+1] head */
} ts_llama;

/* Builds the unit list of cfg (copied). TS_ERR_FORMAT when cfg breaks the
 * invariants of ts_llama_config_validate, TS_ERR_OUT_OF_MEMORY on allocation
 * failure. */
ts_status ts_llama_init(ts_llama *m, const ts_llama_config *cfg);
/* Frees the unit list; m may then be initialised again. */
void ts_llama_free(ts_llama *m);

/* Fills a unit's flat buffer (numel elements of dt) with its initial values:
 * matrices ~ N(0, 0.02^2) (Hugging Face initializer_range), norm weights 1.
 * Each tensor's stream is seeded from (seed, tensor name) alone, so every
 * world size, stage and unit order starts from identical weights. */
ts_status ts_llama_init_unit(const ts_llama *m, int u, void *params, ts_dtype dt, uint64_t seed);

/* Both size queries take u in [0, n_units) (asserted). */

/* Bytes a unit keeps from forward for backward per micro-batch of (B, T),
 * besides its input (which the engine keeps): the block's normalised
 * inputs, rotated q/k, v, attention probabilities, attention output,
 * mid-residual, MLP gate/up/hidden, and two fp32 rstd vectors; the head's
 * rstd, normalised input and logits (B, T, V); 0 for the embedding. */
size_t ts_llama_saved_bytes(const ts_llama *m, int u, size_t B, size_t T, ts_dtype dt);

/* Bytes of ctx->workspace a unit's forward or backward needs (the larger). */
size_t ts_llama_workspace_bytes(const ts_llama *m, int u, size_t B, size_t T, ts_dtype dt,
                                ts_device dev);

/* Arguments of one unit call. Pointers not used by a unit kind are NULL.
 * B, T: micro-batch and sequence length (T <= max_position_embeddings). */
typedef struct ts_unit_args {
  size_t B, T;
  ts_dtype dt;                /* storage dtype of params, activations, grads */
  const int32_t *tokens;      /* (B, T) embedding input */
  const int32_t *targets;     /* (B, T) head targets, -100 = ignore */
  const void *x;              /* (B, T, C) block/head input (kept by the engine) */
  void *y;                    /* (B, T, C) embedding/block output */
  void *saved;                /* ts_llama_saved_bytes() bytes */
  const void *tied_weight;    /* (V, C) embed_tokens when tied, for the head */
  void *tied_grad;            /* (V, C) its gradient (+=), for the head */
  const void *dy;             /* (B, T, C) gradient of y (embedding, block) */
  void *dx;                   /* (B, T, C) gradient of x, written (=) */
  float dloss;                /* head backward: d(loss)/d(row loss), e.g. 1/count */
  double loss_sum;            /* head forward output: sum of row losses */
  size_t loss_count;          /* head forward output: rows with a target */
} ts_unit_args;

/* Forward of unit u: embedding writes y; a block writes y and saved; the head
 * writes saved (incl. logits) and loss_sum/loss_count.
 * Errors: TS_ERR_INVALID_ARGUMENT (a token or target out of range, T too
 * long — messages name the value), TS_ERR_OUT_OF_MEMORY (workspace small). */
ts_status ts_llama_forward(const ts_llama *m, int u, const ts_kctx *ctx, const void *params,
                           ts_unit_args *a);

/* Backward of unit u after its forward with the same args: accumulates
 * (+=) into grads (the unit's flat gradient) and tied_grad, writes dx (=)
 * for blocks and the head. Overwrites the head's saved logits. */
ts_status ts_llama_backward(const ts_llama *m, int u, const ts_kctx *ctx, const void *params,
                            void *grads, ts_unit_args *a);

/* The head's logits (B, T, V) of dt inside its saved buffer, valid after
 * forward and before backward. */
void *ts_llama_head_logits(const ts_llama *m, void *saved, size_t B, size_t T, ts_dtype dt);

/* Model FLOPs per token for one forward+backward, PaLM (Chowdhery et al.
 * 2022, App. B): 6 * (matmul parameters, LM head included, embedding
 * lookup excluded) + 12 * L * C * T. */
double ts_llama_flops_per_token(const ts_llama_config *c, size_t T);

#ifdef __cplusplus
}
#endif

#endif /* TS_MODELS_LLAMA_H */
