#!/usr/bin/env bash
# gpu_session.sh — one lease's GPU checks from tools/gpu_bundle.sh's folder
# (copied there as run_all.sh), stage after stage under one deadline, so
# that a 10-minute command on a lent GPU machine ends with its verdicts and
# every log packed:
#
#   run_all.sh OUT_DIR [STAGE...]   (default stages: suite compare fp8)
#
# Stages, in the order given:
#   suite    run.sh (every GPU test binary), its budget the time left (less
#            10 s for its summary when over 20 s are left)
#   compare  run_compare.sh: llama-124m bf16 at ZeRO 0-3 on 2 ranks, 3 steps
#   fp8      run_fp8.sh 200: llama-1.1b bf16 against --fp8 tensorwise and rowwise
#   fp8bench bench_fp8 16384 10: llama-1.1b's projections, bf16 against fp8
#            per shape and per block, and the casts alone (kernels/bench_fp8.c)
#   bert     run_bench.sh 15: bert-base 256 x 128, tessera and torch.compile
#   llama    run_bench.sh 15: llama-124m 32 x 1024, tessera and torch.compile
#   llama1b  run_bench.sh 15: llama-1.1b 8 x 2048, tessera and torch.compile
# Each stage writes OUT_DIR/STAGE.txt (what it printed, then "STAGE: exit N
# after S s") and OUT_DIR/STAGE.tgz (its logs), two files per stage and
# none deeper, and is killed when the deadline comes (exit 124 in its
# line). A stage that would start with under MIN_STAGE seconds left (60)
# is skipped ("STAGE: skipped"). DEADLINE (seconds from the start, default
# 560), MIN_STAGE and FP8_STEPS (200) are the environment's. Exit 0 when
# every stage ran and exited 0, 2 before any stage for an unknown one.
# tools/gpu_session_test.sh runs it on fake stages.
set -uo pipefail
B="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
(($# >= 1)) || {
  echo "usage: run_all.sh OUT_DIR [suite|compare|fp8|fp8bench|bert|llama|llama1b ...]" >&2
  exit 2
}
OUT_DIR="$(mkdir -p "$1" && cd "$1" && pwd)" || exit 2
shift
STAGES=("$@")
((${#STAGES[@]})) || STAGES=(suite compare fp8)
for s in "${STAGES[@]}"; do # all known before any runs
  case "$s" in
    suite | compare | fp8 | fp8bench | bert | llama | llama1b) ;;
    *)
      echo "run_all.sh: unknown stage '$s' (suite, compare, fp8, fp8bench, bert, llama, llama1b)" >&2
      exit 2 ;;
  esac
done
DEADLINE="${DEADLINE:-560}"
MIN_STAGE="${MIN_STAGE:-60}"
START=$SECONDS
WORK="$(mktemp -d)"
rc=0

left() { echo $((DEADLINE - (SECONDS - START))); }

# stage NAME SECONDS COMMAND...: COMMAND in WORK/NAME under timeout, its
# output to OUT_DIR/NAME.txt and the terminal, WORK/NAME packed after.
stage() {
  local name="$1" limit="$2" t0=$SECONDS code
  shift 2
  mkdir -p "$WORK/$name"
  (cd "$WORK/$name" && timeout -k 10 "$limit" "$@") 2>&1 | tee "$OUT_DIR/$name.txt"
  code=${PIPESTATUS[0]}
  echo "$name: exit $code after $((SECONDS - t0)) s" | tee -a "$OUT_DIR/$name.txt"
  tar -C "$WORK" -czf "$OUT_DIR/$name.tgz" "$name"
  ((code == 0)) || rc=1
}

for s in "${STAGES[@]}"; do
  l="$(left)"
  if ((l < MIN_STAGE)); then
    echo "$s: skipped ($l s left of $DEADLINE)" | tee "$OUT_DIR/$s.txt"
    rc=1
    continue
  fi
  case "$s" in
    suite) stage suite "$l" env BUDGET=$((l > 20 ? l - 10 : l)) "$B/run.sh" logs ;;
    compare) stage compare "$l" env STEPS=3 OUT=compare "$B/run_compare.sh" ;;
    fp8) stage fp8 "$l" env BENCH_LOGS=logs "$B/run_fp8.sh" "${FP8_STEPS:-200}" ;;
    fp8bench) # with the bundle's libraries (env.sh), as run.sh runs the tests
      stage fp8bench "$l" bash -c 'source "$0/env.sh" && exec "$0/bench_fp8" 16384 10' "$B" ;;
    bert | llama | llama1b)
      case "$s" in
        bert) m=bert-base:256x128 ;;
        llama) m=llama-124m:32x1024 ;;
        *) m=llama-1.1b:8x2048 ;;
      esac
      stage "$s" "$l" env MODELS="$m" IMPLS="tessera torch-compile" BENCH_LOGS=logs \
        BENCH_JSON=bench_gpu.json "$B/run_bench.sh" 15 ;;
  esac
done
rm -rf "$WORK"
echo "run_all: $((SECONDS - START)) s; files in $OUT_DIR"
exit $rc
