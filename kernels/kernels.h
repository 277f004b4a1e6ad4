/*
 * kernels.h — the device-neutral, dtype-aware math of one device.
 *
 * One front, several backends (DESIGN.md "Devices"; ggml's backend table):
 * every function here is implemented once in kernels/kernels.c (the
 * BERT-class encoder ops: kernels/kernels_encoder.c), which validates the
 * arguments (context, device, dtypes, pointers, aliasing, shapes,
 * workspace size) and then calls the op of ctx->device's backend table
 * (kernels/backend.h): kernels/cpu/ (OpenBLAS + OpenMP) or kernels/cuda/. A backend checks only what depends on the data (a token or
 * target out of range) or on its own limits (BLAS's int dimensions).
 *
 * Every op takes a ts_kctx (which device, which stream, which workspace),
 * then outputs, then inputs, then dimensions, then the storage dtype `dt` of
 * its activation/parameter tensors (llm.c argument order). Every pointer
 * lives on ctx->device unless its name starts with h_ (host memory).
 * Statistics that backward needs (rstd, per-row losses) are always fp32.
 * Half-precision storage (bf16/fp16) is read, widened, computed and
 * accumulated in fp32, and rounded back to storage with round-to-nearest-even.
 *
 * Shapes use B batch, T sequence, C channels, NH query heads, NKV key/value
 * heads, HS head size, I MLP width, V vocabulary, N rows (= B*T).
 * Backward rules (DESIGN.md "The unit"): parameter gradients accumulate (+=);
 * activation gradients are written (=) unless the op says otherwise.
 *
 * Scratch memory comes only from ctx->workspace (charged to the ledger's
 * workspace category by the caller); each op that needs some has a
 * *_workspace_bytes(device, ...) query returning the exact bytes it will
 * take on that device. An op whose workspace is too small returns
 * TS_ERR_OUT_OF_MEMORY, touching nothing.
 *
 * Devices: every op runs on TS_DEVICE_CPU and on TS_DEVICE_CUDA
 * (kernels/cuda/: cuBLASLt for the linear layer, cuDNN's fused attention
 * for bf16/fp16, own kernels for the rest). CUDA ops are asynchronous on
 * ctx->stream: they return once queued, and errors during execution show up
 * at the next synchronising call. Data checks (a token or target out of
 * range) are synchronous on CUDA (a flag read back) unless the caller sets
 * TS_K_INDICES_CHECKED in ctx->flags after checking them itself on the
 * host; then an out-of-range index is skipped (its row written as zeros),
 * never read or written out of bounds.
 *
 * Determinism: for a fixed input, every op's result is bitwise identical
 * whatever the number of OpenMP threads (reductions use fixed chunking),
 * except for what OpenBLAS's cblas_sgemm computes (the CPU linear layer and
 * attention products): above about 2^18 multiply-adds per call it splits
 * the product across threads, and on some CPUs (AMD EPYC, OpenBLAS 0.3)
 * the split changes the bits. At a fixed thread count results repeat.
 *
 * Status values: TS_OK; TS_ERR_INVALID_ARGUMENT for a NULL ctx, an unknown
 * dtype or device, a NULL pointer the op needs, a bad shape (odd HS,
 * NH % NKV != 0, ...) or bad data (a token or target out of range);
 * TS_ERR_OUT_OF_MEMORY for a workspace below the op's query or a failed
 * allocation; TS_ERR_UNSUPPORTED for a device the op has no body for;
 * TS_ERR_CUDA for a failed launch or CUDA call. Every such check runs before
 * any output is written.
 */
#ifndef TS_KERNELS_KERNELS_H
#define TS_KERNELS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Execution context of a kernel call. Plain descriptor; whoever filled it
 * (ts_k_context_init, or a caller building a CPU context by hand) owns the
 * workspace memory, the stream and the handles. */
typedef struct ts_kctx {
  ts_device device;       /* where every pointer argument lives */
  int device_index;       /* CUDA device ordinal (cudaSetDevice); 0 on CPU */
  void *stream;           /* cudaStream_t on TS_DEVICE_CUDA, NULL on CPU */
  void *blas;             /* cublasLtHandle_t on CUDA once an op uses it, else NULL */
  void *dnn;              /* cudnnHandle_t on CUDA: the GPU's one handle, shared by its
                             contexts and kept for the process; NULL on CPU */
  void *workspace;        /* scratch, 64-byte aligned, on `device` */
  size_t workspace_bytes; /* bytes available at `workspace` */
  unsigned flags;         /* TS_K_* bits below; 0 by default */
  void *backend_state;    /* the backend's own (CUDA: reduction scratch), NULL on CPU */
  struct ts_k_wgrad *wgrad; /* NULL: weight gradients computed at once; else the store that
                               defers them (ts_k_wgrad_new: zero-bubble pipelines' W) */
} ts_kctx;

/* ctx->flags: fp32 matrix products may use TF32 tensor cores (CUDA; 10-bit
 * mantissa products, so fp32 parity with the CPU no longer holds). */
#define TS_K_ALLOW_TF32 1u
/* ctx->flags: CUDA bf16/fp16 attention runs the plain kernels instead of
 * cuDNN's fused ones (same state, kernels/cuda/attention.cu): debugging,
 * and a check of cuDNN. */
#define TS_K_PLAIN_ATTENTION 4u
/* ctx->flags: every token and target passed to this context's ops was
 * checked by the caller (host side); CUDA skips its synchronous check. */
#define TS_K_INDICES_CHECKED 2u
/* ctx->flags: a plan context (the memory plan's device, PyTorch's meta
 * device): every op is checked exactly as on ctx->device (shapes, dtypes,
 * pointers, workspace) and then does nothing: no memory is read or written,
 * host memory included (copies to and from the host and ts_k_host_copy move
 * nothing, ts_k_check_indices reads nothing, ts_k_count_targets counts 0),
 * ts_k_synchronize and ts_k_host_wait return at once, and no backend is
 * called, so
 * its buffers may be addresses without memory (shard/ledger.h's plan
 * ledger). Queries (workspace and state bytes) answer as for ctx->device. */
#define TS_K_PLAN 8u
/* ctx->flags: a CPU context doing host work beside a device (an offloaded
 * optimizer's AdamW on host memory): its pointers are host memory, so
 * ts_k_check_host_blocks leaves them alone. */
#define TS_K_HOST_SIDE 16u
/* ctx->flags: CUDA bf16/fp16 bidirectional attention gives cuDNN its key
 * padding mask as a (B, 1, T, T) additive bias, as it did before per-row
 * key lengths (kernels/cuda/attention_bidir.cu): kept as a check of them
 * (and the path for T above 8192). Needs round_up(B*T*T*2, 256) bytes of
 * workspace beyond ts_k_attention_workspace_bytes's; with less, the plain
 * kernels run. */
#define TS_K_BIAS_ATTENTION 32u

