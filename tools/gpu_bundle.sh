#!/usr/bin/env bash
# gpu_bundle.sh — packs the GPU tests (Bazel tag `gpu`) into one folder that
# runs on a machine with an NVIDIA GPU and driver but without Bazel or
# Debian's libraries (a lent GPU machine, say):
#
#   tools/gpu_bundle.sh [DIR]      (default .gpu; keep DIR out of git)
#   DIR/run.sh                     on the GPU machine: runs every test,
#                                  exit status nonzero if any failed
#
# DIR holds each test binary, the project's shared libraries from
# bazel-bin/_solib_k8, and the libraries outside the C runtime and the CUDA
# toolkit that the binaries load (OpenBLAS's OpenMP build, libgfortran,
# libquadmath, libgomp), resolved by ldd here. The CUDA runtime is linked
# into the binaries statically (third_party/cuda.BUILD); the GPU machine's
# driver is all they need of CUDA.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/.gpu}"
cd "$ROOT"
tools/setup.sh
targets="$(bazel query --noshow_progress 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null)"
[[ -n "$targets" ]] || { echo "gpu_bundle: no test carries the tag gpu" >&2; exit 1; }
# shellcheck disable=SC2086
bazel build --ui_event_filters=-info,-progress --noshow_progress $targets

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

cat >"$DIR/run.sh" <<EOF
#!/usr/bin/env bash
# Runs tessera's GPU tests from this bundle (made by tools/gpu_bundle.sh).
cd "\$(dirname "\${BASH_SOURCE[0]}")"
# The bundle's libraries (the CUDA runtime is inside each binary).
export LD_LIBRARY_PATH="\$PWD/lib:\${LD_LIBRARY_PATH:-}"
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
du -sh "$DIR" | sed 's/^/gpu_bundle: /'
