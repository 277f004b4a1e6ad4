// bench_matmul.cc — GFLOP/s of every linear product of a llama-small step
// (M = 16 x 128 tokens; forward, dinp and dW of q, k/v, o, gate/up, down
// and the head) through tessera's ts_k_linear_* on the CPU, in bf16 and
// fp32, beside the baselines made and run directly, each with its own
// partition over the threads (what the library gives without tessera
// around it): oneDNN's matmul primitive for the same bf16 and fp32
// product, and OpenBLAS's cblas_sgemm for fp32.
//
// Output: a Markdown table, one row per (layer, pass): tessera bf16,
// oneDNN bf16, their ratio; tessera fp32, oneDNN fp32, OpenBLAS sgemm, and
// tessera fp32 over the better of the two. Each figure is the best of the
// repetitions after a warm-up, repeated until 0.2 s have passed (at least
// 3). Threads: OMP_NUM_THREADS. Usage: bench_matmul [M]  (default 2048).
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "kernels/kernels.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best seconds of fn over the repetitions after one warm-up call.
double Best(const std::function<void()> &fn) {
  fn();
  double best = 1e30, start = Now();
  for (int rep = 0; rep < 3 || Now() - start < 0.2; rep++) {
    double t0 = Now();
    fn();
    double dt = Now() - t0;
    if (dt < best) best = dt;
  }
  return best;
}

// oneDNN's own product C (M, N) = op(A) (M, K) op(B) (K, N) in bf16 or
// fp32, made and run directly; accumulate adds the previous C (sum
// post-op), as dW does. -1 where oneDNN has no kernel for it within its ISA
// cap (bf16 under ONEDNN_MAX_CPU_ISA=AVX2).
double OneDnn(size_t M, size_t N, size_t K, bool ta, bool tb, bool acc, bool fp32) {
  using dnnl::memory;
  using tag = memory::format_tag;
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  static dnnl::stream st(eng);
  auto bf = fp32 ? memory::data_type::f32 : memory::data_type::bf16;
  memory::desc a({(long)M, (long)K}, bf, ta ? tag::ba : tag::ab);
  memory::desc b({(long)K, (long)N}, bf, tb ? tag::ba : tag::ab);
  memory::desc c({(long)M, (long)N}, bf, tag::ab);
  dnnl::primitive_attr attr;
  if (acc) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, eng);
  } catch (const dnnl::error &) {
    return -1;
  }
  dnnl::matmul p(pd);
  memory ma(a, eng), mb(b, eng), mc(c, eng);
  return Best([&] {
    p.execute(st, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    st.wait();
  });
}

// OpenBLAS's own sgemm of the same product (its threads, its partition).
double Sgemm(size_t M, size_t N, size_t K, bool ta, bool tb, bool acc) {
  std::vector<float> a(M * K, 1.0f), b(K * N, 1.0f), c(M * N, 0.0f);
  return Best([&] {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)K, 1.0f, a.data(), ta ? (int)M : (int)K, b.data(),
                tb ? (int)K : (int)N, acc ? 1.0f : 0.0f, c.data(), (int)N);
  });
}

struct Layer {
  const char *name;
  size_t N, K;  // weight (N, K)
};

}  // namespace

int main(int argc, char **argv) {
  const size_t M = argc > 1 ? (size_t)atol(argv[1]) : 2048;
  const Layer layers[] = {{"q, o", 512, 512},
                          {"k, v", 256, 512},
                          {"gate, up", 1280, 512},
                          {"down", 512, 1280},
                          {"head", 4096, 512}};
  printf("M = %zu, %s threads; bf16 products: %s; fp32 products: %s\n", M,
         getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "all",
         ts_k_matmul_impl(TS_DEVICE_CPU, TS_BF16), ts_k_matmul_impl(TS_DEVICE_CPU, TS_FP32));
  printf(
      "| layer (N x K) | pass | tessera bf16 GFLOP/s | oneDNN bf16 GFLOP/s | tessera / oneDNN "
      "| tessera fp32 GFLOP/s | oneDNN fp32 GFLOP/s | OpenBLAS sgemm GFLOP/s | tessera / better "
      "|\n| :--- | :--- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const Layer &l : layers) {
    const size_t N = l.N, K = l.K;
    double flops = 2.0 * (double)M * (double)N * (double)K;
    for (int pass = 0; pass < 3; pass++) {
      double t[2];
      for (int d = 0; d < 2; d++) {
        ts_dtype dt = d == 0 ? TS_BF16 : TS_FP32;
        size_t es = ts_dtype_size(dt);
        std::vector<char> x(M * K * es, 0), w(N * K * es, 0), y(M * N * es, 0);
        std::vector<char> ws(ts_k_linear_workspace_bytes(TS_DEVICE_CPU, M, N, K, dt) + 64);
        ts_kctx ctx{};
        ctx.device = TS_DEVICE_CPU;
        ctx.workspace = ws.data() + (64 - (uintptr_t)ws.data() % 64) % 64;
        ctx.workspace_bytes = ws.size() - 64;
        t[d] = Best([&] {
          ts_status st = pass == 0
                             ? ts_k_linear_forward(&ctx, y.data(), x.data(), w.data(), M, N, K, dt)
                         : pass == 1 ? ts_k_linear_backward(&ctx, x.data(), nullptr, y.data(),
                                                            x.data(), w.data(), M, N, K, dt)
                                     : ts_k_linear_backward(&ctx, nullptr, w.data(), y.data(),
                                                            x.data(), w.data(), M, N, K, dt);
          if (st != TS_OK) {
            fprintf(stderr, "bench_matmul: %s\n", ts_last_error());
            exit(1);
          }
        });
      }
      // the same product in oneDNN's terms: forward (M,N) = x (M,K) W^T;
      // dinp (M,K) = dy (M,N) W (N,K); dW (N,K) += dy^T (N,M) x (M,K)
      double o[2], s;
      for (int f = 0; f < 2; f++)
        o[f] = pass == 0   ? OneDnn(M, N, K, false, true, false, f)
               : pass == 1 ? OneDnn(M, K, N, false, false, false, f)
                           : OneDnn(N, K, M, true, false, true, f);
      s = pass == 0   ? Sgemm(M, N, K, false, true, false)
          : pass == 1 ? Sgemm(M, K, N, false, false, false)
                      : Sgemm(N, K, M, true, false, true);
      char bf[2][32];
      if (o[0] > 0) {
        snprintf(bf[0], sizeof bf[0], "%.0f", flops / o[0] / 1e9);
        snprintf(bf[1], sizeof bf[1], "%.2f", o[0] / t[0]);
      } else {
        snprintf(bf[0], sizeof bf[0], "-");
        snprintf(bf[1], sizeof bf[1], "-");
      }
      double best = o[1] > 0 && o[1] < s ? o[1] : s;
      printf("| %s (%zu x %zu) | %s | %.0f | %s | %s | %.0f | %.0f | %.0f | %.2f |\n", l.name, N,
             K,
             pass == 0   ? "forward"
             : pass == 1 ? "dinp"
                         : "dW",
             flops / t[0] / 1e9, bf[0], bf[1], flops / t[1] / 1e9, flops / o[1] / 1e9,
             flops / s / 1e9, best / t[1]);
    }
  }
  return 0;
}
