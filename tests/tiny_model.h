// tiny_model.h — what the multi-rank engine tests share: a tiny LLaMA
// config (C 32, 4 heads of which 2 key-value, vocabulary 96, at most 16
// positions), a tiny BERT of the same width with masked-LM batches, the
// world communicator of mpirun, and the simulator's test cluster and
// compute.
#ifndef TS_TESTS_TINY_MODEL_H
#define TS_TESTS_TINY_MODEL_H

#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "comm/comm.h"
#include "engine/simulate.h"
#include "models/llama.h"

namespace tiny {

constexpr size_t kV = 96;  // vocabulary

// `layers` blocks; tied: the head borrows the embedding (tie_word_embeddings).
inline ts_llama_config Config(const char *name, bool tied, size_t layers) {
  ts_llama_config c{};
  snprintf(c.name, sizeof c.name, "%s", name);
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = kV;
  c.max_position_embeddings = 16;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.f;
  c.tie_word_embeddings = tied;
  return c;
}

// A tiny BERT (C 32, 4 heads, vocabulary 96, 16 positions, [PAD] 0,
// [SEP] 3); the caller frees it (ts_model_free).
inline ts_model BertModel(bool tied, size_t layers) {
  char json[768];
  snprintf(json, sizeof json,
           R"({"model_type": "bert", "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": %zu, "num_attention_heads": 4, "vocab_size": %zu,
           "max_position_embeddings": 16, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
           "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
           "attention_probs_dropout_prob": 0.0, "pad_token_id": 0, "sep_token_id": 3,
           "tie_word_embeddings": %s})",
           layers, kV, tied ? "true" : "false");
  ts_model m{};
  EXPECT_EQ(ts_model_parse(json, "tiny-bert", &m), TS_OK) << ts_last_error();
  return m;
}

// `rows` masked-LM sequences of T ids drawn from g into in and tgt:
// [CLS] text [SEP] text [SEP], the last two positions of odd rows [PAD],
// about a quarter of the text replaced by [MASK] (4) with the original as
// target, -100 elsewhere.
inline void MaskedLmBatch(std::mt19937 &g, int32_t *in, int32_t *tgt, size_t rows, size_t T) {
  for (size_t q = 0; q < rows; q++)
    for (size_t t = 0; t < T; t++) {
      int32_t &id = in[q * T + t], &target = tgt[q * T + t];
      target = -100;
      if (t == 0) {
        id = 2;  // [CLS]
      } else if (t == T / 2 || t == T - 3) {
        id = 3;  // [SEP]: two segments
      } else if (q % 2 == 1 && t >= T - 2) {
        id = 0;  // [PAD]
      } else {
        id = (int32_t)(5 + g() % (kV - 5));
        if (g() % 4 == 0) {
          target = id;
          id = 4;  // [MASK]
        }
      }
    }
}

// Micro-batch mb of step `step` for data-parallel rank dp_rank, (B, T)
// ids below 64 (a learnable distribution) with every seventh target
// ignored (-100): a pure function of the three (ts_engine_fill_fn: pass
// Fill with a Feed).
struct Feed {
  size_t step;
  int dp_rank;
  size_t B, T;
};

inline ts_status Fill(void *user, int mb, int32_t *in, int32_t *tgt) {
  const Feed *f = static_cast<const Feed *>(user);
  std::mt19937 g(7919u * (unsigned)f->step + 131u * (unsigned)f->dp_rank + (unsigned)mb);
  for (size_t i = 0; i < f->B * f->T; i++) {
    in[i] = (int32_t)(g() % 64);
    tgt[i] = i % 7 == 3 ? -100 : (int32_t)(g() % 64);
  }
  return TS_OK;
}

// The world of mpirun, shared by every test of this process.
inline ts_comm *World() {
  static ts_comm *world = [] {
    ts_comm *c = nullptr;
    EXPECT_EQ(ts_comm_world(&c), TS_OK) << ts_last_error();
    return c;
  }();
  return world;
}

// One node of every rank (64 per node), links of `bandwidth` bytes/s and
// `latency` s, tessera's direct exchanges (engine/simulate.h).
inline ts_sim_cluster SimCluster(double bandwidth, double latency) {
  ts_sim_cluster cl{};
  cl.ranks_per_node = 64;
  cl.intra = {bandwidth, latency};
  cl.inter = {bandwidth, latency};
  cl.algorithm = TS_SIM_DIRECT;
  return cl;
}

// The FLOP model at 1 TFLOP/s, AdamW at 100 GB/s, a device per rank.
inline ts_sim_compute SimCompute() {
  ts_sim_compute cp{};
  cp.peak_flops = 1e12;
  cp.efficiency = 1.0;
  cp.mem_bandwidth = 1e11;
  cp.slowdown = 1.0;
  cp.optimizer = -1.0;
  return cp;
}

}  // namespace tiny

#endif  // TS_TESTS_TINY_MODEL_H
