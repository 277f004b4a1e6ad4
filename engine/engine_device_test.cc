// engine_device_test.cc — the engine on one device, built twice: as
// engine_device_test on the CPU (every CI run) and, with -DTS_TEST_CUDA, as
// engine_gpu_test on one GPU (tag gpu: built everywhere, run on a GPU
// machine by `bazel test --test_tag_filters=gpu` or the bundle of
// tools/gpu_bundle.sh; without a GPU every test of that build fails: it
// exists to run where one is). The CPU build is the GPU test's twin: the
// same expectations on the backend CI has, so the expectation itself is
// tested before GPU time is spent on it.
//
// What it holds each device to: the determinism contract (DESIGN.md "One
// step") — at one rank, ZeRO stages 0-3 give bitwise-identical losses and
// parameters at gradient accumulation 1, and with accumulation stage 1
// equals stage 0 and stage 3 equals stage 2 bitwise (0/1 accumulate the
// full gradient and reduce once, 2/3 reduce each micro-batch into the
// shard) — in fp32, bf16 and fp16 (loss scaling), with and without
// recompute; the ledger equals the plan to the byte; two runs repeat bit
// for bit (deterministic cuBLASLt algorithm choice, cuDNN's deterministic
// attention backward, no atomics). On the GPU only: the card's used bytes
// stay put across a step, cuDNN's attention agrees with the plain kernels,
// a run larger than the card is refused up front, and 20 fp32 steps of
// llama-tiny and of bert-tiny (a masked LM: its head on the masked rows
// only) agree with the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/step_testing.h"
#include "kernels/kernels.h"
#include "models/llama.h"
#include "models/model.h"

namespace {

#ifdef TS_TEST_CUDA
const ts_device kDevice = TS_DEVICE_CUDA;
#else
const ts_device kDevice = TS_DEVICE_CPU;
#endif

ts_llama_config SmallConfig() {
  ts_llama_config c{};
  snprintf(c.name, sizeof c.name, "device-test");
  c.hidden_size = 128;  // HS 32: cuDNN's fused attention wants HS % 8 == 0
  c.intermediate_size = 352;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 777;  // odd: no kernel may assume a round vocabulary
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.f;
  return c;
}

// The id a masked LM's batches put in place of the tokens it predicts
// (BERT's [MASK]), above the token ranges the tests draw from.
const int32_t kMaskId = 103;

// Random (inputs, targets) for step s, a pure function of (seed, s). A
// masked LM's (mlm): about 15% of the positions masked, their target the
// token, their input kMaskId; the others' target -100.
void Batch(size_t n, size_t V, unsigned s, std::vector<int32_t> *in, std::vector<int32_t> *tgt,
           bool mlm = false) {
  std::mt19937 g(1000 + s);
  in->resize(n);
  tgt->resize(n);
  for (size_t i = 0; i < n; i++) {
    (*in)[i] = (int32_t)(g() % V);
    (*tgt)[i] = i % 11 == 3 ? -100 : (int32_t)(g() % V);  // some ignored targets
    if (mlm) {
      bool masked = g() % 100 < 15;
      (*tgt)[i] = masked ? (*in)[i] : -100;
      if (masked) (*in)[i] = kMaskId;
    }
  }
}

struct Trained {
  std::vector<double> losses;
  std::vector<float> params;  // every tensor, fp32, model order
};

// Trains `steps` optimizer steps of o.grad_accum micro-batches and returns
// the losses and the final parameters. Tokens are drawn from the first
// `token_range` ids (0: the whole vocabulary); mlm: a masked LM's batches.
Trained Train(const ts_model &model, ts_engine_opts o, int steps, size_t token_range = 0,
              bool mlm = false) {
  Trained r;
  ts_engine *e = nullptr;
  EXPECT_EQ(ts_engine_create(&e, &model, &o, nullptr), TS_OK) << ts_last_error();
  if (!e) return r;
  for (int s = 0; s < steps; s++) {
    std::vector<std::vector<int32_t>> ins(o.grad_accum), tgts(o.grad_accum);
    ts_testing::MicroBatches mb;
    for (size_t k = 0; k < o.grad_accum; k++) {
      Batch(o.micro_batch * o.seq, token_range ? token_range : model.vocab_size,
            (unsigned)(s * 7 + k), &ins[k], &tgts[k], mlm);
      mb.Add(ins[k].data(), tgts[k].data());
    }
    ts_step_stats st;
    EXPECT_EQ(ts_testing::Step(e, mb, 1e-3f, &st), TS_OK) << ts_last_error();
    r.losses.push_back(st.loss);
  }
  for (int u = 0; u < model.n_units; u++)
    for (int i = 0; i < model.units[u].n_tensors; i++) {
      const ts_tensor_spec &t = model.units[u].tensors[i];
      std::vector<float> v(t.numel);
      EXPECT_EQ(ts_engine_get_tensor(e, t.name, v.data(), v.size()), TS_OK) << ts_last_error();
      r.params.insert(r.params.end(), v.begin(), v.end());
    }
  ts_engine_free(e);
  return r;
}

// Two micro-batches of 2 x 37 tokens (odd) per step on the device under
// test; grad_accum is set by each test.
ts_engine_opts DeviceOpts(ts_dtype dt, size_t grad_accum) {
  ts_engine_opts o = ts_engine_default_opts();
  o.micro_batch = 2;
  o.seq = 37;  // odd
  o.grad_accum = grad_accum;
  o.dtype = dt;
  o.device = kDevice;
  return o;
}

bool SameBits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string Name(ts_dtype dt, size_t recompute, int stage) {
  return std::string(ts_dtype_name(dt)) + " recompute " + std::to_string(recompute) + " ZeRO-" +
         std::to_string(stage);
}

class EngineDevice : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(ts_k_device_count(kDevice), 0) << "this test needs a " << ts_device_name(kDevice) << " device";
    ts_llama_config c = SmallConfig();
    ASSERT_EQ(ts_llama_model_init(&model_, &c), TS_OK) << ts_last_error();
  }
  void TearDown() override { ts_model_free(&model_); }
  // Trains stages 0-3 at (dt, recompute, grad_accum) for 3 steps.
  std::vector<Trained> EveryStage(ts_dtype dt, size_t recompute, size_t grad_accum) {
    ts_engine_opts o = DeviceOpts(dt, grad_accum);
    o.recompute_every = recompute;
    std::vector<Trained> runs;
    for (int stage = 0; stage <= 3; stage++) {
      o.zero_stage = stage;
      runs.push_back(Train(model_, o, 3));
      SCOPED_TRACE(Name(dt, recompute, stage));
      EXPECT_EQ(runs.back().losses.size(), 3u);
      for (double l : runs.back().losses) EXPECT_TRUE(std::isfinite(l));
    }
    return runs;
  }
  ts_model model_{};
};