/* Testing: on (1), every op's device pointers are checked against the host
 * blocks registered since (ts_k_host_register adds its range on any
 * device, the CPU included; ts_k_host_unregister removes it): a device
 * pointer (an argument whose name has no h_ prefix, optional outputs such
 * as ts_k_adamw's param_out included) inside one, on a context without
 * TS_K_HOST_SIDE, is refused (TS_ERR_INVALID_ARGUMENT: "ts_k_copy: dst is
 * host memory (a ts_k_host_register block): expected memory of the
 * context's device"). On the CPU, where host and device memory are one,
 * this tells them apart as a GPU would, so a CPU twin of a GPU path
 * catches a copy in the wrong direction or a device op on host state. It
 * sees only the ts_k_* ops, and one way: device memory passed as an h_
 * argument, a memcpy, or a collective on host memory go unseen. Off (0,
 * the default): nothing is recorded; turning it off forgets every range.
 * Thread-safe; the table grows as needed. */
void ts_k_check_host_blocks(int on);

/* ---- where the time goes: wall time per kind of op ------------------------- */

/* The kinds ts_k_op_times sums: matrix products (ts_k_linear_*, fp8 and
 * bias forms too), attention (every ts_k_attention_*), the optimizer
 * (ts_k_adamw), copies (casts, zeroing, the rank-order sums of the
 * transports, host/device copies are not ops and are not counted) and the
 * rest, per element or per row (norms, RoPE, SwiGLU, GELU, bias, softmax
 * cross-entropy, embeddings, adds, reductions). */
typedef enum ts_k_op_kind {
  TS_K_OPS_PRODUCTS = 0,
  TS_K_OPS_ATTENTION,
  TS_K_OPS_ELEMENTWISE,
  TS_K_OPS_OPTIMIZER,
  TS_K_OPS_COPIES,
  TS_K_OPS_KINDS,
} ts_k_op_kind;

/* "products", "attention", "elementwise", "optimizer", "copies". */
const char *ts_k_op_kind_name(ts_k_op_kind k);

/* On (1): every op that runs (checked, not a plan context) adds its wall
 * time, from the backend call to its return, to its kind's total (all
 * threads of the process together); off (0, the default) costs one load
 * per op. On a GPU an op returns once queued, so its time is the launch's,
 * not the kernel's: this is the CPU's breakdown. Thread-safe. */
void ts_k_op_times_enable(int on);
/* Whether they are summed (ts_k_op_times_enable's last value). */
int ts_k_op_timing(void);
/* seconds[TS_K_OPS_KINDS] = the totals since the last reset (or start). */
void ts_k_op_times(double *seconds);
void ts_k_op_times_reset(void);

/* ---- deferred weight gradients (zero-bubble pipelines) -------------------- */

/* A store of weight-gradient work (Megatron-LM's WeightGradStore; Qi et al.
 * 2024, "Zero Bubble Pipeline Parallelism", §2: a backward split into B,
 * the input gradient, and W, the weight gradient). While ctx->wgrad points
 * to one, the weight-gradient part of ts_k_linear_backward (dweight),
 * ts_k_rmsnorm_backward (dweight), ts_k_layernorm_backward (dweight,
 * dbias), ts_k_bias_backward and ts_k_embedding_backward is not computed:
 * the call computes its input gradient (if asked) and appends a record of
 * the rest to the store, in call order. An operand of a record that lies
 * in one of the memory's volatile ranges (a workspace, a buffer the caller
 * reuses) is copied at once into memory from mem->alloc (on the ctx's
 * device, ts_k_copy); the others are kept as pointers, which the caller
 * keeps unchanged until the store runs. ts_k_wgrad_run then runs the
 * records in order with the same ops, so every output gets the bits the
 * undivided backward gives it (each op computes its weight gradient apart
 * from its input gradient on every backend). Host bookkeeping; not
 * thread-safe. */
typedef struct ts_k_wgrad ts_k_wgrad;
enum { TS_K_WGRAD_MAX_RANGES = 8 };
typedef struct ts_k_wgrad_mem {
  /* device memory for copies of volatile operands (bytes > 0): *out, or an error */
  ts_status (*alloc)(void *user, size_t bytes, void **out);
  void (*release)(void *user, void *p); /* gives a copy back */
  void *user;
  struct {
    const void *p;
    size_t bytes;
  } ranges[TS_K_WGRAD_MAX_RANGES]; /* the volatile ranges, (n_ranges) */
  int n_ranges;
} ts_k_wgrad_mem;

/* A new empty store using mem (borrowed: it must outlive the store) into
 * *out. TS_ERR_INVALID_ARGUMENT (mem, its alloc or release NULL),
 * TS_ERR_OUT_OF_MEMORY. */
ts_status ts_k_wgrad_new(const ts_k_wgrad_mem *mem, ts_k_wgrad **out);
/* Drops the records and gives their copies back; NULL is fine. */
void ts_k_wgrad_free(ts_k_wgrad *w);
/* Runs w's records in order on ctx (its wgrad field ignored), each output
 * inside [from, from + bytes) moved to the same offset from `to` (rebase:
 * the buffer the records named may differ from the one to accumulate into;
 * from = to, or bytes = 0, moves nothing), then drops them and gives their
 * copies back. The outputs accumulate (+=) as the ops' do. Errors: the
 * ops'; on an error the records are dropped all the same. */
ts_status ts_k_wgrad_run(const ts_kctx *ctx, ts_k_wgrad *w, const void *from, size_t bytes,
                         void *to);
/* Drops the records without running them and gives their copies back. */
void ts_k_wgrad_clear(ts_k_wgrad *w);
/* Sets the store's own volatile range i (0 .. TS_K_WGRAD_CALL_RANGES - 1)
 * to [p, p + bytes), beside mem's; p NULL clears it. ts_unit_backward
 * sets the unit's dx and dy, which its backward may reuse. */
enum { TS_K_WGRAD_CALL_RANGES = 2 };
void ts_k_wgrad_volatile(ts_k_wgrad *w, int i, const void *p, size_t bytes);
/* Records held, and bytes of copies they hold. */
size_t ts_k_wgrad_pending(const ts_k_wgrad *w);
size_t ts_k_wgrad_bytes(const ts_k_wgrad *w);

/* The store's side of the fronts (kernels.c, kernels_encoder.c): append
 * one record of ctx->wgrad. kind: 0 linear (out0 dweight; in: dout, inp;
 * d: M, N, K), 1 RMSNorm (out0 dweight; in: dout, inp, rstd; d: N, C), 2
 * LayerNorm (out0 dweight, out1 dbias; in: dout, inp, mean, rstd; d: N,
 * C), 3 bias (out0 dbias; in: dout; d: N, C), 4 embedding (out0 dwte; in:
 * dout, tokens; d: N, C, V). Errors: the copies' and allocations'. */
ts_status ts_k_wgrad_record(const ts_kctx *ctx, int kind, ts_dtype dt, void *out0, void *out1,
                            const void *in0, const void *in1, const void *in2, const void *in3,
                            size_t d0, size_t d1, size_t d2);

/* ---- devices, contexts and memory --------------------------------------- */

/* Devices of kind dev this process can use: 1 for the CPU; for CUDA the
 * number of GPUs the runtime sees (0 without a driver or a GPU). */
