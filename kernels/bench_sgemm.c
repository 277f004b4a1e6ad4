/*
 * bench_sgemm.c — achieved GFLOP/s of OpenBLAS cblas_sgemm (row-major,
 * C = A B^T as in ts_k_linear_forward) for square and LLM-like shapes.
 *
 * Output: one line per shape, `sgemm M N K  GFLOP/s`, where GFLOP/s =
 * 2 M N K / (best time of the repetitions). Each shape is run until at
 * least 0.3 s have passed (and at least 3 times), after one warm-up call.
 * Threads: OpenBLAS's own (OPENBLAS_NUM_THREADS; default all cores).
 * Usage: bench_sgemm [M N K]...   (no arguments: the built-in list)
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Best-of GFLOP/s of out (M, N) = a (M, K) @ b (N, K)^T; -1 if out of memory. */
static double bench(int M, int N, int K) {
  float *a = malloc(sizeof(float) * (size_t)M * (size_t)K);
  float *b = malloc(sizeof(float) * (size_t)N * (size_t)K);
  float *c = malloc(sizeof(float) * (size_t)M * (size_t)N);
  if (!a || !b || !c) {
    free(a);
    free(b);
    free(c);
    return -1.0;
  }
  for (size_t i = 0; i < (size_t)M * (size_t)K; i++) a[i] = (float)(i % 7) * 0.25f - 0.75f;
  for (size_t i = 0; i < (size_t)N * (size_t)K; i++) b[i] = (float)(i % 5) * 0.25f - 0.5f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
  double best = 1e30, start = now_s();
  for (int rep = 0; rep < 3 || now_s() - start < 0.3; rep++) {
    double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
    double dt = now_s() - t0;
    if (dt < best) best = dt;
  }
  free(a);
  free(b);
  free(c);
  return 2.0 * M * N * (double)K / best / 1e9;
}

int main(int argc, char **argv) {
  static const int shapes[][3] = {
      {512, 512, 512},    {1024, 1024, 1024},
      {2048, 2048, 2048}, /* square */
      {4096, 256, 256},   {4096, 512, 512},
      {4096, 768, 768},                      /* B*T x C x C: attention projections */
      {4096, 1536, 512},  {4096, 512, 1536}, /* MLP up / down, I = 3C */
      {4096, 8192, 512},                     /* LM head slice, V x C */
  };
  if (argc > 1 && (argc - 1) % 3 != 0) {
    fprintf(stderr, "usage: %s [M N K]...\n", argv[0]);
    return 2;
  }
  int count = argc > 1 ? (argc - 1) / 3 : (int)(sizeof shapes / sizeof shapes[0]);
  for (int i = 0; i < count; i++) {
    int M = argc > 1 ? atoi(argv[1 + 3 * i]) : shapes[i][0];
    int N = argc > 1 ? atoi(argv[2 + 3 * i]) : shapes[i][1];
    int K = argc > 1 ? atoi(argv[3 + 3 * i]) : shapes[i][2];
    if (M <= 0 || N <= 0 || K <= 0) {
      fprintf(stderr, "bench_sgemm: shape %d %d %d: expected positive integers\n", M, N, K);
      return 2;
    }
    double gf = bench(M, N, K);
    if (gf < 0) {
      fprintf(stderr, "bench_sgemm: out of memory for %d %d %d\n", M, N, K);
      return 1;
    }
    printf("sgemm %d %d %d  %.1f\n", M, N, K, gf);
    fflush(stdout);
  }
  return 0;
}
