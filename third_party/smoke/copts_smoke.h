/* C side of copts_smoke_test: reports how TS_COPTS and .bazelrc compiled a
 * .c file, so the test can check the C build settings really apply. */
#ifndef TESSERA_THIRD_PARTY_SMOKE_COPTS_SMOKE_H_
#define TESSERA_THIRD_PARTY_SMOKE_COPTS_SMOKE_H_

#ifdef __cplusplus
extern "C" {
#endif

/* __STDC_VERSION__ of the C compile (201112 for -std=c11). */
long ts_smoke_c_std_version(void);

/* Number of OpenMP threads a parallel region gets (>= 1; 1 also when
 * -fopenmp is missing, see ts_smoke_c_openmp_enabled). */
int ts_smoke_c_omp_threads(void);

/* 1 if the C file was compiled with -fopenmp (_OPENMP defined), else 0. */
int ts_smoke_c_openmp_enabled(void);

/* 1 if a*b+c was left unfused (-ffp-contract=off): for the inputs used,
 * an FMA rounds differently from a multiply then an add. */
int ts_smoke_c_fp_contract_off(void);

/* Monotonic clock in seconds (clock_gettime: needs POSIX under -std=c11). */
double ts_smoke_c_now(void);

#ifdef __cplusplus
}
#endif

#endif  /* TESSERA_THIRD_PARTY_SMOKE_COPTS_SMOKE_H_ */
