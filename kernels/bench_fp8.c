/*
 * bench_fp8.c — where a llama block's linear layers spend their time in
 * bf16 and with fp8 products (--fp8 tensorwise and rowwise), one device, the
 * bf16 products as the baseline in the same run. The shapes are
 * llama-1.1b's projections (hidden 2048, intermediate 5632, 4 kv heads of
 * 64): q and o (N 2048, K 2048), k and v (256, 2048), gate and up (5632,
 * 2048), down (2048, 5632), each on M rows (tokens).
 *
 * Usage: bench_fp8 [--device cpu|cuda] [M] [REPS]
 *   M     rows of every product, a multiple of 16 (cuBLASLt's fp8 layout;
 *         default 16384, llama-1.1b's micro-batch 8 x seq 2048)
 *   REPS  timed calls per figure after one untimed call (default 10)
 * Output: a Markdown table, one row per shape: ms per call of the bf16
 * forward (ts_k_linear_forward) and backward (ts_k_linear_backward, dinp
 * and dweight), the same with fp8 products (ts_k_linear_fp8_*, each cast
 * included) per scaling, and the casts alone (ts_k_fp8_quantize of the
 * input, as the forward casts it and transposed, as the backward's dweight
 * does; tensorwise); then one row per block: the seven projections summed,
 * forward + backward, and fp8's ratio to bf16. A figure is the wall time of
 * REPS calls over REPS, the device synchronized before and after (launches
 * included). A pass that fails (rowwise where cuBLASLt refuses it, say)
 * prints "failed" in its cell and its error below the table; exit 1 then.
 * Operands: bf16 values from a fixed generator (uniform, x in [-1, 1),
 * weights in [-0.05, 0.05), gradients in [-1e-3, 1e-3)).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/floats.h"
#include "kernels/kernels.h"

enum { SHAPES = 4, PASSES = 8 };

typedef struct {
  const char *name;
  size_t N, K, count; /* count: projections of this shape in one block */
} shape;

static const shape kShapes[SHAPES] = {
    {"q, o", 2048, 2048, 2}, {"k, v", 256, 2048, 2}, {"gate, up", 5632, 2048, 2},
    {"down", 2048, 5632, 1}};

/* The passes timed per shape, in the table's column order. */
typedef enum {
  BF16_FWD, BF16_BWD, TW_FWD, TW_BWD, RW_FWD, RW_BWD, CAST, CAST_T
} pass;
static const char *kPassName[PASSES] = {"bf16 fwd",    "bf16 bwd",    "fp8 tensorwise fwd",
                                        "tensorwise bwd", "fp8 rowwise fwd", "rowwise bwd",
                                        "cast x",      "cast x^T"};

typedef struct {
  ts_kctx *ctx;
  size_t M, N, K;
  void *x, *w, *out, *dout, *dinp, *dw, *codes;
  float *scales;
} operands;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static ts_status run_pass(const operands *o, pass p) {
  switch (p) {
    case BF16_FWD: return ts_k_linear_forward(o->ctx, o->out, o->x, o->w, o->M, o->N, o->K, TS_BF16);
    case BF16_BWD:
      return ts_k_linear_backward(o->ctx, o->dinp, o->dw, o->dout, o->x, o->w, o->M, o->N, o->K,
                                  TS_BF16);
    case TW_FWD:
    case RW_FWD:
      return ts_k_linear_fp8_forward(o->ctx, o->out, o->x, o->w, o->M, o->N, o->K,
                                     p == TW_FWD ? TS_FP8_TENSORWISE : TS_FP8_ROWWISE, TS_BF16);
    case TW_BWD:
    case RW_BWD:
      return ts_k_linear_fp8_backward(o->ctx, o->dinp, o->dw, o->dout, o->x, o->w, o->M, o->N,
                                      o->K, p == TW_BWD ? TS_FP8_TENSORWISE : TS_FP8_ROWWISE,
                                      TS_BF16);
    case CAST:
    case CAST_T:
      return ts_k_fp8_quantize(o->ctx, o->codes, o->scales, o->x, o->M, o->K, p == CAST_T,
                               TS_FP8_E4M3, TS_FP8_TENSORWISE, TS_BF16);
  }
  return TS_ERR_INVALID_ARGUMENT;
}

