// unit_testing.h — a harness for one unit of any family under test: its
// parameters, input, saved and workspace buffers on the CPU in fp32, a
// scalar objective, and central finite differences of it.
#ifndef TS_MODELS_UNIT_TESTING_H
#define TS_MODELS_UNIT_TESTING_H

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "models/model.h"

// One unit under test: params, saved, workspace, with a scalar objective
// J = sum(y * r) (embedding, block) or the head's mean loss.
struct UnitHarness {
  ts_model model{};
  int u;
  size_t B = 2, T = 5;
  std::vector<float> params, grads, tied_w, tied_g;
  std::vector<float> x, r;  // (B,T,C) input and objective weights
  std::vector<int32_t> tokens, targets;
  std::vector<unsigned char> saved, ws;
  ts_kctx ctx{};
  double loss[2] = {0, 0};  // the head's (loss sum, rows with a target)

  // Takes over `built` (a model from ts_model_parse or a family's init).
  UnitHarness(const ts_model &built, int unit, unsigned seed) : model(built), u(unit) {
    std::mt19937 g(seed);
    std::normal_distribution<float> n(0.f, 1.f);
    const ts_unit &un = model.units[u];
    params.resize(un.numel);
    for (int i = 0; i < un.n_tensors; i++) {
      const ts_tensor_spec &t = un.tensors[i];
      for (size_t j = 0; j < t.numel; j++)
        params[t.offset + j] = t.ndim == 1 ? 1.0f + 0.2f * n(g) : 0.3f * n(g);
    }
    grads.assign(un.numel, 0.f);
    size_t C = model.hidden_size, V = model.vocab_size, N = B * T;
    x.resize(N * C);
    r.resize(N * C);
    for (auto &v : x) v = n(g);
    for (auto &v : r) v = n(g);
    tokens.resize(N);
    targets.resize(N);
    for (size_t i = 0; i < N; i++) {
      tokens[i] = (int32_t)(g() % V);
      targets[i] = (int32_t)(g() % V);
    }
    targets[3] = TS_IGNORE_INDEX;  // ignored rows must not contribute
    if (un.tied_unit >= 0) {
      tied_w.resize(V * C);
      for (auto &v : tied_w) v = 0.3f * n(g);
      tied_g.assign(V * C, 0.f);
    }
    saved.resize(ts_unit_saved_bytes(&model, u, B, T, TS_FP32, TS_DEVICE_CPU) + 1);
    ws.resize(ts_unit_workspace_bytes(&model, u, B, T, TS_FP32, TS_DEVICE_CPU) + 64);
    ctx.device = TS_DEVICE_CPU;
    // 64-byte aligned start inside ws
    uintptr_t p = ((uintptr_t)ws.data() + 63) & ~(uintptr_t)63;
    ctx.workspace = (void *)p;
    ctx.workspace_bytes = ts_unit_workspace_bytes(&model, u, B, T, TS_FP32, TS_DEVICE_CPU);
  }
  ~UnitHarness() { ts_model_free(&model); }

  ts_unit_args Args(std::vector<float> *y) {
    ts_unit_args a{};
    a.B = B;
    a.T = T;
    a.dt = TS_FP32;
    a.tokens = tokens.data();
    a.targets = targets.data();
    a.x = x.data();
    a.y = y ? y->data() : nullptr;
    a.saved = saved.data();
    a.loss = loss;
    if (!tied_w.empty()) {
      a.tied_weight = tied_w.data();
      a.tied_grad = tied_g.data();
    }
    return a;
  }

  // Forward and the objective J, in double.
  double Objective() {
    std::vector<float> y(x.size());
    ts_unit_args a = Args(&y);
    EXPECT_EQ(ts_unit_forward(&model, u, &ctx, params.data(), &a), TS_OK) << ts_last_error();
    if (model.units[u].role == TS_UNIT_HEAD) return loss[0] / loss[1];
    double j = 0;
    for (size_t i = 0; i < y.size(); i++) j += (double)y[i] * r[i];
    return j;
  }

  // Forward + backward; returns dx (empty for the embedding).
  std::vector<float> Backward() {
    std::vector<float> y(x.size()), dx(x.size(), 0.f);
    ts_unit_args a = Args(&y);
    EXPECT_EQ(ts_unit_forward(&model, u, &ctx, params.data(), &a), TS_OK) << ts_last_error();
    a.dy = r.data();
    a.dx = model.units[u].role == TS_UNIT_EMBEDDING ? nullptr : dx.data();
    a.dloss = (float)(1.0 / loss[1]);
    EXPECT_EQ(ts_unit_backward(&model, u, &ctx, params.data(), grads.data(), &a), TS_OK)
        << ts_last_error();
    return dx;
  }
};