// Gradient accumulation 1: one reduction per step in every stage, so every
// stage trains the same bits (DESIGN.md's contract).
TEST_F(EngineDevice, EveryZeroStageTrainsBitwiseIdentically) {
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16})
    for (size_t recompute : {0, 1}) {
      std::vector<Trained> runs = EveryStage(dt, recompute, 1);
      for (int stage = 1; stage <= 3; stage++) {
        SCOPED_TRACE(Name(dt, recompute, stage));
        EXPECT_EQ(runs[stage].losses, runs[0].losses);
        EXPECT_TRUE(SameBits(runs[stage].params, runs[0].params));
      }
      EXPECT_FALSE(SameBits(runs[0].params, Train(model_, DeviceOpts(dt, 1), 0).params))
          << "the runs trained nothing";
    }
}

// Gradient accumulation 2: what the contract promises today — stage 1 =
// stage 0 (both accumulate the full gradient, then reduce once) and stage
// 3 = stage 2 (both reduce each micro-batch into the gradient shard), bit
// for bit. Stage 2 against stage 0 is not promised: in bf16/fp16 the
// per-micro-batch reduction rounds twice where 0/1 round once (the CPU's
// bf16 losses at step 2: 6.66409 against 6.66422), DESIGN.md's first limit.
TEST_F(EngineDevice, WithAccumulationStagesZeroOneAndTwoThreeAreBitwisePairs) {
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16})
    for (size_t recompute : {0, 1}) {
      std::vector<Trained> runs = EveryStage(dt, recompute, 2);
      for (int stage : {1, 3}) {
        SCOPED_TRACE(Name(dt, recompute, stage));
        EXPECT_EQ(runs[stage].losses, runs[stage - 1].losses);
        EXPECT_TRUE(SameBits(runs[stage].params, runs[stage - 1].params));
      }
    }
}

