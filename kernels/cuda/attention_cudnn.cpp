/*
 * attention_cudnn.cpp — causal grouped-query attention, and bidirectional
 * attention with a key padding mask (per-sequence lengths, or an additive
 * bias), in bf16/fp16 through cuDNN's fused flash attention (SDPA forward
 * and backward), built with NVIDIA's cudnn-frontend graph API
 * (@cudnn_frontend, header-only C++) and offered to C through
 * kernels/cuda/attention_cudnn.h.
 *
 * Host code only (g++, not nvcc): it describes each pass as a one-node
 * cuDNN graph (Q, K, V in, O and Stats out; or the backward node), lets
 * cuDNN's heuristics (mode A) pick and compile a kernel for it, and runs it.
 *
 * Invariants:
 *   - one cuDNN handle per GPU and process (ts_cudnn_device_handle),
 *     shared by every context on that GPU and kept until the process
 *     ends, and with it one graph cache: graphs are cached per (handle,
 *     B, T, NH, NKV, HS, dt, direction, mask) in one process-wide map, so an
 *     engine created after another on the same GPU builds nothing the
 *     first one built. A build happens at most once per key (a failed
 *     build is not cached: the next call retries and reports again);
 *   - one mutex guards the handles, the cache and each execution (the
 *     shared handle is bound to the calling context's stream, then the
 *     graph enqueued: host work of microseconds), so contexts on several
 *     threads may call at once;
 *   - tensor UIDs are fixed (enum below), so a call's variant pack is
 *     built from its pointers without looking anything up in the graph;
 *   - building a graph and running it fail differently: any failure while
 *     building (a frontend step's error — validate, lowering, "no valid
 *     engine configs", check_support, GRAPH_EXECUTION_PLAN_CREATION_FAILED
 *     when cuDNN's runtime compiler is missing — or an exception the
 *     frontend throws meanwhile) is TS_ERR_UNSUPPORTED with cuDNN's reason
 *     in the one-line message, and the caller runs the plain kernels
 *     (attention.cu); a failure while executing a built graph is
 *     TS_ERR_CUDA, an error;
 *   - no C++ exception leaves this file: every entry point catches and
 *     turns it into a ts_status (the frontend throws from a few places,
 *     e.g. sdpa() when no implementation fits the attributes);
 *   - nothing is queued unless the graph was built and its workspace fits.
 */
#include "kernels/cuda/attention_cudnn.h"

#include <cudnn.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>

#include <cudnn_frontend.h>

namespace fe = cudnn_frontend;