// The weight-gradient store's memory for tests: malloc'd copies, the
// harness's workspace volatile (its temporaries are overwritten later).
inline ts_status WgradAlloc(void *, size_t bytes, void **out) {
  *out = malloc(bytes);
  return *out ? TS_OK : ts_set_error(TS_ERR_OUT_OF_MEMORY, "test copy");
}
inline void WgradRelease(void *, void *p) { free(p); }

// B then W (ts_unit_splits_backward units under a ctx->wgrad store) against
// the undivided backward, from the same nonzero gradients (W accumulates):
// dx bitwise after B with the gradients untouched, then every gradient
// bitwise after W, run with the workspace overwritten in between (what W
// reads from it must be its own copies). Returns the records W ran.
inline size_t ExpectSplitBackwardBitwise(UnitHarness &h) {
  std::mt19937 g(99);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> start(h.grads.size()), tstart(h.tied_g.size());
  for (auto &v : start) v = n(g);
  for (auto &v : tstart) v = n(g);
  h.grads = start;
  h.tied_g = tstart;
  std::vector<float> dx_full = h.Backward(), g_full = h.grads, t_full = h.tied_g;
  h.grads = start;
  h.tied_g = tstart;
  ts_k_wgrad_mem mem{};
  mem.alloc = WgradAlloc;
  mem.release = WgradRelease;
  mem.ranges[0].p = h.ctx.workspace;
  mem.ranges[0].bytes = h.ctx.workspace_bytes;
  mem.n_ranges = 1;
  ts_k_wgrad *w = nullptr;
  EXPECT_EQ(ts_k_wgrad_new(&mem, &w), TS_OK) << ts_last_error();
  h.ctx.wgrad = w;
  std::vector<float> dx = h.Backward();  // B
  h.ctx.wgrad = nullptr;
  size_t records = ts_k_wgrad_pending(w);
  EXPECT_GT(records, 0u);
  EXPECT_EQ(memcmp(dx.data(), dx_full.data(), dx.size() * 4), 0) << "dx after B";
  EXPECT_EQ(memcmp(h.grads.data(), start.data(), start.size() * 4), 0) << "grads touched by B";
  EXPECT_TRUE(h.tied_g == tstart) << "tied grads touched by B";
  memset(h.ctx.workspace, 0xff, h.ctx.workspace_bytes);  // NaNs where B's temporaries were
  EXPECT_EQ(ts_k_wgrad_run(&h.ctx, w, nullptr, 0, nullptr), TS_OK) << ts_last_error();  // W
  EXPECT_EQ(ts_k_wgrad_pending(w), 0u);
  EXPECT_EQ(ts_k_wgrad_bytes(w), 0u);
  EXPECT_EQ(memcmp(h.grads.data(), g_full.data(), g_full.size() * 4), 0) << "grads after W";
  EXPECT_TRUE(h.tied_g == t_full) << "tied grads after W";
  ts_k_wgrad_free(w);
  return records;
}

// Central differences of J w.r.t. every element of v, compared with the
// analytic gradient. fp32 forward with h = 1e-2 (inputs are O(1)): the
// truncation error is O(h^2 |J'''|) ~ 1e-4 and the rounding error
// ~ 1e-7 |J| / h ~ 1e-4 for |J| ~ 10, so 2e-3 absolute plus 1e-2 relative
// leaves a margin of ~10x while still catching any wrong term (those are O(1)).
// Elements before `first` are skipped.
inline void ExpectGradMatches(UnitHarness &h, std::vector<float> &v,
                              const std::vector<float> &analytic, const std::string &what,
                              size_t first = 0) {
  ASSERT_EQ(v.size(), analytic.size());
  const float step = 1e-2f;
  int bad = 0;
  for (size_t i = first; i < v.size(); i++) {
    float orig = v[i];
    v[i] = orig + step;
    double jp = h.Objective();
    v[i] = orig - step;
    double jm = h.Objective();
    v[i] = orig;
    double num = (jp - jm) / (2.0 * step);
    double tol = 2e-3 + 1e-2 * std::fabs(num);
    if (std::fabs(num - analytic[i]) > tol && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << " numeric " << num;
  }
  EXPECT_EQ(bad, 0) << what;
}

#endif  // TS_MODELS_UNIT_TESTING_H