int ts_k_device_count(ts_device dev);

/* A context on device dev (ordinal index, 0 on CPU) without workspace: on
 * CUDA it selects the GPU and creates a non-blocking stream. Release with
 * ts_k_context_destroy. TS_ERR_INVALID_ARGUMENT (unknown device, index out of
 * range), TS_ERR_CUDA. */
ts_status ts_k_context_init(ts_kctx *ctx, ts_device dev, int index);
/* What runs the matrix products (ts_k_linear_*) of dtype dt on device dev
 * in this process, for the one line a run says about it: on the CPU
 * "onednn <implementation>" where oneDNN has a native kernel for dt here
 * (e.g. "onednn brg:avx512_core" for fp32, "onednn brg:avx512_core_bf16",
 * "onednn brg:avx512_core_amx"), else "openblas sgemm" (fp32), "tessera
 * avx2 gemm" or "tessera avx512 gemm" (bf16/fp16 where AVX2 or AVX-512 is
 * the widest tier within oneDNN's cap, with FMA and F16C: tessera's own
 * product, kernels/cpu/gemm_half.c) or "openblas sgemm on fp32 copies"
 * (bf16/fp16 below AVX2);
 * "cublasLt" on CUDA.
 * TESSERA_CPU_MATMUL=openblas in the environment keeps every dtype on
 * OpenBLAS (for comparison; bf16/fp16 on the fp32 copies). A static
 * string. */
const char *ts_k_matmul_impl(ts_device dev, ts_dtype dt);

/* A context on parent's device with its own stream (CUDA: a second
 * non-blocking stream, e.g. a communication stream) and parent's flags,
 * without workspace; a plan context's fork is a plan context (no stream,
 * no backend call). Release with ts_k_context_destroy. Errors as
 * ts_k_context_init. */
ts_status ts_k_context_fork(ts_kctx *out, const ts_kctx *parent);
/* Releases what ts_k_context_init or ts_k_context_fork created (not the
 * workspace); NULL and plan contexts: no-op. */
void ts_k_context_destroy(ts_kctx *ctx);

/* Memory of GPU `index` of kind dev as the driver reports it
 * (cudaMemGetInfo): *free_bytes and *total_bytes, and its name (e.g.
 * "NVIDIA H100 80GB HBM3") in name[name_len] when name is not NULL.
 * Creates the GPU's CUDA context if it has none yet. TS_ERR_UNSUPPORTED on
 * the CPU; TS_ERR_INVALID_ARGUMENT (index out of range), TS_ERR_CUDA. */
ts_status ts_k_device_memory(ts_device dev, int index, size_t *free_bytes, size_t *total_bytes,
                             char *name, size_t name_len);

/* Waits until every op queued on ctx has finished (CPU: returns at once). */
ts_status ts_k_synchronize(const ts_kctx *ctx);

/* Allocates nbytes on device dev, 64-byte aligned and zero-filled (CUDA:
 * cudaMalloc + cudaMemset, 256-byte aligned). nbytes == 0 gives NULL.
 * TS_ERR_OUT_OF_MEMORY naming the bytes and the device, TS_ERR_CUDA. */
ts_status ts_k_alloc(ts_device dev, size_t nbytes, void **out);
/* Frees p from ts_k_alloc(dev, ...); NULL is a no-op. */
void ts_k_free(ts_device dev, void *p);

/* dst = src, nbytes bytes, both on ctx->device; the ranges must not overlap
 * unless dst == src (a no-op). Asynchronous on CUDA. */
ts_status ts_k_copy(const ts_kctx *ctx, void *dst, const void *src, size_t nbytes);
/* h_dst (host) = src (ctx->device), nbytes bytes; returns when h_dst holds
 * them (CUDA: after every op queued before it on ctx->stream). */
ts_status ts_k_to_host(const ts_kctx *ctx, void *h_dst, const void *src, size_t nbytes);
/* dst (ctx->device) = h_src (host), nbytes bytes, in ctx's stream order
 * (after every op queued before it); h_src may be reused as soon as the
 * call returns (CUDA: it waits for the copy). */
ts_status ts_k_from_host(const ts_kctx *ctx, void *dst, const void *h_src, size_t nbytes);

/* Page-locks the host range [h, h + nbytes) for the asynchronous copies of
 * ctx's device (cudaHostRegister; a no-op on the CPU and on a plan). Undo
 * with ts_k_host_unregister before freeing it. TS_ERR_INVALID_ARGUMENT,
 * TS_ERR_CUDA. */
ts_status ts_k_host_register(const ts_kctx *ctx, void *h, size_t nbytes);
/* Undoes ts_k_host_register(ctx, h, ...); NULL is a no-op. */
void ts_k_host_unregister(const ts_kctx *ctx, void *h);
/* dst (ctx->device) = h_src (host), nbytes bytes, queued in ctx's stream
 * order; returns at once (CPU: copies before returning). h_src (best
 * page-locked, ts_k_host_register) must not change until ts_k_host_wait(ctx)
 * has returned, which waits for the copies this function queued on ctx and
 * for nothing queued after them. */
ts_status ts_k_from_host_async(const ts_kctx *ctx, void *dst, const void *h_src, size_t nbytes);
ts_status ts_k_host_wait(const ts_kctx *ctx);
/* h_dst = h_src, nbytes bytes of host memory beside ctx's device (a
 * batch's staging); the two may overlap. Host work, on the calling thread. */
ts_status ts_k_host_copy(const ts_kctx *ctx, void *h_dst, const void *h_src, size_t nbytes);

/* ---- initialisation: values made on the host, the same bits on every
 * device; a plan context makes and writes nothing --------------------- */

/* out (n fp32, ctx->device) = value. TS_ERR_INVALID_ARGUMENT. */
ts_status ts_k_init_fill(const ts_kctx *ctx, float *out, size_t n, float value);
/* out (n fp32, ctx->device) = n normal(0, std^2) samples of the splitmix64
 * stream at *state (base/rng.h), which advances by 2n draws: each by
 * Box-Muller from two uniforms u = ((x >> 11) + 0.5) 2^-53 in (0, 1),
 * std sqrt(-2 ln u1) cos(2 pi u2) in double, rounded to fp32 (Box & Muller
 * 1958). Made on the host in pieces and moved to the device. A plan
 * leaves *state as it is. TS_ERR_INVALID_ARGUMENT. */
ts_status ts_k_init_normal(const ts_kctx *ctx, float *out, size_t n, double std, uint64_t *state);

/* ---- the host's side of a batch (host work; a plan context reads nothing) */

/* *count = the entries of h_targets (n, host int32) that are not
 * TS_IGNORE_INDEX: the rows a loss averages over (a plan context: 0).
 * TS_ERR_INVALID_ARGUMENT (NULL ctx or count, NULL h_targets with n > 0). */
ts_status ts_k_count_targets(const ts_kctx *ctx, size_t *count, const int32_t *h_targets, size_t n);
/* Checks n host tokens (each in [0, V)) and targets (each in [0, V) or
 * TS_IGNORE_INDEX) before a device reads them, which then need not check
 * (TS_K_INDICES_CHECKED). TS_ERR_INVALID_ARGUMENT naming the first bad
 * entry ("ts_k_check_indices: tokens[7] = 5000 is outside the vocabulary
 * [0, 4096)"). */