// Gather once per step (keep_gathered, FSDP2's reshard_after_forward=False):
// ZeRO-3 keeps each unit's gathered parameters from its first forward to
// its last backward of the step. A gather copies the shards, so the bits
// are those of gathering for every forward and backward; stages 0-2 hold
// whole parameters and are unchanged by it. (tests/zero_test counts the
// all-gathers and the memory on 1, 2 and 4 ranks.)
TEST_F(EngineDevice, GatherOncePerStepTrainsTheSameBits) {
  // Accumulation 2 (a unit held across micro-batches), each dtype, bf16
  // with recompute (a backward's forward again on the held parameters).
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16}) {
    size_t recompute = dt == TS_BF16;
    SCOPED_TRACE(Name(dt, recompute, 3) + " accumulation 2");
    ts_engine_opts o = DeviceOpts(dt, 2);
    o.recompute_every = recompute;
    o.zero_stage = 3;
    Trained each = Train(model_, o, 3);
    o.keep_gathered = 1;
    Trained once = Train(model_, o, 3);
    EXPECT_EQ(once.losses, each.losses);
    EXPECT_TRUE(SameBits(once.params, each.params));
    if (dt == TS_FP32) {  // stages 0-2 hold whole parameters: no effect
      o.zero_stage = 0;
      Trained whole = Train(model_, o, 3);
      o.keep_gathered = 0;
      EXPECT_TRUE(SameBits(whole.params, Train(model_, o, 3).params));
    }
  }
}

TEST_F(EngineDevice, TwoRunsRepeatBitForBit) {
  for (ts_dtype dt : {TS_FP32, TS_BF16}) {
    Trained a = Train(model_, DeviceOpts(dt, 2), 3), b = Train(model_, DeviceOpts(dt, 2), 3);
    EXPECT_EQ(a.losses, b.losses) << ts_dtype_name(dt);
    EXPECT_TRUE(SameBits(a.params, b.params)) << ts_dtype_name(dt);
  }
}

