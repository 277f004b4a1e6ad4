#!/usr/bin/env bash
# gpu_bundle.sh — packs the GPU tests (Bazel tag `gpu`) and the GPU
# benchmark into one folder that runs on a machine with an NVIDIA GPU and
# driver but without Bazel or Debian's libraries (a lent GPU machine, say):
#
#   tools/gpu_bundle.sh [DIR]      (default .gpu; keep DIR out of git), and
#                                  DIR.tar.xz, the same folder packed to carry
#   DIR/run.sh LOG_DIR [NAME...]   on the GPU machine: prints the GPU stack
#                                  (DIR/gpu_info), runs every test binary
#                                  under its time limit (DIR/tests.txt)
#                                  with brief output, keeps the logs in
#                                  LOG_DIR, ends with "N passed, N failed"
#                                  (tools/gpu_suite.sh; exit 1 if any failed)
#   DIR/run_overlap.sh [MODEL] [RANKS] on the GPU machine: tools/bench_overlap.sh
#                                  (overlap off/on, ZeRO-3, gather-once) on
#                                  RANKS ranks under DIR/mpirun (default 2)
#   DIR/run_offload.sh [STEPS]     on the GPU machine: tools/bench_offload_gpu.sh,
#                                  llama-2-7b bf16 with --offload optimizer
#                                  (tokens/s, MFU, device and host peaks
#                                  beside the plan)
#   DIR/run_compare.sh [MODEL] [RANKS] on the GPU machine: `tessera compare
#                                  --device cuda` at ZeRO 0-3 (default
#                                  llama-124m on 2 ranks): measured bytes per
#                                  rank beside the plan
#   DIR/run_fp8.sh [STEPS]         on the GPU machine: tools/bench_fp8.sh, llama-1.1b
#                                  bf16 against --fp8 tensorwise and rowwise
#                                  (tokens/s and loss after STEPS, 200, with
#                                  the verdict lines of issue 46's targets)
#   DIR/run_all.sh OUT [STAGE...]  on the GPU machine: tools/gpu_session.sh,
#                                  the suite, run_compare, run_fp8, bench_fp8
#                                  (kernels/bench_fp8.c: a llama block's
#                                  linear layers, bf16 against fp8, per
#                                  shape) and the benchmarks as stages under one deadline
#                                  (default suite compare fp8), two files
#                                  per stage in OUT
#   DIR/run_bench.sh [STEPS]       on the GPU machine: tools/bench_gpu.sh,
#                                  tessera against PyTorch (which must be
#                                  there: python3 with torch and transformers);
#                                  one model per 10-minute command:
#                                  MODELS=llama-124m:32x1024, llama-1.1b:8x2048
#                                  or bert-base:256x128
#
# DIR holds each test binary (its symbol table stripped) and gpu_info,
# the project's shared libraries from
# bazel-bin/_solib_k8, and the libraries outside the C runtime and the CUDA
# toolkit that the binaries load (OpenBLAS's OpenMP build, libgfortran,
# libquadmath, libgomp), resolved by ldd here. The CUDA runtime is linked
# into the binaries statically (third_party/cuda.BUILD); the GPU machine's
# driver is all they need of CUDA.
#
# For the benchmark it also holds bin/tessera (built with the GPU targets)
# behind the wrapper DIR/tessera, every library bin/tessera loads outside the
# C/C++ runtime and CUDA (Open MPI, hwloc, libevent, SentencePiece, cJSON,
# ...), the Open MPI components an MPI_Init of one rank needs (lib/openmpi:
# those whose own libraries are in the bundle), models/configs/,
# tools/bench_gpu.sh, the PyTorch peers tools/peer/torch_llama.py and
# torch_bert.py, and the KJV token folders data/kjv and data/kjv-mlm
# (tokens and tokenizer; made by tools/kjv.sh when absent). The
# wrapper runs MPI as an isolated singleton (no orted, no mpirun), so the GPU
# machine needs no Open MPI of its own. CUDA's own libraries (cuBLAS, cuDNN)
# are not carried: DIR/env.sh, sourced by run.sh and DIR/tessera, finds any
# the loader would not (the binaries' rpath is /usr/local/cuda/lib64) in the
# GPU machine's PyTorch wheels (site-packages/nvidia/*/lib); NVRTC among
# them, which cuDNN opens to compile some attention kernels at run time.
# The packed archive DIR.tar.xz must stay under 32 MiB (a lent machine's
# working tree carries 64 MiB in all, the repository's tracked files about
# 11 MiB of it; oneDNN's library alone packs to about 7 MiB); the sizes
# print last.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/.gpu}"
cd "$ROOT"
tools/setup.sh
targets="$(bazel query --noshow_progress 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null)"
[[ -n "$targets" ]] || { echo "gpu_bundle: no test carries the tag gpu" >&2; exit 1; }
# shellcheck disable=SC2086
bazel build --ui_event_filters=-info,-progress --noshow_progress $targets //tools:tessera \
  //tools:gpu_info //kernels:bench_fp8
