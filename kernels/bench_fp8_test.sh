#!/usr/bin/env bash
# bench_fp8 on the CPU (the fp8 reference; M 16, one call per figure): its
# table has a row per shape with every cell a number, the block's three
# rows with bf16's ratio 1.00, and exit 0; bad arguments are one line and
# exit 2; --device cuda without a GPU is one line and exit 1.
#   bench_fp8_test.sh BENCH_FP8
set -uo pipefail
bin="$1"
source "$(dirname "${BASH_SOURCE[0]}")/../tools/testing.sh"
fails=0

out="$(OMP_NUM_THREADS=2 "$bin" --device cpu 16 1 2>&1)"
check_eq "cpu run: exit status" 0 "$?"
echo "$out"
for row in "| q, o | 2048 x 2048 |" "| k, v | 256 x 2048 |" "| gate, up | 5632 x 2048 |" \
  "| down | 2048 x 5632 |"; do
  line="$(grep -F "$row" <<<"$out")"
  check "row $row" "$row" "$line"
  # ten cells after the name and shape, each a number of ms
  check_eq "row $row: eight figures" 8 "$(tr '|' '\n' <<<"$line" | grep -cE '^ [0-9]+\.[0-9]{3} $')"
done
check "block: bf16 is the baseline" "| bf16 |" "$(grep -F "| bf16 |" <<<"$out")"
check "block: bf16's ratio" "| 1.00 |" "$(grep -F "| bf16 |" <<<"$out")"
check "block: tensorwise" "| fp8 tensorwise |" "$out"
check "block: rowwise" "| fp8 rowwise |" "$out"
absent "nothing failed" "failed" "$out"

bad() { # bad NAME EXIT EXPECTED-LINE ARGS...
  local name="$1" code="$2" want="$3"
  shift 3
  local err
  err="$("$bin" "$@" 2>&1 >/dev/null)"
  check_eq "$name: exit status" "$code" "$?"
  check_eq "$name: first line" "$want" "$(head -n 1 <<<"$err")"
}
bad "M not a multiple of 16" 2 "bench_fp8: M: expected a multiple of 16, >= 16" --device cpu 24
bad "REPS" 2 "bench_fp8: REPS: expected an integer >= 1" --device cpu 16 0
bad "device" 2 "bench_fp8: --device: expected cpu or cuda" --device tpu
if ! nvidia-smi -L >/dev/null 2>&1; then
  err="$("$bin" --device cuda 16 1 2>&1 >/dev/null)"
  check_eq "no GPU: exit status" 1 "$?"
  check "no GPU: says so" "bench_fp8: --device cuda: " "$err"
  check_eq "no GPU: one line" 1 "$(lines "$err")"
fi

((fails == 0)) || { echo "$fails failure(s)"; exit 1; }
echo "all passed"