ts_status ts_k_check_indices(const ts_kctx *ctx, const int32_t *h_tokens, const int32_t *h_targets,
                             size_t n, size_t V);

/* Index that cross-entropy skips (Hugging Face / PyTorch convention). */
#define TS_IGNORE_INDEX (-100)

/* ---- casts and simple vector ops ---------------------------------------- */

/* out[i] = (out_dt) in[i], round-to-nearest-even on narrowing, for i < n.
 * out, in: (n) elements of out_dt / in_dt. in == out allowed only if the
 * dtypes have equal size. CPU and CUDA. */
ts_status ts_k_cast(const ts_kctx *ctx, void *out, ts_dtype out_dt, const void *in,
                    ts_dtype in_dt, size_t n);

/* Sets nbytes bytes at x to zero (memset / cudaMemsetAsync). CPU and CUDA. */
ts_status ts_k_zero(const ts_kctx *ctx, void *x, size_t nbytes);

/* out[i] = a[i] + b[i]; (n) elements of dt; out may alias a or b. */
ts_status ts_k_add(const ts_kctx *ctx, void *out, const void *a, const void *b, size_t n,
                   ts_dtype dt);

/* out[0] = sum_i x[i]^2 in double, over (n) elements of dt; out is one
 * double on ctx->device (read it with ts_k_to_host), written (=), 0 for
 * n == 0. CPU: summed in fixed 4096-element chunks, whose sums are combined
 * in an order that depends on n only (kernels/cpu/vecops.c), so the result
 * does not depend on the thread count. */
ts_status ts_k_sumsq(const ts_kctx *ctx, double *out, const void *x, size_t n, ts_dtype dt);

/* flag[0] = 1 if any of the (n) elements of x (dt) is inf or NaN, else 0;
 * flag is one int32 on ctx->device, written (=). The overflow test of fp16
 * loss scaling, per tensor. */
ts_status ts_k_nonfinite(const ts_kctx *ctx, int32_t *flag, const void *x, size_t n, ts_dtype dt);

/* The most parts one ts_k_sum_ranks call adds (CUDA passes their
 * addresses to the kernel by value: 256 x 8 bytes of its 32 KiB of
 * parameters). */
#define TS_K_SUM_RANKS_MAX 256

/* out = ((parts[0] + parts[1]) + ... + parts[n-1]) [+ out if accumulate],
 * element by element over (count) elements of dt: each element widened to
 * fp32, one fp32 addition (round to nearest even, no contraction) per part
 * in index order, the previous out added last, rounded once to dt — the
 * rank-order sum of comm/sum.h (comm.h "Determinism"), so a device gives
 * the host's bits and the bits do not depend on the thread count or on the
 * grid. parts: a host array of n pointers on ctx->device, 1 <= n <=
 * TS_K_SUM_RANKS_MAX; out may equal any part (every element is read before
 * it is written), with accumulate its previous value is the one added.
 * The device transports' reduce-scatter (comm/nccl.c). CPU and CUDA.
 * TS_ERR_INVALID_ARGUMENT (n out of range, a NULL part). */
ts_status ts_k_sum_ranks(const ts_kctx *ctx, void *out, const void *const *parts, int n,
                         size_t count, ts_dtype dt, int accumulate);

/* ---- linear layer: y = x W^T (+ b: ts_k_linear_bias_forward; nn.Linear layout) */

/* out (M, N) = inp (M, K) @ weight (N, K)^T. All dt. Products summed in
 * fp32 and rounded once to dt (bf16/fp16: CPU through oneDNN's native
 * kernel, tessera's own AVX2/AVX-512 product or sgemm on fp32 copies,
 * ts_k_matmul_impl; CUDA cuBLASLt). */
ts_status ts_k_linear_forward(const ts_kctx *ctx, void *out, const void *inp, const void *weight,
                              size_t M, size_t N, size_t K, ts_dtype dt);
/* dinp (M, K) = dout (M, N) @ weight (N, K)      (written, =; NULL skips)
 * dweight (N, K) += dout^T (N, M) @ inp (M, K)   (accumulated; NULL skips) */
ts_status ts_k_linear_backward(const ts_kctx *ctx, void *dinp, void *dweight, const void *dout,
                               const void *inp, const void *weight, size_t M, size_t N, size_t K,
                               ts_dtype dt);
/* Exact bytes of ctx->workspace either linear pass needs on device dev.
 * CPU: 0 for fp32 and for bf16/fp16 on oneDNN or tessera's own product;
 * the widened fp32 operands for bf16/fp16 on the fp32 copies. oneDNN's and
 * OpenBLAS's own buffers are the libraries' (outside the ledger), as are
 * tessera's product's packing buffers (about 0.6 MiB per thread, allocated
 * and freed within each call). */
size_t ts_k_linear_workspace_bytes(ts_device dev, size_t M, size_t N, size_t K, ts_dtype dt);

/* nn.Linear with its bias in one op (torch.nn.functional.linear; CUDA:
 * cuBLASLt's CUBLASLT_EPILOGUE_BIAS):
 *   out (M, N) = inp (M, K) @ weight (N, K)^T + bias (N) on every row
 * All dt on ctx->device. Each output is its K products summed in fp32 (as
 * ts_k_linear_forward sums them), plus the widened bias[n] in fp32,
 * rounded ONCE to dt; ts_k_linear_forward then ts_k_bias_add round the
 * product to dt, then the sum again. So bf16/fp16 differ from those two
 * calls (by one rounding fewer); fp32 has no rounding to dt, and on the
 * CPU gives their bits exactly (the fp32 sum, then one fp32 addition);
 * CUDA fp32 keeps the bound, not the bits (the epilogue's algorithm need
 * not be the bias-free product's). K == 0: out = 0 + bias on every row
 * (inp and weight not read). out may not alias inp, weight or bias
 * (TS_ERR_INVALID_ARGUMENT), and must not overlap them. Needs
 * ts_k_linear_bias_workspace_bytes(ctx->device, M, N, K, dt) bytes of
 * workspace (else TS_ERR_OUT_OF_MEMORY, nothing written).
 * CPU: where oneDNN runs dt (ts_k_matmul_impl) its matmul adds the bias
 * in its fp32 accumulator before the one rounding; so does tessera's own
 * product (bf16/fp16 elsewhere from AVX2 up); elsewhere still the fp32 sgemm, then
 * (bf16/fp16: on the fp32 copies, before narrowing) the bias added in
 * fp32. Fixed tiles either way: the same bits at any thread
 * count. CUDA: one cublasLtMatmul with the bias epilogue, bias of D's
 * type; a bias under 16-byte alignment (a tensor at an odd offset in a
 * flat buffer, where cuBLASLt's heuristic may still pick a kernel that
 * assumes 16) is first copied to a 256-byte-aligned slot of the
 * workspace, so every call rounds once. TS_K_ALLOW_TF32 applies as to
 * ts_k_linear_forward. Errors: those of ts_k_linear_forward. */
