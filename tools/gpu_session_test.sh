#!/usr/bin/env bash
# The bundle's run_all.sh (tools/gpu_session.sh) on fake stage scripts: a
# stage that passes, one that fails, one that hangs past the deadline, one
# skipped for lack of time; an unknown one refused before any runs. Checks each stage's two files,
# its last line, the terminal's, the environment a stage gets, and the exit
# status.
#   gpu_session_test.sh GPU_SESSION_SH
set -uo pipefail
SESSION="$1"
source "$(dirname "$0")/testing.sh"
fails=0
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
B="$T/bundle"
mkdir -p "$B"
cp "$SESSION" "$B/run_all.sh"
fake() { # fake NAME BODY
  printf '#!/usr/bin/env bash\n%s\n' "$2" >"$B/$1"
  chmod +x "$B/$1"
}
fake run.sh 'mkdir -p "$1"; echo "budget $BUDGET" >"$1/summary.txt"; echo "8 passed, 0 failed"'
fake run_bench.sh 'echo "bench $MODELS / $IMPLS / $1"; mkdir -p "$BENCH_LOGS"; echo x >"$BENCH_LOGS/a.log"; exit 1'
fake run_fp8.sh 'echo "fp8 $1"; exec sleep 100'
fake run_compare.sh 'echo compare'
fake bench_fp8 'echo "bench_fp8 $* $FROM_ENV"'
printf 'export FROM_ENV=env.sh\n' >"$B/env.sh"

t0=$SECONDS
out="$(DEADLINE=8 MIN_STAGE=3 "$B/run_all.sh" "$T/out" suite bert fp8 compare 2>&1)"
rc=$?
took=$((SECONDS - t0))
echo "$out"
check_eq "exit status" 1 "$rc"
check "the deadline held" "yes" "$( ((took <= 14)) && echo yes || echo "no: $took s")"
check_eq "suite's last line" "suite: exit 0 after" "$(tail -n 1 "$T/out/suite.txt" | cut -d' ' -f1-4)"
budget="$(tar -xOzf "$T/out/suite.tgz" suite/logs/summary.txt)"
check "suite's budget: the time left (8 s at most, no margin under 20)" "yes" \
  "$([[ "$budget" =~ ^budget\ ([1-8])$ ]] && echo yes || echo "no: $budget")"
check "bench got its model and impls" "bench bert-base:256x128 / tessera torch-compile / 15" \
  "$(cat "$T/out/bert.txt")"
check_eq "bench's failure" "bert: exit 1 after" "$(tail -n 1 "$T/out/bert.txt" | cut -d' ' -f1-4)"
check "bench's logs packed" "bert/logs/a.log" "$(tar -tzf "$T/out/bert.tgz")"
check "fp8 got its steps" "fp8 200" "$(cat "$T/out/fp8.txt")"
check_eq "fp8 killed at the deadline" "fp8: exit 124 after" \
  "$(tail -n 1 "$T/out/fp8.txt" | cut -d' ' -f1-4)"
check "compare skipped" "compare: skipped" "$(cat "$T/out/compare.txt")"
check_eq "two files a stage, one for a skipped one" \
  "bert.tgz bert.txt compare.txt fp8.tgz fp8.txt suite.tgz suite.txt" \
  "$(cd "$T/out" && ls | tr '\n' ' ' | sed 's/ $//')"
check "terminal's last line" "run_all: " "$(tail -n 1 <<<"$out")"

# No stage fails: exit 0.
out="$(DEADLINE=30 MIN_STAGE=3 "$B/run_all.sh" "$T/ok" suite fp8bench 2>&1)"
check_eq "all passed: exit status" 0 "$?"
check "fp8bench: its arguments, the bundle's env.sh sourced" "bench_fp8 16384 10 env.sh" \
  "$(cat "$T/ok/fp8bench.txt")"
# An unknown stage: refused before any stage runs.
mkdir -p "$T/bad"
out="$("$B/run_all.sh" "$T/bad" suite bogus 2>&1)"
check_eq "unknown stage: exit status" 2 "$?"
check_eq "unknown stage: the line" \
  "run_all.sh: unknown stage 'bogus' (suite, compare, fp8, fp8bench, bert, llama, llama1b)" "$out"
check_eq "unknown stage: nothing ran" "" "$(ls "$T/bad")"
# Usage.
out="$("$B/run_all.sh" 2>&1)"
check_eq "no OUT_DIR: exit status" 2 "$?"

((fails == 0)) || { echo "$fails failure(s)"; exit 1; }
echo "all passed"
