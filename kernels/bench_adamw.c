/*
 * bench_adamw.c — parameters per second of the CPU AdamW step
 * (ts_k_adamw on the CPU device), the update an optimizer offloaded to the
 * host runs per unit (tools/bench_adamw.sh puts it beside PyTorch's and
 * DeepSpeed's CPU Adam).
 *
 * Usage: bench_adamw --isa   (prints `adamw body: B (the widest here: W)`,
 *                            the body ts_cpu_adamw_isa picked on this CPU)
 *        bench_adamw N DTYPE
 *   N      parameters (elements) updated per step, >= 1
 *   DTYPE  fp32: fp32 gradient, the update written into the fp32 master
 *          (the compute parameters are the masters); bf16 or fp16: the
 *          gradient in that dtype and the compute parameters written back
 *          in it beside the fp32 master (mixed precision's update)
 * Output: one line `adamw N DTYPE THREADS params/s`, params/s = N / the
 * median of the timed steps' seconds; each step is run until at least
 * 1 s has passed and at least 5 times, after one warm-up step (the first
 * touch of every page). Threads: OpenMP's (OMP_NUM_THREADS).
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/floats.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/kernels.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--isa") == 0) {
    static const char *const names[] = {"scalar", "avx2", "avx512"};
    printf("adamw body: %s (the widest here: %s)\n", names[ts_cpu_adamw_isa],
           names[ts_cpu_adamw_isa_max]);
    return 0;
  }
  char *end = NULL;
  unsigned long long n = argc == 3 ? strtoull(argv[1], &end, 10) : 0;
  ts_dtype dt = TS_FP32;
  int ok = argc == 3 && end && *end == '\0' && n >= 1;
  if (ok && strcmp(argv[2], "bf16") == 0) dt = TS_BF16;
  else if (ok && strcmp(argv[2], "fp16") == 0) dt = TS_FP16;
  else if (ok && strcmp(argv[2], "fp32") != 0) ok = 0;
  if (!ok) {
    fprintf(stderr, "usage: %s N fp32|bf16|fp16  (N parameters >= 1) | --isa\n", argv[0]);
    return 2;
  }
  size_t es = ts_dtype_size(dt);
  float *master = malloc(n * sizeof(float)), *m = malloc(n * sizeof(float));
  float *v = malloc(n * sizeof(float));
  void *grad = malloc(n * es), *param = dt == TS_FP32 ? master : malloc(n * es);
  if (!master || !m || !v || !grad || !param) {
    fprintf(stderr, "bench_adamw: %llu parameters: out of memory\n", n);
    return 1;
  }
  /* Values through the same first-touch split as the update (OpenMP's
   * static schedule), so that pages sit where the threads that update
   * them run. */
#pragma omp parallel for schedule(static)
  for (long long i = 0; i < (long long)n; i++) {
    master[i] = 0.01f * (float)(i % 97) - 0.5f;
    m[i] = 0.0f;
    v[i] = 0.0f;
    float g = 1e-3f * (float)(i % 89) - 0.04f;
    if (dt == TS_FP32) ((float *)grad)[i] = g;
    else ((uint16_t *)grad)[i] = dt == TS_BF16 ? ts_f32_to_bf16(g) : ts_f32_to_f16(g);
  }
  ts_kctx ctx;
  memset(&ctx, 0, sizeof ctx);
  ctx.device = TS_DEVICE_CPU;
  ts_adamw_hparams hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                         .weight_decay = 0.1f, .step = 1, .grad_scale = 1.0f};
  enum { MAX_REPS = 1000 };
  static double t[MAX_REPS];
  int reps = 0;
  double start = 0.0;
  for (int k = -1; k < MAX_REPS && (k < 5 || now_s() - start < 1.0); k++) {
    double t0 = now_s();
    if (k == 0) start = t0;
    ts_status st = ts_k_adamw(&ctx, master, dt == TS_FP32 ? NULL : param, dt, m, v, grad, dt,
                              (size_t)n, &hp);
    if (st != TS_OK) {
      fprintf(stderr, "bench_adamw: %s\n", ts_last_error());
      return 1;
    }
    hp.step++;
    if (k >= 0) t[reps++] = now_s() - t0;
  }
  qsort(t, (size_t)reps, sizeof t[0], cmp_double);
  printf("adamw %llu %s %d %.4g\n", n, argv[2], omp_get_max_threads(), (double)n / t[reps / 2]);
  return 0;
}