namespace {

/* Which pass a cached graph runs. */
enum Direction { FORWARD = 0, BACKWARD = 1 };

/* UIDs of the graphs' non-virtual tensors (the variant pack's keys). */
enum : int64_t {
  UID_Q = 1,
  UID_K,
  UID_V,
  UID_O,
  UID_STATS,
  UID_DO,
  UID_DQ,
  UID_DK,
  UID_DV,
  UID_BIAS,
  UID_SEQ_Q,
  UID_SEQ_KV,
};

/* How a graph masks its scores (ts_cudnn_mask). */
enum MaskKind { MASK_CAUSAL = 0, MASK_BIAS = 1, MASK_LENGTHS = 2 };

/* The shape of one call, as cuDNN's int64 dimensions. */
struct Dims {
  int64_t b, t, nh, nkv, hs; /* B, T, NH, NKV, HS */
  fe::DataType_t io;         /* BFLOAT16 or HALF */
  const char *dt_name;       /* "bf16" or "fp16", for messages */
  MaskKind mask;             /* causal, an additive (B, 1, T, T) bias, or sequence lengths */
};

/* A built graph and the workspace bytes its chosen plan needs. */
struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

/* Cache key: (handle, B, T, NH, NKV, HS, dt, direction, mask kind). */
typedef std::tuple<void *, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int> Key;
typedef std::map<Key, std::shared_ptr<const Plan>> Cache;

/* The mutex, the graph cache and the handles by CUDA ordinal. Allocated
 * once and never freed: they live as long as the process, so nothing
 * depends on the order of static destructors at exit. */
std::mutex &cache_mutex() {
  static std::mutex *m = new std::mutex;
  return *m;
}
Cache &cache() {
  static Cache *c = new Cache;
  return *c;
}
std::map<int, cudnnHandle_t> &handles() {
  static std::map<int, cudnnHandle_t> *h = new std::map<int, cudnnHandle_t>;
  return *h;
}

/* a * b and a + b saturating at SIZE_MAX, so a bound stays a bound. */
size_t mul_sat(size_t a, size_t b) {
  size_t r;
  return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}
size_t add_sat(size_t a, size_t b) {
  size_t r;
  return __builtin_add_overflow(a, b, &r) ? SIZE_MAX : r;
}

/* One-line form of a frontend message (they may hold newlines). */
std::string one_line(std::string s) {
  for (char &c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

/* The "what, where" prefix of every message of one call. */
std::string where(const char *pass, const Dims &d) {
  char buf[192];
  snprintf(buf, sizeof buf, "cudnn attention %s (B=%lld T=%lld NH=%lld NKV=%lld HS=%lld %s, %s)",
           pass, (long long)d.b, (long long)d.t, (long long)d.nh, (long long)d.nkv, (long long)d.hs,
           d.dt_name,
           d.mask == MASK_BIAS ? "key bias" : d.mask == MASK_LENGTHS ? "key lengths" : "causal");
  return buf;
}

/* TS_OK, or `failed` for a failed frontend step, naming the step and
 * cuDNN's message (its error code when the message is empty). Building
 * passes TS_ERR_UNSUPPORTED, executing TS_ERR_CUDA (see the top). */
ts_status fe_status(const fe::error_t &e, ts_status failed, const char *step, const char *pass,
                    const Dims &d) {
  if (e.is_good()) return TS_OK;
  std::string why = one_line(e.err_msg);
  if (why.empty()) why = "error code " + std::to_string((int)e.code);
  return ts_set_error(failed, "%s: cudnn-frontend %s: %s", where(pass, d).c_str(), step,
                      why.c_str());
}

/* TS_OK, or TS_ERR_CUDA naming the cuDNN call and cuDNN's message. */
ts_status cudnn_status(cudnnStatus_t s, const char *call) {
  if (s == CUDNN_STATUS_SUCCESS) return TS_OK;
  return ts_set_error(TS_ERR_CUDA, "cudnn: %s: %s", call, cudnnGetErrorString(s));
}

/* The status for an exception caught at an entry point. */
ts_status exception_status(const char *pass, const Dims &d, const char *what) {
  return ts_set_error(TS_ERR_CUDA, "%s: cudnn-frontend threw: %s", where(pass, d).c_str(),
                      one_line(what).c_str());
}

/* Checks what both passes share and fills *d (d->mask: the kind of mask). */
ts_status check_call(const ts_kctx *ctx, size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                     ts_dtype dt, const ts_cudnn_mask *mask, const char *pass, Dims *d) {
  const bool bias = mask && mask->bias, lengths = mask && (mask->seq_q || mask->seq_kv);
  d->mask = bias ? MASK_BIAS : lengths ? MASK_LENGTHS : MASK_CAUSAL;
  if (bias && lengths)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "cudnn attention %s: the mask has both a bias and sequence lengths", pass);
  if (lengths && !(mask->seq_q && mask->seq_kv))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "cudnn attention %s: the mask needs both seq_q and seq_kv", pass);
  if (!ctx) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "cudnn attention %s: ctx is NULL", pass);
  if (ctx->device != TS_DEVICE_CUDA)
    return ts_set_error(TS_ERR_INVALID_USAGE, "cudnn attention %s: ctx is on device %s, not cuda",
                        pass, ts_device_name(ctx->device));
  if (!ctx->dnn)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "cudnn attention %s: ctx->dnn is NULL (ts_cudnn_device_handle gives it)",
                        pass);
  if (!ctx->workspace && ctx->workspace_bytes != 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "cudnn attention %s: ctx->workspace is NULL but workspace_bytes is %zu",
                        pass, ctx->workspace_bytes);
  switch (dt) {
    case TS_BF16:
      d->io = fe::DataType_t::BFLOAT16;
      d->dt_name = "bf16";
      break;
    case TS_FP16:
      d->io = fe::DataType_t::HALF;
      d->dt_name = "fp16";
      break;
    case TS_FP32:
      return ts_set_error(TS_ERR_UNSUPPORTED,
                          "cudnn attention %s: cuDNN's fused attention takes bf16 or fp16, "
                          "not fp32",
                          pass);
    default:
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "cudnn attention %s: unknown dtype %d", pass,
                          (int)dt);
  }
  if (B == 0 || T == 0 || NH == 0 || NKV == 0 || HS == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "cudnn attention %s: zero dimension (B=%zu T=%zu NH=%zu NKV=%zu HS=%zu)",
                        pass, B, T, NH, NKV, HS);
  if (NH % NKV != 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "cudnn attention %s: NH %% NKV != 0 (NH=%zu NKV=%zu)", pass, NH, NKV);
  /* The largest tensor, (B, T, NH, HS), and (B, NH, T, T) for cuDNN's
   * internal score matrix, must index in int64. */
  size_t n = mul_sat(mul_sat(mul_sat(B, T), NH), HS);
  size_t s = mul_sat(mul_sat(mul_sat(B, NH), T), T);
  if (n > (size_t)INT64_MAX / 8 || s > (size_t)INT64_MAX / 8)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "cudnn attention %s: dimensions too large for cuDNN (B=%zu T=%zu NH=%zu "
                        "HS=%zu)",
                        pass, B, T, NH, HS);
  d->b = (int64_t)B;
  d->t = (int64_t)T;
  d->nh = (int64_t)NH;
  d->nkv = (int64_t)NKV;
  d->hs = (int64_t)HS;
  return TS_OK;
}