// The optimizer state in host memory (opts.offload_optimizer: each unit's
// gradient copied to the host in pieces, the CPU's AdamW, the parameters
// copied back) and in a scratch file (opts.offload_dir, its pieces in host
// memory beside a GPU): the device's losses and parameters bit for bit
// (the CPU's AdamW is the device's element update, kernels.h ts_k_adamw), in
// fp32 (the device's parameters are the master weights), bf16 and fp16
// (loss scaling), at ZeRO 0 and 3, through pieces of 1024 elements that cut
// tensors; at ZeRO 3 with the parameter shards on the host too
// (opts.offload_params: each gather copies the shard to the device). The host account equals its plan; on a GPU the state left the
// card for the host. On the CPU this is the GPU path's twin, with host
// and device memory told apart (ts_k_check_host_blocks: a copy in the
// wrong direction, or a device op on host state, fails the step).
TEST_F(EngineDevice, OffloadedOptimizerStateTrainsTheDevicesBits) {
  ts_k_check_host_blocks(1);
  const char *tmp = getenv("TEST_TMPDIR");
  std::string dir = tmp && *tmp ? tmp : "/tmp";
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16})
    for (int stage : {0, 3}) {
      SCOPED_TRACE(Name(dt, 0, stage));
      ts_engine_opts o = DeviceOpts(dt, 2);
      o.zero_stage = stage;
      Trained dev = Train(model_, o, 3);
      o.offload_optimizer = 1;
      o.offload_piece = 1024;
      Trained host = Train(model_, o, 3);
      EXPECT_EQ(dev.losses, host.losses) << "offload_optimizer";
      EXPECT_TRUE(SameBits(dev.params, host.params)) << "offload_optimizer";
      // the host account against its plan, after a step
      ts_mem_account plan, plan_host, plan_disk;
      ASSERT_EQ(ts_engine_plan_stage_host(&model_, &o, 1, 0, &plan, &plan_host, &plan_disk), TS_OK)
          << ts_last_error();
      ts_engine *e = nullptr;
      ASSERT_EQ(ts_engine_create(&e, &model_, &o, nullptr), TS_OK) << ts_last_error();
      std::vector<std::vector<int32_t>> in(o.grad_accum), tgt(o.grad_accum);
      ts_testing::MicroBatches mb;
      for (size_t k = 0; k < o.grad_accum; k++) {
        Batch(o.micro_batch * o.seq, model_.vocab_size, (unsigned)k, &in[k], &tgt[k]);
        mb.Add(in[k].data(), tgt[k].data());
      }
      ts_step_stats st;
      ASSERT_EQ(ts_testing::Step(e, mb, 1e-3f, &st), TS_OK) << ts_last_error();
      const ts_mem_account *h = ts_engine_host_memory(e), *d = ts_engine_memory(e);
      const ts_mem_account &want = kDevice == TS_DEVICE_CPU ? plan : plan_host;
      for (int c = 0; c < TS_MEM_NUM_CATEGORIES; c++)
        EXPECT_EQ(h->peak[c], want.peak[c]) << ts_mem_category_name((ts_mem_category)c);
      EXPECT_GT(h->current[TS_MEM_OPTIM], 0u);
      EXPECT_GT(h->current[TS_MEM_STAGING], 0u);  // the gradient and parameter pieces
      if (kDevice != TS_DEVICE_CPU) {             // off the card
        EXPECT_EQ(d->peak[TS_MEM_OPTIM], 0u);
        EXPECT_EQ(d->peak[TS_MEM_MASTER], 0u);
      }
      ts_engine_free(e);
      o.offload_optimizer = 0;
      o.offload_dir = dir.c_str();
      Trained disk = Train(model_, o, 3);
      EXPECT_EQ(dev.losses, disk.losses) << "offload_dir";
      EXPECT_TRUE(SameBits(dev.params, disk.params)) << "offload_dir";
      o.offload_optimizer = 1;  // the disk's pieces beside a GPU: its twin on the CPU
      Trained both = Train(model_, o, 3);
      EXPECT_EQ(dev.losses, both.losses) << "offload_dir + offload_optimizer";
      EXPECT_TRUE(SameBits(dev.params, both.params)) << "offload_dir + offload_optimizer";
      o.offload_dir = nullptr;
      if (stage == 3) {  // the parameter shards in host memory too, gathered from there
        o.offload_params = 1;
        Trained params = Train(model_, o, 3);
        EXPECT_EQ(dev.losses, params.losses) << "offload_params";
        EXPECT_TRUE(SameBits(dev.params, params.params)) << "offload_params";
        ts_mem_account plan_p, host_p, disk_p;
        ASSERT_EQ(ts_engine_plan_stage_host(&model_, &o, 1, 0, &plan_p, &host_p, &disk_p), TS_OK);
        if (kDevice != TS_DEVICE_CPU) {  // the shards left the card: only the gathered units
          EXPECT_GT(host_p.current[TS_MEM_PARAMS], 0u);
          EXPECT_EQ(plan_p.current[TS_MEM_PARAMS], 0u);
        }
      }
    }
  ts_k_check_host_blocks(0);
}

