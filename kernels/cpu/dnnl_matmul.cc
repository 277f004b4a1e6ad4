// dnnl_matmul.cc — the CPU backend's products (fp32, bf16, fp16) through
// oneDNN's matmul primitive (dnnl_matmul.h).
//
// Invariants:
// - The output is cut into tiles of a fixed size (tiles.h), each computed
//   whole by one primitive made for one thread, tiles spread over OpenMP's
//   threads: every tile is the same single-threaded computation at any
//   thread count, so the bits do not depend on it.
// - One CPU engine for the process, one in-order stream per thread; a
//   primitive per tile shape (m, n, K, leading dimensions, layouts, dtype,
//   accumulate, bias or not), made on first use with OpenMP's thread count
//   set to 1 and kept, under a mutex (the communication thread never
//   computes, but the cache must not care who calls). At most four tile
//   shapes per product.
// - Operands are wrapped in memory objects over the caller's buffers (a
//   tile is a strided view, its bias the row's slice of the tile's
//   columns): no copy, no widening, no tessera workspace.
//   Each thread's scratchpad is its own (user mode, grown as needed, kept).
// - ts_cpu_dnnl_matmul is called outside OpenMP regions; it opens one.
#include "kernels/cpu/dnnl_matmul.h"

#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/tiles.h"

namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
// m, n, K, lda, ldb, ldc, trans_a, trans_b, accumulate, dtype, bias
using Key = std::tuple<size_t, size_t, size_t, size_t, size_t, size_t, int, int, int, int, int>;

struct Cached {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

struct Dnnl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  std::mutex mu;
  std::map<Key, std::unique_ptr<Cached>> cache;
};

Dnnl &State() {
  static Dnnl *d = new Dnnl();  // kept for the process: primitives outlive any caller
  return *d;
}

int Slot(ts_dtype dt) { return dt == TS_FP32 ? 0 : dt == TS_BF16 ? 1 : 2; }

memory::data_type Type(ts_dtype dt) {
  return dt == TS_BF16   ? memory::data_type::bf16
         : dt == TS_FP16 ? memory::data_type::f16
                         : memory::data_type::f32;
}

// op(X) of dims (rows, cols) inside a row-major matrix of leading dimension
// ld: X itself, or (trans) the transpose of a (cols, rows) block, in place.
memory::desc Desc(size_t rows, size_t cols, size_t ld, bool trans, ts_dtype dt) {
  memory::dims strides =
      trans ? memory::dims{1, (memory::dim)ld} : memory::dims{(memory::dim)ld, 1};
  return memory::desc({(memory::dim)rows, (memory::dim)cols}, Type(dt), strides);
}

// A primitive for one tile (m, n) of a product over K, made for one thread;
// with a bias row (1, n) of dt added in the fp32 accumulator when bias.
std::unique_ptr<Cached> Make(size_t m, size_t n, size_t K, size_t lda, size_t ldb, size_t ldc,
                             bool ta, bool tb, bool acc, ts_dtype dt, bool bias = false) {
  Dnnl &d = State();
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (acc) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  dnnl::matmul::desc md = bias ? dnnl::matmul::desc(Desc(m, K, lda, ta, dt), Desc(K, n, ldb, tb, dt),
                                                    Desc(1, n, n, false, dt),
                                                    Desc(m, n, ldc, false, dt))
                               : dnnl::matmul::desc(Desc(m, K, lda, ta, dt), Desc(K, n, ldb, tb, dt),
                                                    Desc(m, n, ldc, false, dt));
  int threads = omp_get_max_threads();
  omp_set_num_threads(1);  // oneDNN plans its partition for the threads it sees
  try {
    dnnl::matmul::primitive_desc pd(md, attr, d.eng);
    dnnl::matmul prim(pd);
    omp_set_num_threads(threads);
    return std::unique_ptr<Cached>(new Cached{pd, prim});
  } catch (...) {
    omp_set_num_threads(threads);
    throw;
  }
}

// The cached primitive of a tile shape, made on first use.
Cached *Get(const Key &k) {
  Dnnl &d = State();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.cache.find(k);
  if (it == d.cache.end()) {
    it = d.cache
             .emplace(k, Make(std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k),
                              std::get<4>(k), std::get<5>(k), std::get<6>(k), std::get<7>(k),
                              std::get<8>(k), (ts_dtype)std::get<9>(k), std::get<10>(k)))
             .first;
  }
  return it->second.get();
}

const char *Probe(ts_dtype dt) {
  if (ts_cpu_matmul_openblas()) return nullptr;
  try {
    std::unique_ptr<Cached> c = Make(64, 64, 64, 64, 64, 64, false, true, false, dt);
    std::string impl = c->pd.impl_info_str();
    // a native kernel only: not the reference loops, nor (bf16, fp16) a
    // kernel that converts to fp32 and runs the fp32 one
    bool native = dt == TS_FP32 || impl.find("f16") != std::string::npos ||  // bf16 and f16 kernels
                  impl.find("amx") != std::string::npos;
    if (impl.rfind("ref", 0) == 0 || !native) return nullptr;
    // fp32 on oneDNN's older JIT GEMM (AVX2 and below: no brgemm) is left to
    // OpenBLAS: in fixed tiles, its sgemm ran every llama-small product at
    // 0.90-1.06 of the better library call, oneDNN's tiles 0.68-1.00 (the
    // weight gradients, a transposed A, 0.68-0.78; kernels/bench_matmul
    // under ONEDNN_MAX_CPU_ISA=AVX2, docs/BENCHMARKS.md)
    if (dt == TS_FP32 && impl.rfind("gemm:jit", 0) == 0) return nullptr;
    static std::string kept[3];
    kept[Slot(dt)] = impl;
    return kept[Slot(dt)].c_str();
  } catch (const dnnl::error &) {
    return nullptr;  // no implementation for dt here
  }
}