/* A (B, H, T, HS) cuDNN tensor over row-major (B, T, H, HS) memory. */
fe::graph::Tensor_attributes bthd(const char *name, int64_t uid, const Dims &d, int64_t h) {
  fe::graph::Tensor_attributes t;
  t.set_name(name)
      .set_uid(uid)
      .set_data_type(d.io)
      .set_dim({d.b, h, d.t, d.hs})
      .set_stride({d.t * h * d.hs, d.hs, h * d.hs, 1});
  return t;
}

/* Gives an output tensor of the graph the same layout as bthd. */
void set_bthd(const std::shared_ptr<fe::graph::Tensor_attributes> &t, int64_t uid, const Dims &d,
              int64_t h) {
  t->set_output(true)
      .set_uid(uid)
      .set_data_type(d.io)
      .set_dim({d.b, h, d.t, d.hs})
      .set_stride({d.t * h * d.hs, d.hs, h * d.hs, 1});
}

/* The (B, 1, T, T) additive bias in dt, contiguous (one (T, T) matrix
 * per batch row, shared by its heads). */
fe::graph::Tensor_attributes bias_tensor(const Dims &d) {
  fe::graph::Tensor_attributes t;
  t.set_name("Bias")
      .set_uid(UID_BIAS)
      .set_data_type(d.io)
      .set_dim({d.b, 1, d.t, d.t})
      .set_stride({d.t * d.t, d.t * d.t, d.t, 1});
  return t;
}

/* A (B, 1, 1, 1) int32 sequence-length tensor (one length per batch row). */
fe::graph::Tensor_attributes seq_len_tensor(const char *name, int64_t uid, const Dims &d) {
  fe::graph::Tensor_attributes t;
  t.set_name(name)
      .set_uid(uid)
      .set_data_type(fe::DataType_t::INT32)
      .set_dim({d.b, 1, 1, 1})
      .set_stride({1, 1, 1, 1});
  return t;
}

/* Sets the mask of d on either pass's attributes: causal (top-left), the
 * additive bias, or cuDNN's padding mask from the two length tensors. */
template <typename Attributes>
void set_mask(Attributes &opts, fe::graph::Graph &g, const Dims &d) {
  if (d.mask == MASK_BIAS) {
    opts.set_bias(g.tensor(bias_tensor(d))); /* S = scale * Q K^T + Bias */
  } else if (d.mask == MASK_LENGTHS) {
    opts.set_padding_mask(true)
        .set_seq_len_q(g.tensor(seq_len_tensor("seq_len_q", UID_SEQ_Q, d)))
        .set_seq_len_kv(g.tensor(seq_len_tensor("seq_len_kv", UID_SEQ_KV, d)));
  } else {
    /* Causal, top-left aligned: key j is kept for query i iff j <= i + 0
     * (set_causal_mask does the same but is marked for deprecation). */
    opts.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  }
}