TEST_F(EngineDevice, TheLedgerEqualsThePlan) {
  for (ts_dtype dt : {TS_FP32, TS_BF16})
    for (int stage = 0; stage <= 3; stage++) {
      SCOPED_TRACE(std::string(ts_dtype_name(dt)) + " ZeRO-" + std::to_string(stage));
      ts_engine_opts o = DeviceOpts(dt, 2);
      o.zero_stage = stage;
      o.recompute_every = stage % 2;
      o.keep_gathered = dt == TS_BF16 && stage == 3;  // gather-once's holds, planned
      ts_mem_account plan;
      ASSERT_EQ(ts_engine_plan(&model_, &o, 1, &plan), TS_OK) << ts_last_error();
      ts_engine *e = nullptr;
      ASSERT_EQ(ts_engine_create(&e, &model_, &o, nullptr), TS_OK) << ts_last_error();
      std::vector<std::vector<int32_t>> in(2 * o.grad_accum), tgt(2 * o.grad_accum);
      ts_testing::MicroBatches first, second;
      for (size_t k = 0; k < 2 * o.grad_accum; k++) {
        Batch(o.micro_batch * o.seq, model_.vocab_size,
              (unsigned)(k < o.grad_accum ? k : 10 + k - o.grad_accum), &in[k], &tgt[k]);
        (k < o.grad_accum ? first : second).Add(in[k].data(), tgt[k].data());
      }
      ts_step_stats st;
      ASSERT_EQ(ts_testing::Step(e, first, 1e-3f, &st), TS_OK) << ts_last_error();
      // A second step allocates nothing: the card's used bytes stay put
      // (the first may still see cuBLASLt's and cuDNN's lazy set-up).
      ts_device_report before, after;
      ASSERT_EQ(ts_engine_device_report(e, &before), TS_OK) << ts_last_error();
      ASSERT_EQ(ts_testing::Step(e, second, 1e-3f, &st), TS_OK) << ts_last_error();
      ASSERT_EQ(ts_engine_device_report(e, &after), TS_OK) << ts_last_error();
      const ts_mem_account *m = ts_engine_memory(e);
      for (int c = 0; c < TS_MEM_NUM_CATEGORIES; c++)
        EXPECT_EQ(m->peak[c], plan.peak[c]) << ts_mem_category_name((ts_mem_category)c);
      EXPECT_EQ(m->peak_total, plan.peak_total);
#ifdef TS_TEST_CUDA
      EXPECT_EQ(after.used_now, before.used_now);
      if (stage >= 2) {
        EXPECT_GT(after.reserved, 0u);  // its transients, kept
      }
      // What the card reports beside the ledger: the ledger's bytes are in
      // it, and the rest (context, cuBLASLt, cuDNN) is the overhead.
      EXPECT_GE(after.used_now, m->current_total);
      EXPECT_GT(after.total, after.used_now);
#else
      EXPECT_STREQ(after.name, "cpu");  // the CPU reports no card figures
#endif
      ts_engine_free(e);
    }
}

#ifdef TS_TEST_CUDA
// cuDNN's fused attention against tessera's plain kernels on the same bf16
// run (--plain-attention): the same model and batches, 3 steps. Both keep
// fp32 softmax statistics; cuDNN rounds P and dS to bf16 for its tensor-core
// products where the plain kernels keep fp32, so the losses differ by bf16
// roundings (~4e-3 relative per product, averaging out over a sum), not by
// an O(1) error: 2e-2 relative separates the two.
TEST_F(EngineDevice, CudnnAttentionAgreesWithThePlainKernels) {
  for (ts_dtype dt : {TS_BF16, TS_FP16}) {
    ts_engine_opts o = DeviceOpts(dt, 2);
    Trained fused = Train(model_, o, 3);
    o.plain_attention = 1;
    Trained plain = Train(model_, o, 3);
    ASSERT_EQ(fused.losses.size(), 3u);
    ASSERT_EQ(plain.losses.size(), 3u);
    for (size_t s = 0; s < 3; s++)
      EXPECT_NEAR(fused.losses[s], plain.losses[s], 2e-2 * std::fabs(plain.losses[s]))
          << ts_dtype_name(dt) << " step " << s;
  }
}

#endif  // TS_TEST_CUDA

// The same for BERT's bidirectional attention (bert-tiny: 4 layers, HS 64)
// at T = 64, where cuDNN runs it with the key padding mask as an additive
// bias: random ids below 64 include the pad id 0 (one key in 64 on
// average is masked). Same bound as above. On the GPU the two runs must also differ
// in some bit, which shows that the fused kernel ran (P rounded to bf16/
// fp16) rather than the plain kernels behind a refusal; on the CPU
// (plain_attention changes nothing there) they must be equal bit for bit,
// and the twin checks that this schedule trains BERT to finite losses.
TEST_F(EngineDevice, CudnnBidirectionalAttentionAgreesWithThePlainKernels) {
  ts_model bert{};
  ASSERT_EQ(ts_model_load("models/configs/bert-tiny.json", &bert), TS_OK) << ts_last_error();
  for (ts_dtype dt : {TS_BF16, TS_FP16}) {
    ts_engine_opts o = DeviceOpts(dt, 1);
    o.seq = 64;
    Trained fused = Train(bert, o, 3, 64);  // ids < 64: the pad id in 1 of 64
    o.plain_attention = 1;
    Trained plain = Train(bert, o, 3, 64);
    ASSERT_EQ(fused.losses.size(), 3u);
    ASSERT_EQ(plain.losses.size(), 3u);
    for (size_t s = 0; s < 3; s++) {
      EXPECT_TRUE(std::isfinite(plain.losses[s])) << ts_dtype_name(dt) << " step " << s;
      EXPECT_NEAR(fused.losses[s], plain.losses[s], 2e-2 * std::fabs(plain.losses[s]))
          << ts_dtype_name(dt) << " step " << s;
    }
#ifdef TS_TEST_CUDA
    EXPECT_FALSE(SameBits(fused.params, plain.params)) << ts_dtype_name(dt);
#else
    EXPECT_TRUE(SameBits(fused.params, plain.params)) << ts_dtype_name(dt);
#endif
  }
  ts_model_free(&bert);
}

