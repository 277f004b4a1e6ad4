#!/usr/bin/env bash
# bench_before_after.sh — speed before and after a change, in one script
# run on this machine: tools/bench_train.sh and tools/bench_zero.sh run with
# the tessera of an earlier revision and with the working tree's, one after
# the other, ROUNDS times (before, after, before, after, ...), so drifts of
# the machine (other load, thermal) fall on both alike.
#
#   tools/bench_before_after.sh BASE_REV [ROUNDS] [STEPS]   (default 3, 20)
#
# Prints, per workload (llama-tiny and llama-small on one rank; ZeRO stages
# 0-3 of llama-tiny on 2 ranks), the median tokens/s of each side over the
# rounds, the spread (min-max) of each, and after / before. The raw tables
# of every run go to the log folder it names.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE_REV="${1:?usage: tools/bench_before_after.sh BASE_REV [ROUNDS] [STEPS]}"
ROUNDS="${2:-3}"
STEPS="${3:-20}"
cd "$ROOT"
tools/setup.sh
read -r BEFORE_BIN BEFORE_TREE < <(tools/build_rev.sh "$BASE_REV")
bazel build --ui_event_filters=-info,-progress --noshow_progress //tools:tessera
cp bazel-bin/tools/tessera "${TMPDIR:-/tmp}/tessera-after.$$"
AFTER_BIN="${TMPDIR:-/tmp}/tessera-after.$$"
LOG="$(mktemp -d)"
trap 'rm -f "$AFTER_BIN"' EXIT
echo "before: $BASE_REV ($BEFORE_BIN), after: the working tree; $ROUNDS rounds of $STEPS steps;" \
  "logs in $LOG"

for round in $(seq 1 "$ROUNDS"); do
  for side in before after; do
    if [[ $side == before ]]; then bin="$BEFORE_BIN" home="$BEFORE_TREE"; else bin="$AFTER_BIN" home="$ROOT"; fi
    for bench in train zero; do
      BENCH_JSON="$LOG/$side.jsonl" TESSERA_BIN="$bin" TESSERA_HOME="$home" \
        "tools/bench_$bench.sh" "$STEPS" >"$LOG/$side-$bench-$round.md" 2>&1
    done
  done
done

python3 - "$LOG" <<'PY'
import json, os, statistics, sys
log = sys.argv[1]
def load(side):
    runs = {}
    for line in open(os.path.join(log, side + ".jsonl")):
        r = json.loads(line)
        key = (f"train {r['model']}, 1 rank" if r["bench"] == "train"
               else f"zero {r['model']}, {r['ranks']} ranks, stage {r['stage']}")
        runs.setdefault(key, []).append(r["tokens_per_s"])
    return runs
before, after = load("before"), load("after")
print("| workload | tokens/s before (median, min-max) | tokens/s after (median, min-max) | after / before |")
print("| --- | --- | --- | --- |")
for key in before:
    b, a = before[key], after[key]
    mb, ma = statistics.median(b), statistics.median(a)
    print(f"| {key} | {mb:.0f} ({min(b):.0f}-{max(b):.0f}) | {ma:.0f} ({min(a):.0f}-{max(a):.0f}) "
          f"| {ma / mb:.3f} |")
PY
