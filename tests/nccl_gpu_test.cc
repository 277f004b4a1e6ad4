// nccl_gpu_test.cc — the NCCL transport (comm/nccl.h) on GPUs, under
// mpirun on 1 and 2 ranks (tag gpu; the bundle of tools/gpu_bundle.sh runs
// it). With one GPU per rank the group is the world over NCCL; where the
// ranks outnumber the GPUs (NCCL refuses two ranks on one GPU) the test
// says so on stdout and every rank runs the one-rank NCCL path (a
// communicator of one rank) instead.
//
// What it holds NCCL to, each expectation twinned on the CPU:
// - Every collective and the sends give the bits of the same call on host
//   memory through MPI (reduce-scatter plain, accumulating, in place and
//   started; all-gather plain, in place and started; all-reduce of a count
//   no rank count divides; broadcast; send and receive), in fp32, bf16 and
//   fp16, with the same counters. Twin: comm_staged_test (the same front
//   over lent memory) and kernels' SumRanks tests (the device's sum is the
//   host's, bit for bit: CudaParity.SumRanksMatchesCpuBitwise on the GPU).
// - Training on NCCL: ZeRO stages 1 = 0 and 3 = 2 bit for bit at 2
//   micro-batches, overlap on = off (the communication stream ordered by
//   events), and the same bits as the staged transport (both sum in fp32
//   in rank order, rounded once). Twin: staged_device_test, zero_test.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/floats.h"
#include "comm/comm.h"
#include "comm/nccl.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "models/llama.h"
#include "models/model.h"
#include "tests/tiny_model.h"