#ifdef TS_TEST_CUDA
// A run that cannot fit is refused before anything is allocated, naming
// the categories.
TEST_F(EngineDevice, APlanLargerThanTheCardIsRefusedUpFront) {
  ts_engine_opts o = DeviceOpts(TS_FP32, 2);
  o.micro_batch = 1u << 20;  // activations alone: far beyond any card
  o.seq = 64;
  ts_engine *e = nullptr;
  EXPECT_EQ(ts_engine_create(&e, &model_, &o, nullptr), TS_ERR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(ts_last_error()).find("activations"), std::string::npos) << ts_last_error();
  EXPECT_EQ(e, nullptr);
}

#endif  // TS_TEST_CUDA

// 20 fp32 steps of llama-tiny (models/configs/llama-tiny.json) on the device
// under test and on the CPU from the same initialisation and batches. The
// tokens come from the first 64 of 4096 ids, so the model has something to
// learn (the unigram over those 64: the loss falls from ln 4096 = 8.3 toward
// ln 64 = 4.2); uniform targets over the whole vocabulary leave the loss at
// ln 4096 within noise, and an H200 run saw step 20 above step 1 with them.
// Both compute in fp32 with TF32 off; they differ only in the order of
// their sums (BLAS and cuBLASLt blockings, reduction trees), ~1e-6 relative
// per operation. The bound, 2e-3 relative on every step's loss and 1e-2
// relative (L2) on the final parameters, sits far below what a wrong kernel
// or a bf16 rounding in the fp32 path gives (bf16's unit roundoff alone is
// 4e-3 per element, and an O(1) bug moves the loss by tenths) and far above
// accumulated fp32 reordering through 20 AdamW steps. In the CPU build both
// runs are CPU runs: the twin checks that this schedule trains (the loss
// falls by more than 1, a third of the way to ln 64) and that the bound
// holds trivially between equal runs.
void ExpectAgreesWithTheCpuOver20Fp32Steps(const char *config, bool mlm) {
  SCOPED_TRACE(config);
  ts_model tiny{};
  ASSERT_EQ(ts_model_load(config, &tiny), TS_OK) << ts_last_error();
  const size_t kTokens = 64;
  ts_engine_opts o = DeviceOpts(TS_FP32, 1);
  o.micro_batch = 4;
  o.seq = 64;
  Trained dev = Train(tiny, o, 20, kTokens, mlm);
  o.device = TS_DEVICE_CPU;
  Trained cpu = Train(tiny, o, 20, kTokens, mlm);
  ASSERT_EQ(dev.losses.size(), 20u);
  ASSERT_EQ(cpu.losses.size(), 20u);
  for (size_t s = 0; s < 20; s++)
    EXPECT_NEAR(dev.losses[s], cpu.losses[s], 2e-3 * std::fabs(cpu.losses[s])) << "step " << s;
  EXPECT_LT(cpu.losses.back(), cpu.losses.front() - 1.0)  // it trained
      << "step 1 " << cpu.losses.front() << ", step 20 " << cpu.losses.back();
  double d2 = 0, n2 = 0;
  ASSERT_EQ(dev.params.size(), cpu.params.size());
  for (size_t i = 0; i < cpu.params.size(); i++) {
    double d = (double)dev.params[i] - cpu.params[i];
    d2 += d * d;
    n2 += (double)cpu.params[i] * cpu.params[i];
  }
  EXPECT_LT(std::sqrt(d2 / n2), 1e-2);
  ts_model_free(&tiny);
}

TEST_F(EngineDevice, AgreesWithTheCpuOver20Fp32Steps) {
  ExpectAgreesWithTheCpuOver20Fp32Steps("models/configs/llama-tiny.json", false);
}

