// tiny_model.h — what the multi-rank engine tests share: a tiny LLaMA
// config (C 32, 4 heads of which 2 key-value, vocabulary 96, at most 16
// positions) and the world communicator of mpirun.
#ifndef TS_TESTS_TINY_MODEL_H
#define TS_TESTS_TINY_MODEL_H

#include <gtest/gtest.h>

#include <cstdio>

#include "comm/comm.h"
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

// The world of mpirun, shared by every test of this process.
inline ts_comm *World() {
  static ts_comm *world = [] {
    ts_comm *c = nullptr;
    EXPECT_EQ(ts_comm_world(&c), TS_OK) << ts_last_error();
    return c;
  }();
  return world;
}

}  // namespace tiny

#endif  // TS_TESTS_TINY_MODEL_H