namespace {

using tiny::World;

int LocalRank() {
  const char *v = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  return v && *v ? atoi(v) : 0;
}
int LocalSize() {
  const char *v = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  return v && *v ? atoi(v) : 1;
}

// The group NCCL runs on here: the world when every rank has its own GPU,
// else a one-rank group per rank (said once on stdout).
struct Place {
  int device = 0;
  bool own_gpu = true;
};

Place Where() {
  Place p;
  int n = ts_k_device_count(TS_DEVICE_CUDA);
  p.own_gpu = n >= LocalSize();  // else the multi-rank transfers do not run here: said below
  p.device = n > 0 ? LocalRank() % n : 0;
  static bool said = false;
  if (!said && !p.own_gpu && ts_comm_rank(World()) == 0)
    printf(
        "[ note     ] %d ranks on this node, %d GPU(s): NCCL needs one GPU per rank, so each "
        "rank runs the one-rank NCCL path (the exchanges between ranks are not tested here)\n",
        LocalSize(), n);
  said = true;
  return p;
}

// The lender of the test's GPU memory: copies and additions on the step
// context, sums on the communication context.
struct Lender {
  ts_kctx step{}, comm{};
  ts_comm_memory mem{};
  ts_comm_nccl_streams streams{};
  explicit Lender(int device) {
    EXPECT_EQ(ts_k_context_init(&step, TS_DEVICE_CUDA, device), TS_OK) << ts_last_error();
    EXPECT_EQ(ts_k_context_init(&comm, TS_DEVICE_CUDA, device), TS_OK) << ts_last_error();
    mem.user = this;
    mem.copy = [](void *u, void *dst, const void *src, size_t nb) {
      return ts_k_copy(&static_cast<Lender *>(u)->step, dst, src, nb);
    };
    mem.add = [](void *u, void *out, const void *a, const void *b, size_t n, ts_dtype dt) {
      return ts_k_add(&static_cast<Lender *>(u)->step, out, a, b, n, dt);
    };
    streams.device = device;
    streams.step_stream = step.stream;
    streams.comm_stream = comm.stream;
    streams.user = this;
    streams.sum_ranks = [](void *u, void *out, const void *const *parts, int n, size_t count,
                           ts_dtype dt, int accumulate) {
      return ts_k_sum_ranks(&static_cast<Lender *>(u)->comm, out, parts, n, count, dt, accumulate);
    };
  }
  ~Lender() {
    ts_k_context_destroy(&comm);
    ts_k_context_destroy(&step);
  }
};

// A device buffer of n bytes holding h (or zeros).
struct Dev {
  void *p = nullptr;
  size_t n;
  explicit Dev(size_t bytes, const void *h = nullptr) : n(bytes) {
    EXPECT_EQ(cudaMalloc(&p, n ? n : 1), cudaSuccess);
    if (h)
      EXPECT_EQ(cudaMemcpy(p, h, n, cudaMemcpyHostToDevice), cudaSuccess);
    else
      EXPECT_EQ(cudaMemset(p, 0, n ? n : 1), cudaSuccess);
    // both may still run on the legacy stream, which the test's non-blocking
    // streams do not wait for
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  Dev(const Dev &) = delete;
  ~Dev() { cudaFree(p); }
  std::vector<unsigned char> get(const ts_kctx &step) const {
    std::vector<unsigned char> h(n);
    EXPECT_EQ(cudaStreamSynchronize((cudaStream_t)step.stream), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

// n elements of dt, random in [-4, 4), seeded by (seed, rank).
std::vector<unsigned char> Random(size_t n, ts_dtype dt, unsigned seed, int rank) {
  std::mt19937 g(seed * 1000003u + (unsigned)rank);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<unsigned char> b(n * ts_dtype_size(dt));
  for (size_t i = 0; i < n; i++) {
    float x = std::ldexp(u(g), (int)(g() % 9) - 4);
    if (dt == TS_FP32)
      std::memcpy(b.data() + 4 * i, &x, 4);
    else {
      uint16_t h = dt == TS_BF16 ? ts_f32_to_bf16(x) : ts_f32_to_f16(x);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}

class NcclTransport : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(ts_k_device_count(TS_DEVICE_CUDA), 0) << "this test needs a CUDA GPU";
    place_ = Where();
    if (place_.own_gpu) {
      // the reference: the same ranks over MPI on host memory
      ASSERT_EQ(ts_comm_split(World(), 0, ts_comm_rank(World()), "ref", &ref_), TS_OK);
      ASSERT_EQ(ts_comm_split(World(), 0, ts_comm_rank(World()), "nccl", &group_), TS_OK);
    } else {
      ASSERT_EQ(ts_comm_self(&ref_), TS_OK);
      ASSERT_EQ(ts_comm_self(&group_), TS_OK);
    }
    lender_ = new Lender(place_.device);
    ASSERT_EQ(ts_comm_set_nccl(group_, &lender_->mem, &lender_->streams), TS_OK) << ts_last_error();
    EXPECT_STREQ(ts_comm_transport(group_), "nccl");
  }
  void TearDown() override {
    if (group_) {
      EXPECT_EQ(ts_comm_set_memory(group_, nullptr), TS_OK);
      EXPECT_STRNE(ts_comm_transport(group_), "nccl");  // back on its own transport
    }
    ts_comm_free(group_);
    ts_comm_free(ref_);
    delete lender_;
  }
  ts_comm *group_ = nullptr, *ref_ = nullptr;
  Lender *lender_ = nullptr;
  Place place_;
};

TEST_F(NcclTransport, EveryCallGivesTheHostBits) {
  const int N = ts_comm_size(group_), r = ts_comm_rank(group_);
  printf("[ note     ] NCCL %s, %d rank(s) in the group\n", ts_comm_nccl_version(), N);
  const ts_kctx &step = lender_->step;
  unsigned seed = 1;
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16})
    for (size_t count : {(size_t)1, (size_t)1000, (size_t)4099}) {  // 1: empty chunks
      SCOPED_TRACE(std::string(ts_dtype_name(dt)) + " count " + std::to_string(count));
      const size_t es = ts_dtype_size(dt), nb = count * es;
      ts_comm_reset_counters(group_);
      ts_comm_reset_counters(ref_);
      // reduce-scatter: plain, accumulating, started, in place
      for (int mode = 0; mode < 4; mode++) {
        SCOPED_TRACE("reduce-scatter mode " + std::to_string(mode));
        auto send = Random(count * N, dt, seed++, r);
        auto prev = Random(count, dt, seed++, r);
        int acc = mode == 1;
        std::vector<unsigned char> want = mode == 3 ? send : prev;
        std::vector<unsigned char> scratch(ts_comm_reduce_scatter_scratch_bytes(ref_, count, dt));
        void *hrecv = mode == 3 ? want.data() + (size_t)r * nb : want.data();
        const void *hsend = mode == 3 ? want.data() : send.data();
        ASSERT_EQ(ts_comm_reduce_scatter(ref_, hsend, hrecv, count, dt, acc, scratch.data(),
                                         scratch.size()),
                  TS_OK)
            << ts_last_error();
        Dev dsend(send.size(), send.data()), drecv(nb, prev.data()), dscr(scratch.size() + 1);
        void *recv = mode == 3 ? (char *)dsend.p + (size_t)r * nb : drecv.p;
        if (mode == 2) {
          ts_comm_request *q = nullptr;
          ASSERT_EQ(ts_comm_ireduce_scatter(group_, dsend.p, recv, count, dt, 0, dscr.p,
                                            scratch.size(), &q),
                    TS_OK)
              << ts_last_error();
          ASSERT_EQ(ts_comm_wait(q), TS_OK) << ts_last_error();
        } else {
          ASSERT_EQ(
              ts_comm_reduce_scatter(group_, dsend.p, recv, count, dt, acc, dscr.p, scratch.size()),
              TS_OK)
              << ts_last_error();
        }
        std::vector<unsigned char> got = mode == 3 ? dsend.get(step) : drecv.get(step);
        if (mode == 3)
          EXPECT_EQ(0, std::memcmp(got.data() + (size_t)r * nb, want.data() + (size_t)r * nb, nb));
        else
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(), nb));
      }
      // all-gather: plain, in place, started
      for (int mode = 0; mode < 3; mode++) {
        SCOPED_TRACE("all-gather mode " + std::to_string(mode));
        auto mine = Random(count, dt, seed++, r);
        std::vector<unsigned char> want(nb * N);
        ASSERT_EQ(ts_comm_all_gather(ref_, mine.data(), want.data(), count, dt), TS_OK);
        std::vector<unsigned char> init(nb * N, 0);
        if (mode == 1) std::memcpy(init.data() + (size_t)r * nb, mine.data(), nb);
        Dev dsend(nb, mine.data()), drecv(nb * N, init.data());
        const void *send = mode == 1 ? (char *)drecv.p + (size_t)r * nb : dsend.p;
        if (mode == 2) {
          ts_comm_request *q = nullptr;
          ASSERT_EQ(ts_comm_iall_gather(group_, send, drecv.p, count, dt, &q), TS_OK);
          ASSERT_EQ(ts_comm_wait(q), TS_OK) << ts_last_error();
        } else {
          ASSERT_EQ(ts_comm_all_gather(group_, send, drecv.p, count, dt), TS_OK) << ts_last_error();
        }
        EXPECT_TRUE(drecv.get(step) == want);
      }
      {  // all-reduce: uneven chunks when N does not divide count
        auto buf = Random(count, dt, seed++, r);
        std::vector<unsigned char> want = buf;
        std::vector<unsigned char> scratch(ts_comm_all_reduce_scratch_bytes(ref_, count, dt));
        ASSERT_EQ(ts_comm_all_reduce(ref_, want.data(), count, dt, scratch.data(), scratch.size()),
                  TS_OK);
        Dev d(nb, buf.data()), dscr(scratch.size() + 1);
        ASSERT_EQ(ts_comm_all_reduce(group_, d.p, count, dt, dscr.p, scratch.size()), TS_OK)
            << ts_last_error();
        EXPECT_TRUE(d.get(step) == want) << "all-reduce";
      }
      {  // broadcast from the last rank
        auto buf = Random(count, dt, seed++, r);
        std::vector<unsigned char> want = buf;
        ASSERT_EQ(ts_comm_broadcast(ref_, want.data(), count, dt, N - 1), TS_OK);
        Dev d(nb, buf.data());
        ASSERT_EQ(ts_comm_broadcast(group_, d.p, count, dt, N - 1), TS_OK) << ts_last_error();
        EXPECT_TRUE(d.get(step) == want) << "broadcast";
      }
      if (N >= 2 && r < 2) {  // rank 0 sends to rank 1
        auto buf = Random(count, dt, seed, 0);
        Dev d(nb, r == 0 ? buf.data() : nullptr);
        ts_comm_request *q = nullptr;
        if (r == 0)
          ASSERT_EQ(ts_comm_isend(group_, d.p, count, dt, 1, 5, &q), TS_OK) << ts_last_error();
        else
          ASSERT_EQ(ts_comm_irecv(group_, d.p, count, dt, 0, 5, &q), TS_OK) << ts_last_error();
        ASSERT_EQ(ts_comm_wait(q), TS_OK) << ts_last_error();
        EXPECT_TRUE(d.get(step) == buf) << "send/recv";
        if (r == 0) {  // the reference counts the same send
          ASSERT_EQ(ts_comm_send(ref_, buf.data(), count, dt, 1, 5), TS_OK);
        } else {
          std::vector<unsigned char> h(nb);
          ASSERT_EQ(ts_comm_recv(ref_, h.data(), count, dt, 0, 5), TS_OK);
        }
      }
      seed++;
      const ts_comm_counters *a = ts_comm_get_counters(group_), *b = ts_comm_get_counters(ref_);
      for (int k = 0; k < TS_COMM_NUM_KINDS; k++) {
        EXPECT_EQ(a->bytes[k], b->bytes[k]) << ts_comm_kind_name((ts_comm_kind)k);
        EXPECT_EQ(a->calls[k], b->calls[k]) << ts_comm_kind_name((ts_comm_kind)k);
      }
    }
}

// ---- training ------------------------------------------------------------------

constexpr size_t kB = 2, kT = 16;

using tiny::Feed;
using tiny::Fill;

struct Trained {
  std::vector<double> losses;
  std::vector<float> params;
};

template <typename T>
bool Same(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Trains `model` 5 steps on `group` on device `device` (tiny batches, 2
// micro-batches, chunks of 4096 bytes) and returns the losses and every
// parameter; shard_group as ts_engine_opts'. Checks that the engine's
// transport on group is NCCL when asked for and given back at the end,
// when `plain` (no hybrid sharding: the engine's dp is group itself).
Trained TrainOn(const ts_model &model, ts_comm *group, int device, ts_dtype dt, int stage,
                bool overlap, int comm, int shard_group) {
  ts_engine_opts o = ts_engine_default_opts();
  o.micro_batch = kB;
  o.seq = kT;
  o.grad_accum = 2;
  o.dtype = dt;
  o.zero_stage = stage;
  o.overlap = overlap;
  o.device = TS_DEVICE_CUDA;
  o.device_index = device;
  o.comm = comm;
  o.comm_chunk_bytes = 4096;
  o.shard_group = shard_group;
  bool plain = shard_group == 0;
  Trained t;
  ts_engine *e = nullptr;
  EXPECT_EQ(ts_engine_create(&e, &model, &o, group), TS_OK) << ts_last_error();
  if (!e) return t;
  if (plain && comm == TS_ENGINE_COMM_NCCL) {
    EXPECT_STREQ(ts_comm_transport(group), "nccl");
  }
  uint64_t after_first = 0;
  for (int s = 1; s <= 5; s++) {
    Feed f{(size_t)s, ts_comm_rank(group), kB, kT};
    ts_step_stats st;
    EXPECT_EQ(ts_engine_step(e, Fill, &f, 1e-2f, &st), TS_OK) << ts_last_error();
    t.losses.push_back(st.loss);
    if (s == 1) after_first = ts_comm_allocations();
  }
  // no transport allocates inside a step after the first (NCCL's requests
  // and their events, the staged copies: the groups' pools)
  EXPECT_EQ(ts_comm_allocations(), after_first) << "comm allocated inside steps 2-5";
  for (int u = 0; u < model.n_units; u++)
    for (int i = 0; i < model.units[u].n_tensors; i++) {
      const ts_tensor_spec &ts = model.units[u].tensors[i];
      std::vector<float> v(ts.numel);
      EXPECT_EQ(ts_engine_get_tensor(e, ts.name, v.data(), v.size()), TS_OK) << ts_last_error();
      t.params.insert(t.params.end(), v.begin(), v.end());
    }
  ts_engine_free(e);
  if (plain) {
    EXPECT_STRNE(ts_comm_transport(group), "nccl");  // given back
  }
  return t;
}

TEST(NcclTraining, StagesBitwiseOverlapOnEqualsOffAndStagedGivesTheSameBits) {
  ASSERT_GT(ts_k_device_count(TS_DEVICE_CUDA), 0) << "this test needs a CUDA GPU";
  Place p = Where();
  ts_comm *group = nullptr;  // the world (one GPU each) or this rank alone
  if (p.own_gpu)
    ASSERT_EQ(ts_comm_split(World(), 0, ts_comm_rank(World()), "dp", &group), TS_OK);
  else
    ASSERT_EQ(ts_comm_self(&group), TS_OK);
  ts_llama_config c = tiny::Config("nccl-test", false, 2);
  ts_model model{};
  ASSERT_EQ(ts_llama_model_init(&model, &c), TS_OK) << ts_last_error();
  auto train = [&](ts_dtype dt, int stage, bool overlap, int comm) {
    return TrainOn(model, group, p.device, dt, stage, overlap, comm, 0);
  };
  for (ts_dtype dt : {TS_FP32, TS_BF16}) {
    Trained first[2];
    for (int stage = 0; stage <= 3; stage++)
      for (bool overlap : {true, false}) {
        SCOPED_TRACE(std::string(ts_dtype_name(dt)) + " ZeRO-" + std::to_string(stage) +
                     " overlap " + std::to_string(overlap));
        Trained t = train(dt, stage, overlap, TS_ENGINE_COMM_NCCL);
        ASSERT_EQ(t.losses.size(), 5u);
        EXPECT_TRUE(std::isfinite(t.losses[0]));
        Trained &f = first[stage / 2];
        if (f.losses.empty()) {
          f = t;
          // the staged transport (or, alone, the local path) gives the same bits
          Trained s = train(dt, stage, overlap, TS_ENGINE_COMM_STAGED);
          EXPECT_TRUE(Same(f.losses, s.losses)) << f.losses[2] << " vs staged " << s.losses[2];
          EXPECT_TRUE(Same(f.params, s.params));
          continue;
        }
        EXPECT_TRUE(Same(f.losses, t.losses)) << f.losses[2] << " vs " << t.losses[2];
        EXPECT_TRUE(Same(f.params, t.params));
      }
  }
  ts_model_free(&model);
  ts_comm_free(group);
}

// Hybrid sharding with a shard group of 1 on NCCL: each rank's group of one
// on the one-rank NCCL path (its reduce-scatter and gathers on the
// communication stream), the replicas' all-reduce staged through host
// copies on the step stream after the engine waited for the group's
// reductions. Its bits are the staged transport's at every stage, overlap
// on or off: a read of the shard before NCCL's stream wrote it would not
// be. Twin: staged_device_test's HybridShardGroupOfOneEqualsPlainZero.
TEST(NcclTraining, HybridShardGroupOfOneGivesTheStagedBits) {
  ASSERT_GT(ts_k_device_count(TS_DEVICE_CUDA), 0) << "this test needs a CUDA GPU";
  if (ts_comm_size(World()) < 2) GTEST_SKIP() << "one rank: no replicas";
  Place p = Where();
  ts_llama_config c = tiny::Config("nccl-test", false, 2);
  ts_model model{};
  ASSERT_EQ(ts_llama_model_init(&model, &c), TS_OK) << ts_last_error();
  auto train = [&](ts_dtype dt, int stage, bool overlap, int comm) {
    return TrainOn(model, World(), p.device, dt, stage, overlap, comm, 1);
  };
  for (ts_dtype dt : {TS_FP32, TS_BF16})
    for (int stage = 0; stage <= 3; stage++) {
      SCOPED_TRACE(std::string(ts_dtype_name(dt)) + " ZeRO-" + std::to_string(stage));
      Trained staged = train(dt, stage, false, TS_ENGINE_COMM_STAGED);
      ASSERT_EQ(staged.losses.size(), 5u);
      EXPECT_TRUE(std::isfinite(staged.losses[2]));
      for (bool overlap : {true, false}) {
        Trained t = train(dt, stage, overlap, TS_ENGINE_COMM_NCCL);
        EXPECT_TRUE(Same(staged.losses, t.losses))
            << "overlap " << overlap << ": " << staged.losses[2] << " vs " << t.losses[2];
        EXPECT_TRUE(Same(staged.params, t.params)) << "overlap " << overlap;
      }
    }
  ts_model_free(&model);
}

}  // namespace