// The tile's columns for a product of M output rows: TS_CPU_TILE_N, or twice
// that where M gives at least 8 rows of tiles (oneDNN's bf16 kernels run
// wide tiles faster, measured with kernels/bench_matmul; a product with
// fewer rows keeps narrow tiles, so that it still has several). A function
// of the shape alone.
size_t TileN(size_t M) {
  return M >= 8 * (size_t)TS_CPU_TILE_M ? 2 * (size_t)TS_CPU_TILE_N : (size_t)TS_CPU_TILE_N;
}

}  // namespace

extern "C" int ts_cpu_matmul_openblas(void) {
  static const int openblas = [] {
    const char *env = getenv("TESSERA_CPU_MATMUL");
    return env && strcmp(env, "openblas") == 0 ? 1 : 0;
  }();
  return openblas;
}

extern "C" const char *ts_cpu_dnnl_impl(ts_dtype dt) {
  if (dt != TS_FP32 && dt != TS_BF16 && dt != TS_FP16) return nullptr;
  static const char *impl[3];
  static std::once_flag once[3];
  int i = Slot(dt);
  std::call_once(once[i], [&] { impl[i] = Probe(dt); });
  return impl[i];
}

extern "C" ts_status ts_cpu_dnnl_matmul(void *C, const void *A, const void *B, const void *bias,
                                        size_t M, size_t N, size_t K, int trans_a, int trans_b,
                                        int accumulate, ts_dtype dt) {
  if (M == 0 || N == 0) return TS_OK;
  ts_cpu_tiling g = ts_cpu_tiling_of(M, N, TS_CPU_TILE_M, TileN(M));
  size_t es = ts_dtype_size(dt), lda = trans_a ? M : K, ldb = trans_b ? K : N;
  // the (at most four) tile shapes: [last row of tiles][last column of tiles]
  Cached *prim[2][2] = {};
  size_t last_m = M - (g.rows - 1) * g.tm, last_n = N - (g.cols - 1) * g.tn;
  try {
    for (int lm = 0; lm < 2; lm++)
      for (int ln = 0; ln < 2; ln++) {
        if ((!lm && g.rows == 1) || (!ln && g.cols == 1)) continue; /* no such tile */
        prim[lm][ln] = Get(Key{lm ? last_m : g.tm, ln ? last_n : g.tn, K, lda, ldb, N, !!trans_a,
                               !!trans_b, !!accumulate, (int)dt, bias != nullptr});
      }
  } catch (const dnnl::error &e) {
    return ts_set_error(TS_ERR_INTERNAL, "oneDNN matmul %zu x %zu x %zu (%s): %s (status %d)", M, N,
                        K, ts_dtype_name(dt), e.what(), (int)e.status);
  }
  ptrdiff_t tiles = (ptrdiff_t)(g.rows * g.cols);
  int failed = 0;
  std::string why;
#pragma omp parallel for schedule(static)
  for (ptrdiff_t t = 0; t < tiles; t++) {
    ts_cpu_tile x = ts_cpu_tile_at(&g, (size_t)t, trans_a, trans_b, lda, ldb, N);
    Cached *c = prim[x.i0 + x.m == M][x.j0 + x.n == N];
    const char *a = (const char *)A + x.a * es;
    const char *b = (const char *)B + x.b * es;
    char *out = (char *)C + x.c * es;
    try {
      static thread_local dnnl::stream st(State().eng);
      static thread_local std::vector<char> pad;
      size_t need = c->pd.scratchpad_desc().get_size();
      if (pad.size() < need) pad.resize(need);
      Dnnl &d = State();
      memory ma(c->pd.src_desc(), d.eng, const_cast<char *>(a));
      memory mb(c->pd.weights_desc(), d.eng, const_cast<char *>(b));
      memory mc(c->pd.dst_desc(), d.eng, out);
      memory ms(c->pd.scratchpad_desc(), d.eng, pad.data());
      std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, ma},
                                              {DNNL_ARG_WEIGHTS, mb},
                                              {DNNL_ARG_DST, mc},
                                              {DNNL_ARG_SCRATCHPAD, ms}};
      if (bias)  // the tile's columns of the bias row
        args.insert({DNNL_ARG_BIAS, memory(c->pd.bias_desc(), d.eng,
                                           const_cast<char *>((const char *)bias + x.j0 * es))});
      c->prim.execute(st, args);
      st.wait();
    } catch (const dnnl::error &e) {
#pragma omp critical(ts_dnnl_error)
      if (!failed++)
        why = std::string(e.what()) + " (status " + std::to_string((int)e.status) + ")";
    }
  }
  if (failed)
    return ts_set_error(TS_ERR_INTERNAL, "oneDNN matmul %zu x %zu x %zu (%s): %s", M, N, K,
                        ts_dtype_name(dt), why.c_str());
  return TS_OK;
}