// The same for BERT (bert-tiny) on a masked LM's batches: about 15% of the
// 4 x 64 positions masked, so the head runs on those rows only on either
// device (its targets in host memory beside the GPU, the slot's copy:
// ts_unit_args.host_targets), and the loss falls toward ln 64 as well.
// Same bounds: the masked rows change what the head computes, not its
// precision.
TEST_F(EngineDevice, BertAgreesWithTheCpuOver20Fp32Steps) {
  ExpectAgreesWithTheCpuOver20Fp32Steps("models/configs/bert-tiny.json", true);
}

// A spy on the last unit's calls: the targets each was given in host
// memory (ts_unit_args.host_targets; empty: none) and on the device (read
// back), and whether it trained (the fused loss gradient). A plan's calls
// (ts_engine_create's on a GPU) read nothing and are not recorded.
struct HeadCall {
  int fused;
  std::vector<int32_t> host, device;
};
std::vector<HeadCall> g_calls;
const ts_unit_ops *g_head;

void Record(const ts_kctx *ctx, const ts_unit_args *a) {
  if (ctx->flags & TS_K_PLAN) return;
  HeadCall c{a->fused_loss_grad, {}, std::vector<int32_t>(a->B * a->T)};
  if (a->host_targets) c.host.assign(a->host_targets, a->host_targets + a->B * a->T);
  EXPECT_EQ(ts_k_to_host(ctx, c.device.data(), a->targets, c.device.size() * 4), TS_OK);
  g_calls.push_back(c);
}
ts_status SpyForward(const ts_model *m, const ts_unit *u, const ts_kctx *ctx, const void *p,
                     ts_unit_args *a) {
  Record(ctx, a);
  return g_head->forward(m, u, ctx, p, a);
}
ts_status SpyBackward(const ts_model *m, const ts_unit *u, const ts_kctx *ctx, const void *p,
                      void *g, ts_unit_args *a) {
  Record(ctx, a);
  return g_head->backward(m, u, ctx, p, g, a);
}

// The engine gives the last unit its micro-batch's targets in host memory
// too, the device's own values (on the CPU the slot's array itself, beside
// a GPU the slot's host copy), in each forward and the backward after it
// and in evaluation: what BERT's head picks its masked rows by.
TEST_F(EngineDevice, TheLastUnitGetsItsTargetsInHostMemoryToo) {
  ts_unit &head = model_.units[model_.n_units - 1];
  ts_unit_ops spy = *head.ops;
  spy.forward = SpyForward;
  spy.backward = SpyBackward;
  g_head = head.ops;
  head.ops = &spy;
  g_calls.clear();
  ts_engine_opts o = DeviceOpts(TS_FP32, 2);
  ts_engine *e = nullptr;
  ASSERT_EQ(ts_engine_create(&e, &model_, &o, nullptr), TS_OK) << ts_last_error();
  std::vector<std::vector<int32_t>> in(2), tgt(2);
  ts_testing::MicroBatches mb;
  for (unsigned k = 0; k < 2; k++) {
    Batch(o.micro_batch * o.seq, model_.vocab_size, 40 + k, &in[k], &tgt[k], true);
    mb.Add(in[k].data(), tgt[k].data());
  }
  ts_step_stats st;
  EXPECT_EQ(ts_testing::Step(e, mb, 1e-3f, &st), TS_OK) << ts_last_error();
  double sum;
  size_t count;
  EXPECT_EQ(ts_engine_eval(e, in[1].data(), tgt[0].data(), &sum, &count), TS_OK);
  ts_engine_free(e);
  head.ops = g_head;
  // forward and backward of micro-batch 0, then of 1, then the evaluation's forward
  ASSERT_EQ(g_calls.size(), 5u);
  const int fused[5] = {1, 1, 1, 1, 0}, batch[5] = {0, 0, 1, 1, 0};
  for (size_t i = 0; i < 5; i++) {
    EXPECT_EQ(g_calls[i].fused, fused[i]) << "call " << i;
    EXPECT_EQ(g_calls[i].host, tgt[batch[i]]) << "call " << i;
    EXPECT_EQ(g_calls[i].device, tgt[batch[i]]) << "call " << i;
  }
}

}  // namespace