ts_status ts_k_linear_bias_forward(const ts_kctx *ctx, void *out, const void *inp,
                                   const void *weight, const void *bias, size_t M, size_t N,
                                   size_t K, ts_dtype dt);
/* Exact bytes of ctx->workspace ts_k_linear_bias_forward needs on device
 * dev: on the CPU ts_k_linear_workspace_bytes's (the fp32 copies' product
 * takes the bias in place); on CUDA that plus N elements of dt (the
 * slot for a misaligned bias). */
size_t ts_k_linear_bias_workspace_bytes(ts_device dev, size_t M, size_t N, size_t K,
                                        ts_dtype dt);

/* ---- token embedding ------------------------------------------------------ */

/* out (N, C) = wte[tokens[n]] for n < N; wte (V, C). A token outside [0, V)
 * returns TS_ERR_INVALID_ARGUMENT naming the position and the token. */
ts_status ts_k_embedding_forward(const ts_kctx *ctx, void *out, const int32_t *tokens,
                                 const void *wte, size_t N, size_t C, size_t V, ts_dtype dt);
/* dwte (V, C) += scatter of dout (N, C) by tokens (N) (accumulated): the
 * gradient of the lookup above (torch.nn.functional.embedding backward,
 * a scatter-add over rows). dwte and dout are dt; tokens int32; all on
 * ctx->device. dwte may not alias dout.
 * fp32: dwte[tokens[n], c] += dout[n, c] one addition at a time, n = 0..N-1.
 * bf16/fp16 (kernels.h: accumulate in fp32): for each row v, the dout rows
 * of its positions are summed in fp32 in position order, then
 *   dwte[v, c] = round(dwte[v, c] + sum)   (one RNE rounding per call).
 * Needs ts_k_embedding_workspace_bytes(ctx->device, N, dt) bytes of
 * ctx->workspace.
 * Results do not depend on the thread count (no atomics).
 * CUDA: without atomics (positions sorted by token in the workspace by
 * CUB's radix sort: kernels/cuda/embedding.cu); a token at fewer than 64
 * positions gets the same sums in the same order; one at 64 or more sums
 * 32 fixed slices of its positions in fp32, then the slice sums in order,
 * then adds to dwte once: the same bits run after run, within (L + 1) fp32 roundings of the
 * CPU's for a token at L positions, not equal to them.
 * Returns TS_ERR_INVALID_ARGUMENT for a token outside [0, V) (naming the
 * position and the token), a NULL pointer, or N > INT32_MAX with bf16/fp16
 * (CUDA: any dtype); TS_ERR_OUT_OF_MEMORY, naming the bytes needed, for a
 * smaller workspace. On any error dwte is untouched. */
ts_status ts_k_embedding_backward(const ts_kctx *ctx, void *dwte, const void *dout,
                                  const int32_t *tokens, size_t N, size_t C, size_t V,
                                  ts_dtype dt);
/* Exact bytes of ctx->workspace embedding backward needs for N positions
 * on device dev. CPU: 0 for fp32 (and for forward, whatever dt); for
 * bf16/fp16 two 64-byte-aligned buffers of N int32 (the positions, stably
 * sorted by token, and the merge sort's second buffer). CUDA, every dt:
 * two 64-byte-aligned buffers of N uint64 sort keys (token, position) and
 * CUB's radix-sort scratch for N 64-bit keys on the most demanding GPU
 * architecture the build carries (kernels/cuda/embedding.cu; no GPU
 * needed to ask). Independent of C and V. */
size_t ts_k_embedding_workspace_bytes(ts_device dev, size_t N, ts_dtype dt);

/* ---- RMSNorm (Zhang & Sennrich 2019, eq. 4; Hugging Face LlamaRMSNorm) ---- */

/* rstd (N) fp32 = 1 / sqrt(mean_c inp^2 + eps);
 * out (N, C) = weight (C) * (inp * rstd). out may not alias inp. */
ts_status ts_k_rmsnorm_forward(const ts_kctx *ctx, void *out, float *rstd, const void *inp,
                               const void *weight, size_t N, size_t C, float eps, ts_dtype dt);
/* dinp (N, C) += d/dinp   (ACCUMULATED, so residual streams add for free)
 * dweight (C) += d/dweight (accumulated). Needs
 * ts_k_rmsnorm_workspace_bytes(ctx->device, N, C, dt) bytes of workspace. */
ts_status ts_k_rmsnorm_backward(const ts_kctx *ctx, void *dinp, void *dweight, const void *dout,
                                const void *inp, const void *weight, const float *rstd, size_t N,
                                size_t C, ts_dtype dt);
/* Exact bytes of ctx->workspace RMSNorm backward needs on device dev. CPU:
 * 0. CUDA: dweight's fp32 partial sums, one (C) row per fixed block of rows
 * (kernels/cuda/layers.cu), summed in row-block order. */
size_t ts_k_rmsnorm_workspace_bytes(ts_device dev, size_t N, size_t C, ts_dtype dt);

/* A residual add and the RMSNorm after it in one op (Hugging Face
 * LlamaDecoderLayer: the mid-block residual, then post_attention_layernorm):
 *   res (N, C) = a + b          each element an fp32 sum rounded once to dt
 *   rstd (N) fp32, out (N, C)   = ts_k_rmsnorm_forward of res (weight (C))
 * Bit for bit ts_k_add(ctx, res, a, b, N * C, dt) followed by
 * ts_k_rmsnorm_forward(ctx, out, rstd, res, weight, N, C, eps, dt) on the
 * same device: the CPU runs those two bodies in turn; CUDA runs one kernel
 * (a block per row) that reads a and b once, stores res and takes the
 * statistics from the rounded res in the unfused kernel's order.
 * out, res, a, b (N, C) and weight (C): dt on ctx->device; rstd written
 * (=). res may alias a or b (each element is read before it is written: a
 * residual stream updated in place); out may not alias res, a or b
 * (TS_ERR_INVALID_ARGUMENT); other pairs must not overlap. No workspace.
 * N == 0 does nothing; C == 0 with N > 0 is TS_ERR_INVALID_ARGUMENT. CPU
 * and CUDA. */
ts_status ts_k_add_rmsnorm_forward(const ts_kctx *ctx, void *out, float *rstd, void *res,
                                   const void *a, const void *b, const void *weight, size_t N,
                                   size_t C, float eps, ts_dtype dt);

/* ---- rotary position embedding (Su et al. 2021; HF rotate-half layout) ---- */

/* The largest head size RoPE takes, on every device (the CPU keeps one
 * row's angles on the stack, CUDA passes HS/2 frequencies by value). */
#define TS_K_ROPE_MAX_HS 2048

/* For x (B, T, H, HS), position t, i < HS/2, f_i = theta^(-2i/HS) (computed
 * in fp32 as Hugging Face does), a = t * f_i:
 *   out[i]      = x[i] cos a - x[i + HS/2] sin a
 *   out[i+HS/2] = x[i + HS/2] cos a + x[i] sin a
 * In place allowed (out == x). HS must be even. */
