/*
 * isa.c — which vector instructions the CPU backend's own loops use
 * (cpu_common.h ts_cpu_isa, TS_CPU_CLONES): the widest this CPU and OS
 * have, within oneDNN's instruction-set cap when one is set, so that one
 * setting (ONEDNN_MAX_CPU_ISA) runs the whole CPU backend at one tier
 * (tools/test_suite.sh --isa, tools/bench_cpu.sh ISA=).
 */
#include <stdlib.h>
#include <strings.h>

#include "kernels/cpu/cpu_common.h"

int ts_cpu_isa = 0;

int ts_cpu_isa_widest(void) {
#if TS_CPU_X86
  __builtin_cpu_init(); /* __builtin_cpu_supports also checks XCR0: the OS saves the registers */
  int isa = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
                ? 2
            : __builtin_cpu_supports("avx2") ? 1
                                             : 0;
  const char *cap = getenv("ONEDNN_MAX_CPU_ISA");
  if (!cap || !*cap) cap = getenv("DNNL_MAX_CPU_ISA");
  if (cap && (!strncasecmp(cap, "SSE", 3) || !strcasecmp(cap, "AVX"))) isa = 0;
  else if (cap && !strncasecmp(cap, "AVX2", 4) && isa > 1) isa = 1; /* AVX2, AVX2_VNNI... */
  return isa;
#else
  return 0;
#endif
}

__attribute__((constructor)) static void detect_isa(void) { ts_cpu_isa = ts_cpu_isa_widest(); }