/* The (B, NH, T, 1) fp32 row statistics, contiguous as (B, NH, T). */
void set_stats(fe::graph::Tensor_attributes &t, const Dims &d) {
  t.set_uid(UID_STATS)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({d.b, d.nh, d.t, 1})
      .set_stride({d.nh * d.t, d.t, 1, 1});
}

/* A graph with fp32 intermediates and compute over dt storage. */
std::shared_ptr<fe::graph::Graph> new_graph(const char *name, const Dims &d) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_name(name)
      .set_io_data_type(d.io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

/* Softmax scale 1/sqrt(HS), as the CPU reference computes it. */
float attn_scale(const Dims &d) { return 1.0f / std::sqrt((float)d.hs); }

/* Lowers, plans and compiles graph g on handle h; plan->workspace_bytes
 * gets the chosen plan's need. */
ts_status build(Plan *plan, cudnnHandle_t h, const char *pass, const Dims &d) {
  fe::graph::Graph &g = *plan->graph;
  const ts_status no = TS_ERR_UNSUPPORTED;
  TS_CHECK(fe_status(g.validate(), no, "validate", pass, d));
  TS_CHECK(fe_status(g.build_operation_graph(h), no, "build_operation_graph", pass, d));
  TS_CHECK(fe_status(g.create_execution_plans({fe::HeurMode_t::A}), no, "create_execution_plans",
                     pass, d));
  TS_CHECK(fe_status(g.check_support(), no, "check_support", pass, d));
  TS_CHECK(fe_status(g.build_plans(), no, "build_plans", pass, d));
  int64_t ws = 0;
  TS_CHECK(fe_status(g.get_workspace_size(ws), no, "get_workspace_size", pass, d));
  plan->workspace_bytes = ws;
  return TS_OK;
}

/* The forward graph: (O, Stats) = SDPA(Q, K, V), causal, with the bias
 * added to the scaled scores, or with the padding mask, training mode. */
ts_status build_forward(Plan *plan, cudnnHandle_t h, const Dims &d) {
  plan->graph = new_graph("ts_attention_forward", d);
  fe::graph::Graph &g = *plan->graph;
  auto Q = g.tensor(bthd("Q", UID_Q, d, d.nh));
  auto K = g.tensor(bthd("K", UID_K, d, d.nkv));
  auto V = g.tensor(bthd("V", UID_V, d, d.nkv));
  /* Stats come with set_generate_stats (set_is_inference(false) is
   * deprecated). */
  auto opts = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(
      attn_scale(d));
  set_mask(opts, g, d);
  std::array<std::shared_ptr<fe::graph::Tensor_attributes>, 2> outs;
  try {
    outs = g.sdpa(Q, K, V, std::move(opts));
  } catch (const std::runtime_error &e) {
    /* Thrown when neither SDPA implementation accepts the attributes. */
    return ts_set_error(TS_ERR_UNSUPPORTED, "%s: cudnn-frontend sdpa: %s",
                        where("forward", d).c_str(), one_line(e.what()).c_str());
  }
  set_bthd(outs[0], UID_O, d, d.nh);
  outs[1]->set_output(true);
  set_stats(*outs[1], d);
  return build(plan, h, "forward", d);
}

/* The backward graph: (dQ, dK, dV) = SDPA backward with the forward's
 * mask (no dBias), deterministic. */
ts_status build_backward(Plan *plan, cudnnHandle_t h, const Dims &d) {
  plan->graph = new_graph("ts_attention_backward", d);
  fe::graph::Graph &g = *plan->graph;
  auto Q = g.tensor(bthd("Q", UID_Q, d, d.nh));
  auto K = g.tensor(bthd("K", UID_K, d, d.nkv));
  auto V = g.tensor(bthd("V", UID_V, d, d.nkv));
  auto O = g.tensor(bthd("O", UID_O, d, d.nh));
  auto dO = g.tensor(bthd("dO", UID_DO, d, d.nh));
  fe::graph::Tensor_attributes stats_attr;
  stats_attr.set_name("Stats");
  set_stats(stats_attr, d);
  auto Stats = g.tensor(stats_attr);
  auto opts = fe::graph::SDPA_backward_attributes()
                  .set_name("sdpa_backward")
                  .set_attn_scale(attn_scale(d))
                  .set_deterministic_algorithm(true);
  set_mask(opts, g, d);
  auto grads = g.sdpa_backward(Q, K, V, O, dO, Stats, std::move(opts));
  set_bthd(grads[0], UID_DQ, d, d.nh);
  set_bthd(grads[1], UID_DK, d, d.nkv);
  set_bthd(grads[2], UID_DV, d, d.nkv);
  return build(plan, h, "backward", d);
}

/* The cached plan for (handle, d, dir), built on first use. Called with
 * cache_mutex() held. */
ts_status get_plan(void *handle, const Dims &d, Direction dir, std::shared_ptr<const Plan> *out) {
  Key key(handle, d.b, d.t, d.nh, d.nkv, d.hs, (int)d.io, (int)dir, (int)d.mask);
  auto it = cache().find(key);
  if (it != cache().end()) {
    *out = it->second;
    return TS_OK;
  }
  auto plan = std::make_shared<Plan>();
  cudnnHandle_t h = (cudnnHandle_t)handle;
  const char *pass = dir == FORWARD ? "forward" : "backward";
  try {
    TS_CHECK(dir == FORWARD ? build_forward(plan.get(), h, d) : build_backward(plan.get(), h, d));
  } catch (const std::bad_alloc &) {
    throw; /* out of host memory: the entry point's handler */
  } catch (const std::exception &e) {
    return ts_set_error(TS_ERR_UNSUPPORTED, "%s: cudnn-frontend threw while building: %s",
                        where(pass, d).c_str(), one_line(e.what()).c_str());
  } catch (...) {
    return ts_set_error(TS_ERR_UNSUPPORTED, "%s: cudnn-frontend threw while building",
                        where(pass, d).c_str());
  }
  cache().emplace(key, plan);
  *out = plan;
  return TS_OK;
}

/* Binds the handle to ctx's stream, checks the workspace and runs plan.
 * Called with cache_mutex() held (the handle is shared). */
ts_status execute(const ts_kctx *ctx, const Plan &plan, std::unordered_map<int64_t, void *> &pack,
                  const char *pass, const Dims &d) {
  if (plan.workspace_bytes < 0 || (uint64_t)plan.workspace_bytes > (uint64_t)ctx->workspace_bytes)
    return ts_set_error(TS_ERR_OUT_OF_MEMORY,
                        "%s: the cuDNN graph needs %lld bytes of workspace, ctx->workspace_bytes "
                        "is %zu",
                        where(pass, d).c_str(), (long long)plan.workspace_bytes,
                        ctx->workspace_bytes);
  cudnnHandle_t h = (cudnnHandle_t)ctx->dnn;
  TS_CHECK(cudnn_status(cudnnSetStream(h, (cudaStream_t)ctx->stream), "cudnnSetStream"));
  return fe_status(plan.graph->execute(h, pack, ctx->workspace), TS_ERR_CUDA, "execute", pass, d);
}

/* Adds the mask's tensors, if it has any, to a call's variant pack. */
void pack_mask(std::unordered_map<int64_t, void *> &pack, const ts_cudnn_mask *mask) {
  if (!mask) return;
  if (mask->bias) pack[UID_BIAS] = const_cast<void *>(mask->bias);
  if (mask->seq_q) pack[UID_SEQ_Q] = const_cast<int32_t *>(mask->seq_q);
  if (mask->seq_kv) pack[UID_SEQ_KV] = const_cast<int32_t *>(mask->seq_kv);
}

}  // namespace