ts_status ts_k_rope_forward(const ts_kctx *ctx, void *out, const void *x, size_t B, size_t T,
                            size_t H, size_t HS, float theta, ts_dtype dt);
/* dx = R^T dout (the inverse rotation). Written (=); in place allowed. */
ts_status ts_k_rope_backward(const ts_kctx *ctx, void *dx, const void *dout, size_t B, size_t T,
                             size_t H, size_t HS, float theta, ts_dtype dt);

/* ---- causal grouped-query attention (Vaswani et al. 2017 eq. 1; GQA:
 * Ainslie et al. 2023 — query head h reads kv head h / (NH / NKV)) -------- */

/* P = softmax(q k^T / sqrt(HS) + causal mask), rows over keys;
 * out (B, T, NH, HS) = P @ v.
 * q (B, T, NH, HS), k and v (B, T, NKV, HS). NH % NKV == 0.
 * state: what backward needs besides the inputs, written (=), of
 * ts_k_attention_state_bytes(ctx->device, ...) bytes on ctx->device:
 *   CPU (every dt) and CUDA bf16/fp16: the log-sum-exp of each softmax row
 *     (B, NH, T) fp32 (fused flash attention, Dao et al. 2022, keeps no P:
 *     cuDNN's on CUDA, kernels/cpu/attention.c's on the CPU), followed by
 *     (B, T) uint8 key flags that only the bidirectional op below writes
 *     and reads (its key padding mask, which its backward needs to
 *     recompute P);
 *   CUDA fp32: the probabilities P (B, NH, T, T), entries above the
 *     diagonal 0. */
ts_status ts_k_attention_forward(const ts_kctx *ctx, void *out, void *state, const void *q,
                                 const void *k, const void *v, size_t B, size_t T, size_t NH,
                                 size_t NKV, size_t HS, ts_dtype dt);
/* dq (B, T, NH, HS), dk, dv (B, T, NKV, HS): all written (=). out and state
 * are the forward's outputs for these q, k, v (the fused backwards read out
 * for D = rowsum(dout * out), FlashAttention-2's Algorithm 2: cuDNN's
 * always, the CPU's for query blocks whose keys span more than one 128-key
 * block, kernels/cpu/attention.c; CUDA fp32 reads only state). */
ts_status ts_k_attention_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                  const void *dout, const void *out, const void *q, const void *k,
                                  const void *v, const void *state, size_t B, size_t T, size_t NH,
                                  size_t NKV, size_t HS, ts_dtype dt);
/* Exact bytes of the forward's saved state on device dev (see above; also
 * that of ts_k_attention_bidir_forward with NKV = NH). */
size_t ts_k_attention_state_bytes(ts_device dev, size_t B, size_t T, size_t NH, size_t NKV,
                                  size_t HS, ts_dtype dt);
/* The dtype in which the attention forward on ctx (its device and flags)
 * holds the probabilities P when it forms P @ v, for storage dtype dt;
 * bidirectional != 0: ts_k_attention_bidir_forward. TS_FP32 where P stays
 * fp32 (the CPU, whose fused kernel keeps P and dS in fp32; CUDA fp32;
 * CUDA's plain kernels and TS_K_PLAIN_ATTENTION); dt where cuDNN's fused kernel
 * feeds P to its tensor cores in dt (CUDA bf16/fp16, causal and
 * bidirectional; FlashAttention-2, Dao 2023, Algorithm 1: P~ is cast to the
 * input type for P~ V). An upper bound: a shape cuDNN refuses runs the
 * plain kernels, with P in fp32. A property of the algorithm, for error
 * bounds: each term of out carries one more rounding of this dtype.
 * *out on the host. TS_ERR_INVALID_ARGUMENT (NULL ctx or out, unknown device
 * or dtype). */
ts_status ts_k_attention_probs_dtype(const ts_kctx *ctx, ts_dtype dt, int bidirectional,
                                     ts_dtype *out);
/* Exact bytes of ctx->workspace the larger attention pass needs on device
 * dev (both passes check against it). CPU: none for fp32 (its blocks live
 * on the stack); bf16/fp16 a chunk of batch rows' operands (and backward
 * their out, dout and gradients) widened to fp32, as many rows as fit 8 MiB
 * (at least one, at most B). CUDA fp32: one batch row's
 * (NH, T, T) fp32 dS; CUDA
 * bf16/fp16: round_up(9 B, 256) bytes (the bidirectional op's per-row key
 * lengths) plus the larger of cuDNN's bound (kernels/cuda/attention_cudnn.h)
 * and one kv group's plain scratch, 2 (NH/NKV) T^2 fp32; T above 8192:
 * cuDNN's bound plus the bidirectional op's (B, 1, T, T) 2-byte bias
 * rounded up to 256 (kernels/cuda/attention.cu, attention_bidir.cu). */
size_t ts_k_attention_workspace_bytes(ts_device dev, size_t B, size_t T, size_t NH, size_t NKV,
                                      size_t HS, ts_dtype dt);

/* ---- decoding with a key/value cache (one sequence, B = 1) ---------------- */

/* ts_k_rope_forward of x (T, H, HS) at positions pos0 .. pos0 + T - 1
 * instead of 0 .. T - 1: the same angles, bit for bit, as the training op
 * gives row pos0 + t of a longer sequence (the new queries and keys of a
 * decoding step). In place allowed. HS even, at most TS_K_ROPE_MAX_HS;
 * theta > 0 (TS_ERR_INVALID_ARGUMENT). */
ts_status ts_k_rope_forward_at(const ts_kctx *ctx, void *out, const void *x, size_t T,
                               size_t pos0, size_t H, size_t HS, float theta, ts_dtype dt);
/* Causal GQA attention of T new queries at positions pos0 .. pos0 + T - 1
 * over the cached keys and values of positions 0 .. pos0 + T - 1 (the new
 * ones already written at rows pos0 ..): out, q (T, NH, HS); k, v
 * (pos0 + T, NKV, HS), rows past pos0 + T - 1 never read. Query t sees
 * keys 0 .. pos0 + t. The math of ts_k_attention_forward's row pos0 + t
 * (fp32 scores, softmax and sums, one rounding to dt), without its state:
 * nothing is kept for a backward. No workspace. NKV >= 1 dividing NH,
 * HS >= 1 (TS_ERR_INVALID_ARGUMENT); CUDA: pos0 + T at most 8192
 * (TS_ERR_UNSUPPORTED). out may not alias q. */
ts_status ts_k_attention_cached(const ts_kctx *ctx, void *out, const void *q, const void *k,
                                const void *v, size_t T, size_t pos0, size_t NH, size_t NKV,
                                size_t HS, ts_dtype dt);

/* ---- SwiGLU (Shazeer 2020, eq. 6): h = silu(gate) * up ------------------- */

/* h, gate, up: (n) elements of dt. h may not alias gate or up. */
ts_status ts_k_swiglu_forward(const ts_kctx *ctx, void *h, const void *gate, const void *up,
                              size_t n, ts_dtype dt);
