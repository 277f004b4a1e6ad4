// dnnl_matmul.cc — the CPU backend's bf16/fp16 products through oneDNN's
// matmul primitive (dnnl_matmul.h).
//
// Invariants:
// - One CPU engine and one in-order stream for the process; a primitive per
//   (M, N, K, layouts, dtype, accumulate), made on first use and kept, under
//   a mutex (the communication thread never computes, but the cache must
//   not care who calls).
// - Operands are wrapped in memory objects over the caller's buffers: no
//   copy, no widening, no tessera workspace.
// - oneDNN runs on the OpenMP pool (DNNL_CPU_RUNTIME_OMP) and is never
//   called from inside an OpenMP parallel region (linear.c's rule).
#include "kernels/cpu/dnnl_matmul.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>

namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using Key = std::tuple<size_t, size_t, size_t, int, int, int, int>;

struct Cached {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

struct Dnnl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream st{eng};
  std::mutex mu;
  std::map<Key, std::unique_ptr<Cached>> cache;
};

Dnnl &State() {
  static Dnnl *d = new Dnnl();  // kept for the process: primitives outlive any caller
  return *d;
}

memory::data_type Type(ts_dtype dt) {
  return dt == TS_BF16 ? memory::data_type::bf16 : memory::data_type::f16;
}

// op(X) of dims (rows, cols): X row-major, or its transpose viewed in place.
memory::desc Desc(size_t rows, size_t cols, bool trans, ts_dtype dt) {
  return memory::desc({(memory::dim)rows, (memory::dim)cols}, Type(dt), trans ? tag::ba : tag::ab);
}

std::unique_ptr<Cached> Make(size_t M, size_t N, size_t K, bool ta, bool tb, bool acc,
                             ts_dtype dt) {
  Dnnl &d = State();
  dnnl::primitive_attr attr;
  if (acc) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  dnnl::matmul::desc md(Desc(M, K, ta, dt), Desc(K, N, tb, dt), Desc(M, N, false, dt));
  dnnl::matmul::primitive_desc pd(md, attr, d.eng);
  dnnl::matmul prim(pd);
  return std::unique_ptr<Cached>(new Cached{pd, prim});
}

const char *Probe(ts_dtype dt) {
  const char *env = getenv("TESSERA_CPU_MATMUL");
  if (env && strcmp(env, "openblas") == 0) return nullptr;
  try {
    std::unique_ptr<Cached> c = Make(64, 64, 64, false, true, false, dt);
    std::string impl = c->pd.impl_info_str();
    // a native kernel only: not the reference loops, nor a kernel that
    // converts to fp32 and runs the fp32 one
    bool native = impl.find("f16") != std::string::npos ||  // bf16 and f16 kernels
                  impl.find("amx") != std::string::npos;
    if (impl.rfind("ref", 0) == 0 || !native) return nullptr;
    static std::string kept[2];
    kept[dt == TS_BF16 ? 0 : 1] = impl;
    return kept[dt == TS_BF16 ? 0 : 1].c_str();
  } catch (const dnnl::error &) {
    return nullptr;  // no implementation for dt here
  }
}

}  // namespace

extern "C" const char *ts_cpu_dnnl_impl(ts_dtype dt) {
  if (dt != TS_BF16 && dt != TS_FP16) return nullptr;
  static const char *impl[2];
  static std::once_flag once[2];
  int i = dt == TS_BF16 ? 0 : 1;
  std::call_once(once[i], [&] { impl[i] = Probe(dt); });
  return impl[i];
}

extern "C" ts_status ts_cpu_dnnl_matmul(void *C, const void *A, const void *B, size_t M, size_t N,
                                        size_t K, int trans_a, int trans_b, int accumulate,
                                        ts_dtype dt) {
  Dnnl &d = State();
  try {
    Cached *c;
    {
      std::lock_guard<std::mutex> lock(d.mu);
      Key k{M, N, K, !!trans_a, !!trans_b, !!accumulate, (int)dt};
      auto it = d.cache.find(k);
      if (it == d.cache.end())
        it = d.cache.emplace(k, Make(M, N, K, trans_a, trans_b, accumulate, dt)).first;
      c = it->second.get();
    }
    memory a(c->pd.src_desc(), d.eng, const_cast<void *>(A));
    memory b(c->pd.weights_desc(), d.eng, const_cast<void *>(B));
    memory out(c->pd.dst_desc(), d.eng, C);
    c->prim.execute(d.st, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, out}});
    d.st.wait();
    return TS_OK;
  } catch (const dnnl::error &e) {
    return ts_set_error(TS_ERR_INTERNAL, "oneDNN matmul %zu x %zu x %zu (%s): %s (status %d)", M, N,
                        K, ts_dtype_name(dt), e.what(), (int)e.status);
  }
}