tools/kjv.sh bazel-bin/tools/tessera >/dev/null ||
  echo "gpu_bundle: tools/kjv.sh failed: the bundle carries no data/kjv (give run_bench.sh DATA=...)" >&2
tools/kjv.sh bazel-bin/tools/tessera --mlm >/dev/null ||
  echo "gpu_bundle: tools/kjv.sh --mlm failed: the bundle carries no data/kjv-mlm (give run_bench.sh DATA_MLM=...)" >&2

# Each binary's time limit on the GPU machine (run.sh; BUDGET caps the
# sum at 540 s). From the CPU twins' times here (2 cores: engine_device_test
# 3 s, kernels_parity_test and hf_parity_test under 1 s) plus what only the
# GPU pays: the CUDA context (about 1 s a process), cuDNN's graph builds
# (one per shape, dtype and pass in a process: 8 in the parity test, 4 in
# the engine test, a few in hf_parity; a few seconds each where cuDNN
# compiles at run time) and cuBLASLt's heuristics (once per product shape).
# Each limit is several times that estimate; unlisted binaries get 120 s.
# run.sh runs them in this order (the lower layers first), others after.
ORDER=(cuda_smoke_test kernels_cuda_test kernels_parity_gpu_test bert_head_gpu_test
  hf_parity_gpu_test engine_gpu_test staged_gpu_test nccl_gpu_test)
declare -A LIMIT=(
  [cuda_smoke_test]=60
  [kernels_cuda_test]=60
  [kernels_parity_gpu_test]=120
  [bert_head_gpu_test]=60
  [hf_parity_gpu_test]=120
  [engine_gpu_test]=180
  [staged_gpu_test]=180
  [nccl_gpu_test]=180
)
# Ranks per binary: a multi-rank test (comm/mpi_test.bzl's NAME_npN, whose
# binary is NAME_bin) runs as NAME under the bundle's mpirun with N ranks,
# the largest N it is declared for (nccl_gpu_test: 2, which on a one-GPU
# machine runs its one-rank NCCL path on each rank).
declare -A NP=()

rm -rf "$DIR"
mkdir -p "$DIR/lib"
tests=()
for t in $targets; do
  path="bazel-bin/$(sed -e 's|^//||' -e 's|:|/|' <<<"$t")"
  name="$(basename "$path")"
  if [[ "$name" =~ ^(.*)_np([0-9]+)$ ]]; then # an mpirun test: its binary, N ranks
    name="${BASH_REMATCH[1]}"
    path="$(dirname "$path")/${name}_bin"
    if [[ -n "${NP[$name]:-}" ]]; then # seen: keep the most ranks
      ((BASH_REMATCH[2] > NP[$name])) && NP[$name]="${BASH_REMATCH[2]}"
      continue
    fi
    NP[$name]="${BASH_REMATCH[2]}"
  fi
  cp -L "$path" "$DIR/$name"
  chmod u+w "$DIR/$name"
  strip --strip-unneeded "$DIR/$name"
  tests+=("$name")
  # Libraries the binary loads that a bare CUDA machine may lack.
  ldd "$path" | awk '/=> \// {print $3}' |
    grep -E "openblas|libdnnl|libgfortran|libquadmath|libgomp" |
    while read -r lib; do cp -L "$lib" "$DIR/lib/"; done