/* ms per call of pass p over reps calls after one untimed; < 0 on error
 * (its message into err). */
static double time_pass(const operands *o, pass p, int reps, char *err, size_t err_len) {
  ts_status st = run_pass(o, p);
  if (st == TS_OK) st = ts_k_synchronize(o->ctx);
  double t0 = now_s();
  for (int r = 0; r < reps && st == TS_OK; r++) st = run_pass(o, p);
  if (st == TS_OK) st = ts_k_synchronize(o->ctx);
  if (st != TS_OK) {
    snprintf(err, err_len, "%s", ts_last_error());
    return -1.0;
  }
  return (now_s() - t0) / reps * 1e3;
}

/* n bf16 values, uniform in [-a, a), from *state (a 64-bit LCG). */
static void fill(uint16_t *h, size_t n, float a, uint64_t *state) {
  for (size_t i = 0; i < n; i++) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    float u = (float)(*state >> 40) / (float)(1u << 24); /* [0, 1) */
    h[i] = ts_f32_to_bf16((2.0f * u - 1.0f) * a);
  }
}

static int usage(const char *why) {
  fprintf(stderr, "bench_fp8: %s\nusage: bench_fp8 [--device cpu|cuda] [M] [REPS]\n", why);
  return 2;
}

int main(int argc, char **argv) {
  ts_device dev = TS_DEVICE_CUDA;
  int a = 1;
  if (a + 1 < argc && !strcmp(argv[a], "--device")) {
    if (!strcmp(argv[a + 1], "cpu")) dev = TS_DEVICE_CPU;
    else if (strcmp(argv[a + 1], "cuda")) return usage("--device: expected cpu or cuda");
    a += 2;
  }
  char *end = NULL;
  long M = a < argc ? strtol(argv[a], &end, 10) : 16384;
  if (a < argc && (*end || M < 16 || M % 16)) return usage("M: expected a multiple of 16, >= 16");
  long reps = a + 1 < argc ? strtol(argv[a + 1], &end, 10) : 10;
  if (a + 1 < argc && (*end || reps < 1)) return usage("REPS: expected an integer >= 1");
  if (a + 2 < argc) return usage("too many arguments");

  ts_kctx ctx;
  if (ts_k_context_init(&ctx, dev, 0) != TS_OK) {
    fprintf(stderr, "bench_fp8: --device %s: %s\n", dev == TS_DEVICE_CPU ? "cpu" : "cuda",
            ts_last_error());
    return 1;
  }
  size_t ws = 0, most = 0; /* workspace, and the largest operand's elements */
  for (int s = 0; s < SHAPES; s++) {
    size_t N = kShapes[s].N, K = kShapes[s].K, need[4] = {
        ts_k_linear_workspace_bytes(dev, (size_t)M, N, K, TS_BF16),
        ts_k_linear_fp8_workspace_bytes(dev, (size_t)M, N, K, TS_FP8_TENSORWISE),
        ts_k_linear_fp8_workspace_bytes(dev, (size_t)M, N, K, TS_FP8_ROWWISE),
        ts_k_fp8_quantize_workspace_bytes(dev, (size_t)M, K)};
    for (int i = 0; i < 4; i++) ws = need[i] > ws ? need[i] : ws;
    size_t sizes[3] = {(size_t)M * K, (size_t)M * N, N * K};
    for (int i = 0; i < 3; i++) most = sizes[i] > most ? sizes[i] : most;
  }
  void *bufs[8] = {0}; /* workspace, x, w, out, dout, dinp, dw, codes */
  size_t bytes[8] = {ws, 2 * most, 2 * most, 2 * most, 2 * most, 2 * most, 2 * most, most};
  for (int i = 0; i < 8; i++)
    if (ts_k_alloc(dev, bytes[i] ? bytes[i] : 1, &bufs[i]) != TS_OK) {
      fprintf(stderr, "bench_fp8: %zu bytes on the device: %s\n", bytes[i], ts_last_error());
      return 1;
    }
  float *scales = NULL;
  if (ts_k_alloc(dev, sizeof(float) * (size_t)(M > 5632 ? M : 5632), (void **)&scales) != TS_OK) {
    fprintf(stderr, "bench_fp8: the scales: %s\n", ts_last_error());
    return 1;
  }
  ctx.workspace = bufs[0];
  ctx.workspace_bytes = ws;
  uint16_t *h = malloc(2 * most);
  if (!h) return fprintf(stderr, "bench_fp8: out of host memory\n"), 1;
  uint64_t state = 42;
  const float range[6] = {1.0f, 0.05f, 1.0f, 1e-3f, 1.0f, 1e-3f}; /* x, w, out, dout, dinp, dw */
  for (int i = 1; i <= 6; i++) {
    fill(h, most, range[i - 1], &state);
    if (ts_k_from_host(&ctx, bufs[i], h, 2 * most) != TS_OK) {
      fprintf(stderr, "bench_fp8: upload: %s\n", ts_last_error());
      return 1;
    }
  }
  free(h);

  printf("bench_fp8: %s, M %ld, %ld calls per figure; ms per call\n\n",
         dev == TS_DEVICE_CPU ? "cpu" : "cuda", M, reps);
  printf("| shape | N x K |");
  for (int p = 0; p < PASSES; p++) printf(" %s |", kPassName[p]);
  printf("\n| --- | --- |");
  for (int p = 0; p < PASSES; p++) printf(" ---: |");
  printf("\n");
  double ms[SHAPES][PASSES];
  char errs[PASSES][512] = {{0}};
  int failed = 0;
  for (int s = 0; s < SHAPES; s++) {
    operands o = {&ctx, (size_t)M, kShapes[s].N, kShapes[s].K, bufs[1], bufs[2], bufs[3],
                  bufs[4], bufs[5], bufs[6], bufs[7], scales};
    printf("| %s | %zu x %zu |", kShapes[s].name, o.N, o.K);
    for (int p = 0; p < PASSES; p++) {
      ms[s][p] = time_pass(&o, (pass)p, (int)reps, errs[p], sizeof errs[p]);
      if (ms[s][p] < 0) {
        failed = 1;
        printf(" failed |");
      } else {
        printf(" %.3f |", ms[s][p]);
      }
      fflush(stdout);
    }
    printf("\n");
  }
  /* a block: each shape times its count, forward + backward */
  double block[3] = {0, 0, 0};
  int ok[3] = {1, 1, 1};
  for (int s = 0; s < SHAPES; s++)
    for (int k = 0; k < 3; k++) {
      double f = ms[s][2 * k], b = ms[s][2 * k + 1];
      if (f < 0 || b < 0) ok[k] = 0;
      block[k] += (double)kShapes[s].count * (f + b);
    }
  printf("\nOne block's seven projections, forward + backward:\n\n"
         "| products | ms | / bf16 |\n| --- | ---: | ---: |\n");
  const char *names[3] = {"bf16", "fp8 tensorwise", "fp8 rowwise"};
  for (int k = 0; k < 3; k++) {
    if (!ok[k]) printf("| %s | failed | - |\n", names[k]);
    else if (!ok[0]) printf("| %s | %.3f | - |\n", names[k], block[k]);
    else printf("| %s | %.3f | %.2f |\n", names[k], block[k], block[k] / block[0]);
  }
  for (int p = 0; p < PASSES; p++)
    if (errs[p][0]) printf("\n%s failed: %s\n", kPassName[p], errs[p]);
  for (int i = 0; i < 8; i++) ts_k_free(dev, bufs[i]);
  ts_k_free(dev, scales);
  ts_k_context_destroy(&ctx);
  return failed;
}