extern "C" ts_status ts_cudnn_device_handle(int device, void **handle) {
  if (!handle)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "ts_cudnn_device_handle: handle is NULL");
  try {
    std::lock_guard<std::mutex> lock(cache_mutex());
    auto it = handles().find(device);
    if (it == handles().end()) {
      cudnnHandle_t h = nullptr;
      TS_CHECK(cudnn_status(cudnnCreate(&h), "cudnnCreate"));
      it = handles().emplace(device, h).first;
    }
    *handle = it->second;
    return TS_OK;
  } catch (const std::bad_alloc &) {
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "ts_cudnn_device_handle: out of host memory");
  }
}

extern "C" ts_status ts_cudnn_attention_forward(const ts_kctx *ctx, void *out, float *stats,
                                                const void *q, const void *k, const void *v,
                                                const ts_cudnn_mask *mask, size_t B, size_t T,
                                                size_t NH, size_t NKV, size_t HS, ts_dtype dt) {
  Dims d;
  TS_CHECK(check_call(ctx, B, T, NH, NKV, HS, dt, mask, "forward", &d));
  if (!out || !stats || !q || !k || !v)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: NULL pointer (out, stats, q, k or v)",
                        where("forward", d).c_str());
  try {
    std::lock_guard<std::mutex> lock(cache_mutex());
    std::shared_ptr<const Plan> plan;
    TS_CHECK(get_plan(ctx->dnn, d, FORWARD, &plan));
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, const_cast<void *>(q)}, {UID_K, const_cast<void *>(k)},
        {UID_V, const_cast<void *>(v)}, {UID_O, out},
        {UID_STATS, stats},
    };
    pack_mask(pack, mask);
    return execute(ctx, *plan, pack, "forward", d);
  } catch (const std::bad_alloc &) {
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: out of host memory",
                        where("forward", d).c_str());
  } catch (const std::exception &e) {
    return exception_status("forward", d, e.what());
  } catch (...) {
    return exception_status("forward", d, "unknown exception");
  }
}