done
cp -L bazel-bin/_solib_k8/*.so "$DIR/lib/"
{
  echo "# test binary, time limit in seconds, ranks (tools/gpu_bundle.sh; read by run.sh)"
  for name in "${ORDER[@]}" "${tests[@]}"; do
    [[ " ${tests[*]} " == *" $name "* ]] && echo "$name ${LIMIT[$name]:-120} ${NP[$name]:-1}"
  done | awk '!seen[$1]++'
} >"$DIR/tests.txt"
cp -L bazel-bin/tools/gpu_info "$DIR/gpu_info"
cp -L bazel-bin/kernels/bench_fp8 "$DIR/bench_fp8" # run_all.sh's fp8bench stage
chmod u+w "$DIR/gpu_info" "$DIR/bench_fp8"
strip --strip-unneeded "$DIR/bench_fp8"
cp tools/gpu_suite.sh "$DIR/run.sh"
cp tools/gpu_session.sh "$DIR/run_all.sh"
chmod +x "$DIR/run.sh" "$DIR/run_all.sh"

# ---- tessera and what it loads, for run_bench.sh ---------------------------------

# Libraries every Linux machine has (the C and C++ runtimes) and the CUDA
# toolkit's, which the GPU machine's driver and CUDA install provide.
SYSTEM='^(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64|libstdc\+\+|libgcc_s)\.so'
SYSTEM+='|^lib(cuda|cudart|cublas|cublasLt|cudnn[a-z_]*|nvrtc[a-z-]*|nvJitLink|cufft|curand|cusparse|cusolver|nccl)\.so'
# "SONAME PATH" per library FILE loads ("SONAME -" when ldd finds none).
deps() { ldd "$1" | awk '/=> \// {print $1, $3} /=> not found/ {print $1, "-"}'; }

mkdir -p "$DIR/bin" "$DIR/lib/openmpi"
# Open MPI's launcher (orterun as mpirun, and orted) for the multi-rank
# tests and benchmarks: ranks on this one machine, behind DIR/mpirun.
cp -L "$(command -v orterun)" "$DIR/bin/mpirun"
cp -L "$(command -v orted)" "$DIR/bin/orted"
cp -L bazel-bin/tools/tessera "$DIR/bin/tessera"
chmod u+w "$DIR/bin/tessera"
strip --strip-unneeded "$DIR/bin/tessera" # its symbol table: 0.6 MiB of the 64
while read -r so path; do
  if grep -Eq "$SYSTEM" <<<"$so"; then continue; fi
  [[ "$path" != - ]] || { echo "gpu_bundle: tessera needs $so, which ldd cannot find" >&2; exit 1; }
  cp -L "$path" "$DIR/lib/$so"
done < <(deps bazel-bin/tools/tessera)

# Open MPI loads its components (pml, btl, coll, ...) with dlopen at
# MPI_Init. Keep those whose libraries are all in the bundle, the system's
# or Open MPI's libmca_common_sm/monitoring; the rest (UCX, libfabric, PSM,
# verbs, OpenSHMEM, MPI-IO, external PMIx) serve transports and APIs that
# one rank of tessera never opens.
components="$(ompi_info --parsable --path pkglibdir | sed -n 's/^path:pkglibdir://p')"
[[ -d "$components" ]] || { echo "gpu_bundle: no Open MPI component folder ($components)" >&2; exit 1; }
# mpirun (the multi-rank tests) needs a PMIx component: Debian's Open MPI
# uses the external PMIx (mca_pmix_ext3x), so carry libpmix and what it
# loads, which keeps that component below, and PMIx's own plugins.
while read -r so path; do
  if grep -Eq "$SYSTEM" <<<"$so" || [[ -f "$DIR/lib/$so" ]]; then continue; fi
  [[ "$path" != - ]] || { echo "gpu_bundle: mca_pmix_ext3x needs $so, which ldd cannot find" >&2; exit 1; }
  cp -L "$path" "$DIR/lib/$so"
done < <(deps "$components/mca_pmix_ext3x.so")
pmix_plugins="$(dirname "$(ldd "$components/mca_pmix_ext3x.so" | awk '/libpmix\.so/ {print $3}')")"
pmix_plugins="$(find "$pmix_plugins" /usr/lib/x86_64-linux-gnu/pmix2 -maxdepth 3 -type d -path '*lib/pmix' 2>/dev/null | head -1)"
mkdir -p "$DIR/lib/pmix"
if [[ -n "$pmix_plugins" ]]; then cp -L "$pmix_plugins"/*.so "$DIR/lib/pmix/" 2>/dev/null || true; fi
kept=0
for comp in "$components"/mca_*.so; do
  ok=1 common=()
  while read -r so path; do
    if grep -Eq "$SYSTEM" <<<"$so" || [[ -f "$DIR/lib/$so" ]]; then continue; fi
    if [[ "$so" =~ ^libmca_common_(sm|monitoring)\.so && "$path" != - ]]; then
      common+=("$so:$path")
      continue
    fi
    ok=0
    break
  done < <(deps "$comp")
  ((ok)) || continue
  cp -L "$comp" "$DIR/lib/openmpi/"
  for c in ${common[@]+"${common[@]}"}; do cp -L "${c#*:}" "$DIR/lib/${c%%:*}"; done
  kept=$((kept + 1))
done
echo "gpu_bundle: $kept Open MPI components from $components" >&2

# The CUDA libraries the binaries link dynamically (cuDNN, ...; not the
# driver's libcuda), and those opened with dlopen: cuBLASLt
# (kernels/cuda/linear.cu), NVRTC and its builtins (cuDNN's runtime-compiled
# attention kernels), NCCL (gpu_info), for env.sh to look for on the GPU
# machine.
cuda_libs="$( (for f in "$DIR/bin/tessera" "${tests[@]/#/$DIR/}"; do deps "$f"; done |
  awk '{print $1}' | { grep -E "$SYSTEM" | grep -E '^lib(cu|nv|nccl)' | grep -v '^libcuda\.so' || true; }
  echo libcublasLt.so.13 libnvrtc.so.13 libnvrtc-builtins.so.13.0 libnccl.so.2) |
  sort -u | tr '\n' ' ')"
cat >"$DIR/env.sh" <<EOF
# Sourced by run.sh and ./tessera (made by tools/gpu_bundle.sh): the bundle's
# libraries first on the loader's path; then, for each CUDA library the
# binaries link or open (${cuda_libs:-none here}) that is neither in
# /usr/local/cuda/lib64 (their rpath) nor in ld.so.cache, the folder of
# PyTorch's nvidia-* wheels that holds it.
_b="\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)"
export LD_LIBRARY_PATH="\$_b/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
for _so in $cuda_libs; do
  [[ -e "/usr/local/cuda/lib64/\$_so" ]] && continue
  ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*\$_so " && continue
  _dir="\$("\${PYTHON:-python3}" - "\$_so" 2>/dev/null <<'PY'
import glob, os, site, sys
for p in site.getsitepackages() + [site.getusersitepackages()]:
    for f in glob.glob(os.path.join(p, "nvidia", "*", "lib", sys.argv[1])):
        print(os.path.dirname(f))
        sys.exit()
PY
)"
  if [[ -n "\$_dir" ]]; then
    export LD_LIBRARY_PATH="\$LD_LIBRARY_PATH:\$_dir"
  else
    echo "env.sh: \$_so: not in /usr/local/cuda/lib64, ld.so.cache or PyTorch's nvidia wheels" >&2
  fi
done
unset _b _so _dir
EOF

cat >"$DIR/tessera" <<'EOF'
#!/usr/bin/env bash
# tessera from this bundle (made by tools/gpu_bundle.sh): bin/tessera with
# the bundle's libraries, presets (models/configs) and Open MPI components.
# One rank: MPI starts as an isolated singleton (no mpirun, no orted).
B="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=/dev/null
source "$B/env.sh"
export TESSERA_HOME="${TESSERA_HOME:-$B}"
export OMPI_MCA_mca_base_component_path="$B/lib/openmpi"
export OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_MCA_ess_singleton_isolated=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self
export HWLOC_PLUGINS_PATH="$B/lib/hwloc" # none: no plugins of another hwloc
exec "$B/bin/tessera" "$@"
EOF
chmod +x "$DIR/tessera"

cat >"$DIR/mpi_env.sh" <<'EOF'
# Sourced (by DIR/mpirun and DIR/run_compare.sh): the environment of Open
# MPI's mpirun from this bundle, for ranks on this one machine: the
# bundle's libraries and components, shared memory and loopback between
# ranks, root allowed (a lent machine runs as root); B is the bundle.
# shellcheck source=/dev/null
source "$B/env.sh"
export PATH="$B/bin:$PATH" # mpirun, and orted beside it
export OMPI_MCA_mca_base_component_path="$B/lib/openmpi"
export OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo
export OMPI_MCA_btl_vader_single_copy_mechanism=none # containers often forbid CMA
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export HWLOC_PLUGINS_PATH="$B/lib/hwloc"
export PMIX_MCA_mca_base_component_path="$B/lib/pmix" PMIX_MCA_mca_base_component_show_load_errors=0
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
EOF

cat >"$DIR/mpirun" <<'EOF'
#!/usr/bin/env bash
# Open MPI's mpirun from this bundle (made by tools/gpu_bundle.sh), for
# ranks on this one machine (mpi_env.sh), not bound to cores. Use as
# mpirun: ./mpirun -n 2 ./NAME ...
B="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=/dev/null
source "$B/mpi_env.sh"
exec "$B/bin/mpirun" --oversubscribe --bind-to none "$@"
EOF
chmod +x "$DIR/mpirun"

cat >"$DIR/run_compare.sh" <<'EOF'
#!/usr/bin/env bash
# `tessera compare` from this bundle (made by tools/gpu_bundle.sh): one
# configuration at ZeRO stages 0-3 on RANKS ranks of this machine's GPU(s)
# (2 ranks on one card share it through the host-staged transport), each
# rank's ledger peaks beside the plan (estimate's) and the losses checked
# equal across stages. Writes OUT (default compare-cuda) in the current
# directory (compare.png only where /usr/bin/gnuplot is: else --no-chart);
# exit 0 when every check passes (compare's own status).
#   run_compare.sh [MODEL] [RANKS] [other compare flags...]
#   (default llama-124m 2); environment DTYPE (bf16), MB (4), SEQ (1024),
#   STEPS (3), DEVICE (cuda), DATA (the bundle's KJV tokens), OUT
B="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=/dev/null
source "$B/mpi_env.sh" # tools/launch.sh's mpirun: the bundle's
export TESSERA_HOME="$B"
model="${1:-llama-124m}" ranks="${2:-2}"
shift $(($# < 2 ? $# : 2))
[[ -x /usr/bin/gnuplot ]] || set -- --no-chart "$@"
exec "$B/bin/tessera" compare --device "${DEVICE:-cuda}" --model "$model" -n "$ranks" \
  --data "${DATA:-$B/data/kjv}" --zero 0,1,2,3 --dtype "${DTYPE:-bf16}" --micro-batch "${MB:-4}" \
  --seq "${SEQ:-1024}" --steps "${STEPS:-3}" --out "${OUT:-compare-cuda}" "$@"
EOF
chmod +x "$DIR/run_compare.sh"

# Presets, the benchmark, the PyTorch peer and the KJV token folder.
mkdir -p "$DIR/models" "$DIR/tools/peer"
cp -r models/configs "$DIR/models/"
cp tools/bench_gpu.sh tools/bench_fp8.sh tools/bench_overlap.sh tools/bench_offload_gpu.sh \
  tools/launch.sh "$DIR/tools/"
cp tools/peer/torch_llama.py tools/peer/torch_bert.py "$DIR/tools/peer/"
# The tests' data, at the paths they open relative to their working
# directory (Bazel's runfiles root there; the bundle's root here).
mkdir -p "$DIR/tests/hf_parity"
cp -r tests/hf_parity/fixtures "$DIR/tests/hf_parity/"
for corpus in kjv kjv-mlm; do
  if [[ -f data/$corpus/train.bin && -f data/$corpus/val.bin ]]; then
    mkdir -p "$DIR/data/$corpus"
    for f in train.bin val.bin meta.json tokenizer.model; do
      if [[ -f "data/$corpus/$f" ]]; then cp "data/$corpus/$f" "$DIR/data/$corpus/"; fi
    done
  fi
done

cat >"$DIR/run_bench.sh" <<'EOF'
#!/usr/bin/env bash
# tools/bench_gpu.sh from this bundle (made by tools/gpu_bundle.sh): tessera
# against PyTorch on this machine's GPU. Arguments and environment as
# bench_gpu.sh's (STEPS; MODELS, IMPLS, PYTHON, BENCH_JSON, BENCH_LOGS, ...);
# the binary, presets and data are the bundle's unless DATA says otherwise.
# BENCH_JSON (default bench_gpu.json) is written in the current directory.
B="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true
export TESSERA_BIN="$B/tessera" TESSERA_HOME="$B" DATA="${DATA:-$B/data/kjv}"
export DATA_MLM="${DATA_MLM:-$B/data/kjv-mlm}"
exec "$B/tools/bench_gpu.sh" "$@"
EOF
chmod +x "$DIR/run_bench.sh"

cat >"$DIR/run_fp8.sh" <<'EOF'
#!/usr/bin/env bash
# tools/bench_fp8.sh from this bundle (made by tools/gpu_bundle.sh): llama
# bf16 against --fp8 tensorwise and rowwise on this machine's GPU, with the
# verdict lines of issue 46's fp8 targets. Arguments and environment as
# bench_fp8.sh's (STEPS; MODEL, BENCH_LOGS).
B="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true
export TESSERA_BIN="$B/tessera" TESSERA_HOME="$B" DATA="${DATA:-$B/data/kjv}"
exec "$B/tools/bench_fp8.sh" "$@"
EOF
chmod +x "$DIR/run_fp8.sh"

cat >"$DIR/run_offload.sh" <<'EOF'
#!/usr/bin/env bash
# tools/bench_offload_gpu.sh from this bundle (made by tools/gpu_bundle.sh):
# llama-2-7b bf16 on this machine's GPU with --offload optimizer. Arguments
# and environment as bench_offload_gpu.sh's (STEPS; MODEL, MB, SEQ, ACCUM).
B="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export TESSERA_BIN="$B/tessera" TESSERA_HOME="$B" DATA="${DATA:-$B/data/kjv}"
exec "$B/tools/bench_offload_gpu.sh" "$@"
EOF
chmod +x "$DIR/run_offload.sh"

cat >"$DIR/run_overlap.sh" <<'EOF'
#!/usr/bin/env bash
# tools/bench_overlap.sh from this bundle (made by tools/gpu_bundle.sh):
# stage 0, ZeRO-3 and gather-once with --overlap off and on, RANKS ranks on
# this machine's GPU(s) under the bundle's mpirun (2 ranks on one card:
# the host-staged transport). Arguments as bench_overlap.sh's:
#   run_overlap.sh [MODEL] [RANKS] [STEPS] [ACCUM]   (default llama-tiny "2" 20 4)
B="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export TESSERA_BIN="$B/bin/tessera" TESSERA_TOOL="$B/tessera" TESSERA_HOME="$B"
export DATA="${DATA:-$B/data/kjv}" LAUNCH="$B/mpirun" DEVICE="${DEVICE:-cuda}"
exec "$B/tools/bench_overlap.sh" "${1:-llama-tiny}" "${2:-2}" "${3:-20}" "${4:-4}"
EOF
chmod +x "$DIR/run_overlap.sh"

size="$(du -sb "$DIR" | cut -f1)"
echo "gpu_bundle: $DIR: $((size / 1048576)) MiB"
# The folder may pass the 64 MiB a lent machine's tree carries (OpenBLAS
# alone is 36 MB); its xz archive beside it is a fraction of that. On the
# GPU machine: tar xf DIR.tar.xz && DIR/run.sh LOG_DIR.
tar -C "$(dirname "$DIR")" -cJf "$DIR.tar.xz" "$(basename "$DIR")"
packed="$(du -sb "$DIR.tar.xz" | cut -f1)"
echo "gpu_bundle: $DIR.tar.xz: $((packed * 10 / 1048576 / 10)).$((packed * 10 / 1048576 % 10)) MiB (carry this one)"
if ((packed >= 32 * 1048576)); then
  echo "gpu_bundle: the archive is over 32 MiB" >&2
  exit 1
fi