/* dgate, dup (n): written (=). */
ts_status ts_k_swiglu_backward(const ts_kctx *ctx, void *dgate, void *dup, const void *dh,
                               const void *gate, const void *up, size_t n, ts_dtype dt);

/* ---- softmax cross-entropy (PyTorch F.cross_entropy, ignore_index -100) -- */

/* loss_rows (N) fp32 = -log softmax(logits[n])[targets[n]], or 0 where
 * targets[n] == TS_IGNORE_INDEX. logits (N, V). A target outside [0, V) and
 * not -100 returns TS_ERR_INVALID_ARGUMENT naming the row and the value. */
ts_status ts_k_cross_entropy_forward(const ts_kctx *ctx, float *loss_rows, const void *logits,
                                     const int32_t *targets, size_t N, size_t V, ts_dtype dt);
/* out[0] = sum of loss_rows[n] over the rows whose target is not -100, in
 * double (CPU: added in row order n = 0 .. N-1; CUDA: a fixed tree, so
 * repeatable but not the CPU's bits); out[1] = the number of those
 * rows. out: two doubles on ctx->device, written (=) — the micro-batch's
 * loss as the sum and count of PyTorch's mean reduction. */
ts_status ts_k_loss_sum(const ts_kctx *ctx, double *out, const float *loss_rows,
                        const int32_t *targets, size_t N);
/* dlogits (N, V) = dloss * (softmax(logits[n]) - onehot(targets[n])) for
 * rows with a target, 0 for ignored rows. Written (=); in place allowed
 * (dlogits == logits). dloss is the gradient of the reduced loss w.r.t. each
 * row's loss (1/count for a mean). */
ts_status ts_k_cross_entropy_backward(const ts_kctx *ctx, void *dlogits, const void *logits,
                                      const int32_t *targets, size_t N, size_t V, float dloss,
                                      ts_dtype dt);

/* Both of the above in one pass over the logits (what a training step
 * needs: the head's backward then starts from dlogits):
 *   loss_rows (N) fp32 = ts_k_cross_entropy_forward's, and
 *   dlogits (N, V) = ts_k_cross_entropy_backward's, written (=);
 * dlogits may alias logits (each row's statistics are taken before any of
 * it is overwritten). Bit for bit the two separate calls' results on every
 * backend. */
ts_status ts_k_cross_entropy_fused(const ts_kctx *ctx, float *loss_rows, void *dlogits,
                                   const void *logits, const int32_t *targets, size_t N, size_t V,
                                   float dloss, ts_dtype dt);

/* ---- BERT-class encoder ops (Devlin et al. 2019; Hugging Face modeling_bert) -- */

/* LayerNorm (Ba et al. 2016, eq. 4; torch.nn.LayerNorm, biased variance):
 *   mean (N) fp32 = mean_c inp;  rstd (N) fp32 = 1 / sqrt(mean_c (inp - mean)^2 + eps)
 *   out (N, C) = (inp - mean) * rstd * weight (C) + bias (C)
 * Statistics in fp32 from the widened input (two passes: mean, then the
 * centred sum of squares). out, inp (N, C), weight, bias (C): dt; mean and
 * rstd written (=). out may not alias inp. C == 0 with N > 0 is
 * TS_ERR_INVALID_ARGUMENT (an empty row has no mean). CPU and CUDA. */
ts_status ts_k_layernorm_forward(const ts_kctx *ctx, void *out, float *mean, float *rstd,
                                 const void *inp, const void *weight, const void *bias, size_t N,
                                 size_t C, float eps, ts_dtype dt);
/* With xhat = (inp - mean) * rstd, g = dout * weight:
 *   dinp (N, C)  += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))   (ACCUMULATED, as RMSNorm)
 *   dweight (C)  += sum_n dout * xhat;  dbias (C) += sum_n dout          (accumulated)
 * dout, inp, dinp (N, C), weight, dweight, dbias (C): dt; mean, rstd (N)
 * fp32 from the forward. dinp, dweight, dbias: each NULL skips (weight is
 * read only for dinp). dweight and dbias are summed over rows in fp32 in a
 * fixed order (row blocks of a size independent of the thread count), then
 * rounded once into dt. Needs ts_k_layernorm_workspace_bytes(ctx->device,
 * N, C, dt) bytes of workspace (else TS_ERR_OUT_OF_MEMORY). dinp may not
 * alias dout or inp, nor dweight dbias (TS_ERR_INVALID_ARGUMENT). */
ts_status ts_k_layernorm_backward(const ts_kctx *ctx, void *dinp, void *dweight, void *dbias,
                                  const void *dout, const void *inp, const void *weight,
                                  const float *mean, const float *rstd, size_t N, size_t C,
                                  ts_dtype dt);
/* Exact bytes of ctx->workspace LayerNorm backward needs on device dev: the
 * fp32 partial sums of dweight and dbias, one (2, C) row per fixed block of
 * rows (kernels/cpu/layernorm.c, kernels/cuda/layers.cu); 0 when N or C
 * is 0. */
size_t ts_k_layernorm_workspace_bytes(ts_device dev, size_t N, size_t C, ts_dtype dt);

/* A residual add and the LayerNorm after it in one op (Hugging Face
 * BertSelfOutput and BertOutput: LayerNorm(hidden + input_tensor)):
 *   res (N, C) = a + b                each element an fp32 sum rounded once to dt
 *   mean, rstd (N) fp32, out (N, C)   = ts_k_layernorm_forward of res
 *                                       (weight, bias (C))
 * Bit for bit ts_k_add(ctx, res, a, b, N * C, dt) followed by
 * ts_k_layernorm_forward(ctx, out, mean, rstd, res, weight, bias, N, C,
 * eps, dt) on the same device: the CPU runs those two bodies in turn; CUDA
 * runs one kernel (a block per row) that reads a and b once, stores res
 * and takes both passes' statistics from the rounded res in the unfused
 * kernel's order. out, res, a, b (N, C), weight and bias (C): dt on
 * ctx->device; mean and rstd written (=). res may alias a or b (in place);
 * out may not alias res, a or b (TS_ERR_INVALID_ARGUMENT); other pairs
 * must not overlap. No workspace. N == 0 does nothing; C == 0 with N > 0
 * is TS_ERR_INVALID_ARGUMENT. CPU and CUDA. */
ts_status ts_k_add_layernorm_forward(const ts_kctx *ctx, void *out, float *mean, float *rstd,
                                     void *res, const void *a, const void *b, const void *weight,
                                     const void *bias, size_t N, size_t C, float eps, ts_dtype dt);

/* Which GELU (Hendrycks & Gimpel 2016): Hugging Face hidden_act "gelu" or
 * "gelu_new". */
typedef enum ts_gelu_kind {
  TS_GELU_ERF = 0,  /* x/2 (1 + erf(x / sqrt 2))                      torch GELU() */
  TS_GELU_TANH = 1, /* x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  GELU(approximate="tanh") */
} ts_gelu_kind;