extern "C" ts_status ts_cudnn_attention_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                                 const void *dout, const void *out, const void *q,
                                                 const void *k, const void *v, const float *stats,
                                                 const ts_cudnn_mask *mask, size_t B, size_t T,
                                                 size_t NH, size_t NKV, size_t HS, ts_dtype dt) {
  Dims d;
  TS_CHECK(check_call(ctx, B, T, NH, NKV, HS, dt, mask, "backward", &d));
  if (!dq || !dk || !dv || !dout || !out || !q || !k || !v || !stats)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: NULL pointer (dq, dk, dv, dout, out, q, k, v or stats)",
                        where("backward", d).c_str());
  try {
    std::lock_guard<std::mutex> lock(cache_mutex());
    std::shared_ptr<const Plan> plan;
    TS_CHECK(get_plan(ctx->dnn, d, BACKWARD, &plan));
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, const_cast<void *>(q)},
        {UID_K, const_cast<void *>(k)},
        {UID_V, const_cast<void *>(v)},
        {UID_O, const_cast<void *>(out)},
        {UID_DO, const_cast<void *>(dout)},
        {UID_STATS, const_cast<float *>(stats)},
        {UID_DQ, dq},
        {UID_DK, dk},
        {UID_DV, dv},
    };
    pack_mask(pack, mask);
    return execute(ctx, *plan, pack, "backward", d);
  } catch (const std::bad_alloc &) {
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: out of host memory",
                        where("backward", d).c_str());
  } catch (const std::exception &e) {
    return exception_status("backward", d, e.what());
  } catch (...) {
    return exception_status("backward", d, "unknown exception");
  }
}

extern "C" size_t ts_cudnn_attention_workspace_bytes(size_t B, size_t T, size_t NH, size_t NKV,
                                                     size_t HS, ts_dtype dt) {
  (void)dt; /* bf16 and fp16 are both 2 bytes; the formula is the same */
  if (B == 0 || T == 0 || NH == 0 || NKV == 0 || HS == 0) return 0;
  if (T > SIZE_MAX - 127) return SIZE_MAX;
  const size_t Tp = (T + 127) / 128 * 128;
  const size_t rows = mul_sat(mul_sat(B, NH), Tp); /* B*NH*Tp softmax rows */
  size_t n = mul_sat(mul_sat(rows, Tp), 2);        /* dP/dS, 2-byte */
  n = add_sat(n, mul_sat(mul_sat(rows, HS), 4));   /* fp32 dQ accumulator */
  if (NH != NKV) n = add_sat(n, mul_sat(mul_sat(rows, HS), 8)); /* fp32 dK, dV full-head */
  n = add_sat(n, mul_sat(rows, 8));                             /* 2 x fp32 softmax sums */
  return add_sat(n, (size_t)16 << 20);                          /* headroom */
}
