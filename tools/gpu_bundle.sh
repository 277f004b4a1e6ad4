#!/usr/bin/env bash
# gpu_bundle.sh — packs the GPU tests (Bazel tag `gpu`) and the GPU
# benchmark into one folder that runs on a machine with an NVIDIA GPU and
# driver but without Bazel or Debian's libraries (a lent GPU machine, say):
#
#   tools/gpu_bundle.sh [DIR]      (default .gpu; keep DIR out of git), and
#                                  DIR.tar.xz, the same folder packed to carry
#   DIR/run.sh                     on the GPU machine: runs every test,
#                                  exit status nonzero if any failed
#   DIR/run_bench.sh [STEPS]       on the GPU machine: tools/bench_gpu.sh,
#                                  tessera against PyTorch (which must be
#                                  there: python3 with torch and transformers)
#
# DIR holds each test binary, the project's shared libraries from
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
# tools/bench_gpu.sh, tools/peer/torch_llama.py and the KJV token folder
# data/kjv (tokens and tokenizer; made by tools/kjv.sh when absent). The
# wrapper runs MPI as an isolated singleton (no orted, no mpirun), so the GPU
# machine needs no Open MPI of its own. CUDA's own libraries (cuBLAS, cuDNN)
# are not carried: DIR/env.sh, sourced by run.sh and DIR/tessera, finds any
# the loader would not (the binaries' rpath is /usr/local/cuda/lib64) in the
# GPU machine's PyTorch wheels (site-packages/nvidia/*/lib). The whole
# folder stays under 64 MiB (the size a lent machine's working tree may
# carry); the size prints last.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/.gpu}"
cd "$ROOT"
tools/setup.sh
targets="$(bazel query --noshow_progress 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null)"
[[ -n "$targets" ]] || { echo "gpu_bundle: no test carries the tag gpu" >&2; exit 1; }
# shellcheck disable=SC2086
bazel build --ui_event_filters=-info,-progress --noshow_progress $targets //tools:tessera
tools/kjv.sh bazel-bin/tools/tessera >/dev/null ||
  echo "gpu_bundle: tools/kjv.sh failed: the bundle carries no data/kjv (give run_bench.sh DATA=...)" >&2

rm -rf "$DIR"
mkdir -p "$DIR/lib"
tests=()
for t in $targets; do
  path="bazel-bin/$(sed -e 's|^//||' -e 's|:|/|' <<<"$t")"
  name="$(basename "$path")"
  cp -L "$path" "$DIR/$name"
  tests+=("$name")
  # Libraries the binary loads that a bare CUDA machine may lack.
  ldd "$path" | awk '/=> \// {print $3}' |
    grep -E "openblas|libgfortran|libquadmath|libgomp" |
    while read -r lib; do cp -L "$lib" "$DIR/lib/"; done
done
cp -L bazel-bin/_solib_k8/*.so "$DIR/lib/"

# ---- tessera and what it loads, for run_bench.sh ---------------------------------

# Libraries every Linux machine has (the C and C++ runtimes) and the CUDA
# toolkit's, which the GPU machine's driver and CUDA install provide.
SYSTEM='^(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64|libstdc\+\+|libgcc_s)\.so'
SYSTEM+='|^lib(cuda|cudart|cublas|cublasLt|cudnn[a-z_]*|nvrtc[a-z-]*|nvJitLink|cufft|curand|cusparse|cusolver|nccl)\.so'
# "SONAME PATH" per library FILE loads ("SONAME -" when ldd finds none).
deps() { ldd "$1" | awk '/=> \// {print $1, $3} /=> not found/ {print $1, "-"}'; }

mkdir -p "$DIR/bin" "$DIR/lib/openmpi"
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
# driver's libcuda), and cuBLASLt, which they open with dlopen
# (kernels/cuda/linear.cu), for env.sh to look for on the GPU machine.
cuda_libs="$( (for f in "$DIR/bin/tessera" "${tests[@]/#/$DIR/}"; do deps "$f"; done |
  awk '{print $1}' | { grep -E "$SYSTEM" | grep -E '^lib(cu|nv|nccl)' | grep -v '^libcuda\.so' || true; }
  echo libcublasLt.so.13) | sort -u | tr '\n' ' ')"
cat >"$DIR/env.sh" <<EOF
# Sourced by run.sh and ./tessera (made by tools/gpu_bundle.sh): the bundle's
# libraries first on the loader's path; then, for each CUDA library the
# binaries link (${cuda_libs:-none here}) that is neither in
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

# Presets, the benchmark, the PyTorch peer and the KJV token folder.
mkdir -p "$DIR/models" "$DIR/tools/peer"
cp -r models/configs "$DIR/models/"
cp tools/bench_gpu.sh "$DIR/tools/"
cp tools/peer/torch_llama.py "$DIR/tools/peer/"
# The tests' data, at the paths they open relative to their working
# directory (Bazel's runfiles root there; the bundle's root here).
mkdir -p "$DIR/tests/hf_parity"
cp -r tests/hf_parity/fixtures "$DIR/tests/hf_parity/"
if [[ -f data/kjv/train.bin && -f data/kjv/val.bin ]]; then
  mkdir -p "$DIR/data/kjv"
  for f in train.bin val.bin meta.json tokenizer.model; do
    if [[ -f "data/kjv/$f" ]]; then cp "data/kjv/$f" "$DIR/data/kjv/"; fi
  done
fi

cat >"$DIR/run.sh" <<EOF
#!/usr/bin/env bash
# Runs tessera's GPU tests from this bundle (made by tools/gpu_bundle.sh).
cd "\$(dirname "\${BASH_SOURCE[0]}")"
# The bundle's libraries (the CUDA runtime is inside each binary), and
# cuBLAS/cuDNN from PyTorch's wheels where the system has none (env.sh).
source ./env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fails=0
for t in ${tests[*]}; do
  echo "=== \$t"
  ./"\$t" || fails=\$((fails + 1))
done
echo "\$fails of ${#tests[@]} GPU test binaries failed"
exit \$((fails > 0))
EOF
chmod +x "$DIR/run.sh"

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
exec "$B/tools/bench_gpu.sh" "$@"
EOF
chmod +x "$DIR/run_bench.sh"

size="$(du -sb "$DIR" | cut -f1)"
echo "gpu_bundle: $DIR: $((size / 1048576)) MiB"
# The folder may pass the 64 MiB a lent machine's tree carries (OpenBLAS
# alone is 36 MB); its xz archive beside it is a fraction of that. On the
# GPU machine: tar xf DIR.tar.xz && DIR/run.sh.
tar -C "$(dirname "$DIR")" -cJf "$DIR.tar.xz" "$(basename "$DIR")"
packed="$(du -sb "$DIR.tar.xz" | cut -f1)"
echo "gpu_bundle: $DIR.tar.xz: $((packed / 1048576)) MiB (carry this one)"
if ((packed >= 64 * 1048576)); then
  echo "gpu_bundle: the archive is over 64 MiB: too large to carry to a lent GPU machine" >&2
fi