/* out (n) = gelu(inp), both dt; out may alias inp. Per element in fp32 in
 * PyTorch's operation order (kernels/elementwise.h, ts_gelu_erf and
 * ts_gelu_tanh), one rounding to dt. An unknown kind is
 * TS_ERR_INVALID_ARGUMENT. CPU and CUDA. */
ts_status ts_k_gelu_forward(const ts_kctx *ctx, void *out, const void *inp, size_t n,
                            ts_gelu_kind kind, ts_dtype dt);
/* dinp (n) = dout * gelu'(inp) (torch's GeluBackward), written (=); all
 * dt. dinp may alias dout or inp (each element is read before it is
 * written). */
ts_status ts_k_gelu_backward(const ts_kctx *ctx, void *dinp, const void *dout, const void *inp,
                             size_t n, ts_gelu_kind kind, ts_dtype dt);

/* out (N, C) += bias (C) on every row, in place (nn.Linear's bias; with
 * N = B and C = T*C' it adds learned absolute position embeddings rows
 * 0..T-1 to every sequence). One rounding per element. out may not alias
 * bias. */
ts_status ts_k_bias_add(const ts_kctx *ctx, void *out, const void *bias, size_t N, size_t C,
                        ts_dtype dt);
/* dbias (C) += sum_n dout (N, C): the gradient of the above (accumulated).
 * Summed in fp32 over rows in a fixed order (row blocks of a size that
 * does not depend on the thread count), then one rounding into dbias. Needs
 * ts_k_bias_workspace_bytes(ctx->device, N, C, dt) bytes of workspace
 * (else TS_ERR_OUT_OF_MEMORY). dbias may not alias dout. */
ts_status ts_k_bias_backward(const ts_kctx *ctx, void *dbias, const void *dout, size_t N,
                             size_t C, ts_dtype dt);
/* Exact bytes of ctx->workspace bias backward needs on device dev: fp32
 * partial sums, one (C) row per fixed block of rows; 0 when N or C is 0. */
size_t ts_k_bias_workspace_bytes(ts_device dev, size_t N, size_t C, ts_dtype dt);

/* types (B, T) int32 = the number of sep_id tokens strictly before each
 * position of its row, capped at n_types - 1: the token type ids of
 * Hugging Face's sentence-pair encoding ([CLS] A [SEP] -> 0, B [SEP] -> 1).
 * sep_id < 0: all zeros. tokens (B, T) int32 on ctx->device; types may
 * not alias tokens. n_types outside [1, INT32_MAX] is
 * TS_ERR_INVALID_ARGUMENT. CPU and CUDA. */
ts_status ts_k_token_types(const ts_kctx *ctx, int32_t *types, const int32_t *tokens, size_t B,
                           size_t T, int32_t sep_id, size_t n_types);

/* Bidirectional multi-head attention with a key padding mask (Vaswani et
 * al. 2017 eq. 1; Hugging Face BertSelfAttention): for batch row b,
 *   P = softmax(q k^T / sqrt(HS)) over the keys j with ids[b, j] != pad_id
 *   (masked keys get probability exactly 0, as HF's additive finfo.min mask
 *   gives in fp32); out (B, T, NH, HS) = P @ v. Query rows at padded
 *   positions are computed like any other (HF does the same).
 * q, k, v, out (B, T, NH, HS) dt; ids (B, T) int32 on ctx->device; pad_id
 * < 0 masks nothing (ids is then not read and may be NULL). out may not
 * alias q, k or v. A batch row whose keys are all masked returns
 * TS_ERR_INVALID_ARGUMENT naming the row, before anything is written
 * (synchronous on CUDA unless TS_K_INDICES_CHECKED; then such a row's
 * output is undefined). state: ts_k_attention_state_bytes(ctx->device, B,
 * T, NH, NH, HS, dt) bytes, written (=): on the CPU (every dt) and CUDA
 * bf16/fp16 each row's log-sum-exp and the key flags (see the causal op);
 * CUDA fp32: the probabilities P (B, NH, T, T), masked entries 0.
 * Workspace as the backward's. Masked keys' q, k, v values do not change
 * out (as long as they are finite). CUDA bf16/fp16 (both passes): cuDNN's
 * fused kernels with each row's key count as its key length where the
 * row's padding is a suffix (ids[b, j] == pad_id exactly for j >= the
 * count), and the plain kernels' math for the other rows, chosen on the
 * device without a host sync (kernels/cuda/attention_bidir.cu). */
ts_status ts_k_attention_bidir_forward(const ts_kctx *ctx, void *out, void *state, const void *q,
                                       const void *k, const void *v, const int32_t *ids,
                                       int32_t pad_id, size_t B, size_t T, size_t NH, size_t HS,
                                       ts_dtype dt);
/* dq, dk, dv (B, T, NH, HS): written (=), from the forward's state (masked
 * keys get dk = dv = 0 from every query). dout, out, q, k, v, state: the
 * forward's (CUDA fp32 reads only q, k, v, dout and state). dq, dk, dv may
 * not alias each other nor an input. Workspace: the causal op's
 * ts_k_attention_workspace_bytes(ctx->device, B, T, NH, NH, HS, dt). */
ts_status ts_k_attention_bidir_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                        const void *dout, const void *out, const void *q,
                                        const void *k, const void *v, const void *state,
                                        size_t B, size_t T, size_t NH, size_t HS, ts_dtype dt);

/* ---- AdamW (Loshchilov & Hutter 2019, Algorithm 2; torch.optim.AdamW's formula,
 * not its bits: 1 - beta is rounded in fp32 here, and the step size
 * multiplies the quotient; see kernels/elementwise.h ts_adamw_element) */

typedef struct ts_adamw_hparams {
  float lr;           /* learning rate of this step */
  float beta1;        /* first-moment decay, e.g. 0.9 */
  float beta2;        /* second-moment decay, e.g. 0.95 */
  float eps;          /* added to sqrt(v_hat), e.g. 1e-8 */
  float weight_decay; /* decoupled decay; 0 for tensors that take none */
  int step;           /* 1-based step number t, for bias correction */
  float grad_scale;   /* gradient multiplier applied first (clip, 1/loss scale) */
} ts_adamw_hparams;

/* For i < n, with g = grad_scale * grad[i]:
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   master *= 1 - lr wd;  master -= (lr / (1-b1^t)) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
 *   if param_out != NULL: param_out[i] = (param_dt) master[i]   (RNE)
 * master, m, v: (n) fp32, updated in place. grad: (n) grad_dt.
 * param_out may alias master when param_dt is fp32. hp is host memory, read
 * before the call returns. CPU and CUDA. */
ts_status ts_k_adamw(const ts_kctx *ctx, float *master, void *param_out, ts_dtype param_dt,
                     float *m, float *v, const void *grad, ts_dtype grad_dt, size_t n,
                     const ts_adamw_hparams *hp);

#ifdef __cplusplus
}
#endif

/* The fp8 linear layer (ts_fp8_scaling, ts_k_fp8_quantize,
 * ts_k_linear_fp8_*) has its own header, included here so that this one
 * still declares the whole device API. */
#include "kernels/kernels_fp8.h"

#endif /* TS_KERNELS_KERNELS_H */
