# bench_env.sh — sourced by the training benchmarks (bench_zero.sh,
# bench_precision.sh, bench_pipeline.sh) from the repository root: installs
# what is missing (tools/setup.sh), picks the tessera binary — TESSERA_BIN
# (with TESSERA_HOME for its presets) or the working tree's, built here —
# into BIN, prepares the KJV corpus into DATA, and makes TMP, removed at
# exit.
tools/setup.sh
if [[ -n "${TESSERA_BIN:-}" ]]; then
  BIN="$TESSERA_BIN"
  export TESSERA_HOME="${TESSERA_HOME:-$PWD}"
else
  bazel build --ui_event_filters=-info,-progress --noshow_progress //tools:tessera
  BIN="$PWD/bazel-bin/tools/tessera"
  export TESSERA_HOME="$PWD"
fi
tools/kjv.sh "$BIN" >/dev/null
DATA="$PWD/data/kjv"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
