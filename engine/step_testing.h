// step_testing.h — tests drive the executor (C++ only, //engine:testing):
// one ts_engine_step over given micro-batches, with a look at the engine
// between its REDUCE and OPTIMIZER actions (the gradients of the step,
// reduced; on one rank ts_engine_get_grad reads them) through an observer
// (observer.h).
#ifndef TS_ENGINE_STEP_TESTING_H
#define TS_ENGINE_STEP_TESTING_H

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/engine.h"
#include "engine/observer.h"

namespace ts_testing {

// Micro-batch k of the step: inputs[k] and targets[k], each (B, T) int32
// host arrays of the engine's micro-batch shape.
struct MicroBatches {
  std::vector<const int32_t *> inputs, targets;
  void Add(const int32_t *in, const int32_t *tgt) {
    inputs.push_back(in);
    targets.push_back(tgt);
  }
};

namespace detail {
struct StepCall {
  const MicroBatches *mb;
  size_t bt;
  std::function<void(ts_engine *)> before_optimizer;
};
inline ts_status Fill(void *user, int mb, int32_t *in, int32_t *tgt) {
  const StepCall *c = static_cast<const StepCall *>(user);
  if ((size_t)mb >= c->mb->inputs.size())
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "step_testing: micro-batch %d of %zu given", mb,
                        c->mb->inputs.size());
  std::copy(c->mb->inputs[mb], c->mb->inputs[mb] + c->bt, in);
  std::copy(c->mb->targets[mb], c->mb->targets[mb] + c->bt, tgt);
  return TS_OK;
}
inline ts_status BeforeOptimizer(void *user, ts_engine *e, const ts_action *a, int end,
                                 ts_status) {
  const StepCall *c = static_cast<const StepCall *>(user);
  if (!end && a->kind == TS_ACT_OPTIMIZER && c->before_optimizer) c->before_optimizer(e);
  return TS_OK;
}
}  // namespace detail

// ts_engine_step over the micro-batches mb (grad_accum of them), calling
// before_optimizer(e), when given, as the OPTIMIZER action begins.
inline ts_status Step(ts_engine *e, const MicroBatches &mb, float lr, ts_step_stats *stats,
                      std::function<void(ts_engine *)> before_optimizer = nullptr) {
  const ts_engine_opts *o = ts_engine_options(e);
  detail::StepCall c{&mb, o->micro_batch * o->seq, std::move(before_optimizer)};
  ts_step_observer obs{};
  obs.action = detail::BeforeOptimizer;
  obs.user = &c;
  ts_status st = ts_engine_add_observer(e, &obs);
  if (st != TS_OK) return st;
  st = ts_engine_step(e, detail::Fill, &c, lr, stats);
  ts_engine_remove_observer(e, &obs);
  return st;
}

// One micro-batch's step (grad_accum 1).
inline ts_status Step(ts_engine *e, const int32_t *in, const int32_t *tgt, float lr,
                      ts_step_stats *stats,
                      std::function<void(ts_engine *)> before_optimizer = nullptr) {
  MicroBatches mb;
  mb.Add(in, tgt);
  return Step(e, mb, lr, stats, std::move(before_optimizer));
}

}  // namespace ts_testing

#endif  // TS_ENGINE_STEP_TESTING_H
