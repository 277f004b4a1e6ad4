#!/usr/bin/env bash
# compare_test.sh — `tessera compare` on llama-tiny and 2 ranks (2 steps,
# generated token shards) writes compare.md, compare.csv and compare.png
# with its three checks passing; fed back its own metrics with one loss
# changed by one ulp (or one rank's optimizer bytes changed), the same
# command must report FAIL and exit 1; the pipeline axis (per-stage plans,
# schedules' losses, timelines); bad input is a one-line error.
#   compare_test.sh TESSERA_BIN
set -uo pipefail
bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fails=0

# check, check_eq, absent, lines
source "$(dirname "${BASH_SOURCE[0]}")/testing.sh"

# The runfiles root holds models/configs/ and tools/launch.sh.
for root in "${TEST_SRCDIR:-}/${TEST_WORKSPACE:-}" "${RUNFILES_DIR:-}/${TEST_WORKSPACE:-}" "$PWD"; do
  if [[ -f "$root/tools/launch.sh" ]]; then
    export TESSERA_HOME="$root"
    break
  fi
done
[[ -n "${TESSERA_HOME:-}" ]] || { echo "FAIL: no runfiles root with tools/launch.sh"; exit 1; }

mpi_scratch
make_token_shards "$tmp/data"

out="$tmp/out"
log="$("$bin" compare --model llama-tiny -n 2 --data "$tmp/data" --steps 2 --micro-batch 2 \
  --seq 64 --out "$out" 2>&1)"
rc=$?
check_eq "compare exit code" 0 "$rc"
for f in compare.md compare.csv compare.png; do
  [[ -s "$out/$f" ]] && echo "ok   $f written" || { echo "FAIL $f missing"; fails=$((fails + 1)); }
done
check_eq "png" "PNG" "$(head -c 4 "$out/compare.png" 2>/dev/null | tail -c 3)"
md="$(cat "$out/compare.md" 2>/dev/null)"
check "model states check" "PASS: model states" "$md"
check "falling check" "PASS: model states per rank fall" "$md"
check "loss check" "PASS: loss identical" "$md"
check "stage 3 row" "| fp32 recompute:none ZeRO-3 |" "$md"
absent "no failure" "FAIL" "$md"
check "terminal shows the table" "PASS: loss identical" "$log"
# One row per run and rank, a header: 4 stages x 2 ranks.
check_eq "csv rows" 9 "$(wc -l <"$out/compare.csv")"
check "csv header" "params_measured,params_estimate" "$(head -n 1 "$out/compare.csv")"

# Hybrid sharding: 4 ranks in groups of 2, stages 0 and 3: the model states
# equal the plan and the ZeRO formula over N = S = 2, the losses are
# identical, and the bytes across nodes are a column (0 on one node).
hy="$tmp/hybrid"
log="$("$bin" compare --model llama-tiny -n 4 --data "$tmp/data" --zero 0,3 --shard-group 2 \
  --steps 2 --micro-batch 2 --seq 64 --out "$hy" 2>&1)"
check_eq "hybrid: compare exit code" 0 "$?"
md="$(cat "$hy/compare.md" 2>/dev/null)"
check "hybrid: says so" "Hybrid sharding (--shard-group 2): ZeRO within groups of 2" "$md"
check "hybrid: model states check" "PASS: model states" "$md"
check "hybrid: loss check" "PASS: loss identical" "$md"
absent "hybrid: no failure" "FAIL" "$md"
check "hybrid: csv column" "comm_ratio,comm_bytes_across_nodes_per_step,losses_identical" \
  "$(head -n 1 "$hy/compare.csv")"
out2="$("$bin" compare --model llama-tiny -n 4 --zero 0 --shard-group 3 --reuse --out "$hy" 2>&1)"
check_eq "hybrid: --shard-group 3 exit code" 2 "$?"
check_eq "hybrid: --shard-group 3 line" "tessera compare: --shard-group 3: expected a divisor of \
the 4 data-parallel ranks of -n 4" "$out2"

# The loss check itself: step 2 of stage 2 moved by one ulp.
cp -r "$out" "$tmp/loss"
python3 - "$tmp/loss/compare_runs/fp32-none-zero2.jsonl" <<'PY'
import json, math, sys
p = sys.argv[1]
lines = [json.loads(l) for l in open(p)]
steps = [o for o in lines if "tokens_per_s" in o]
steps[1]["loss"] = math.nextafter(steps[1]["loss"], math.inf)
open(p, "w").write("".join(json.dumps(o) + "\n" for o in lines))
PY
log="$("$bin" compare --model llama-tiny -n 2 --steps 2 --micro-batch 2 --seq 64 \
  --out "$tmp/loss" --reuse 2>&1)"
rc=$?
check_eq "differing losses exit code" 1 "$rc"
check "differing losses fail" "FAIL: loss identical" "$log"
check "names the run and step" "fp32 recompute:none ZeRO-2, step 2" "$log"
check "other checks still pass" "PASS: model states (" "$log"
check "md says so too" "FAIL: loss identical" "$(cat "$tmp/loss/compare.md")"

# The model-state check: rank 1's Adam state one byte more than planned.
cp -r "$out" "$tmp/mem"
python3 - "$tmp/mem/compare_runs/fp32-none-zero1.jsonl" <<'PY'
import json, sys
p = sys.argv[1]
lines = [json.loads(l) for l in open(p)]
lines[-1]["summary"]["mem_by_rank"][1]["optim"] += 1
open(p, "w").write("".join(json.dumps(o) + "\n" for o in lines))
PY
log="$("$bin" compare --model llama-tiny -n 2 --steps 2 --micro-batch 2 --seq 64 \
  --out "$tmp/mem" --reuse 2>&1)"
rc=$?
check_eq "memory mismatch exit code" 1 "$rc"
check "memory mismatch fails" "FAIL: model states (" "$log"
check "names the rank" "fp32 recompute:none ZeRO-1, rank 1" "$log"

# The pipeline axis: P = 1 and 2 at ZeRO 1, GPipe, 1F1B, interleaved (2
# chunks), ZB-H1 and ZB-V, 4 micro-batches: every rank's plan is its
# stage's (the model-state check), the schedules train the same losses
# (the loss check), the per-rank table names the stages (each chunk's
# units), and each pipelined run's timeline is drawn.
pp="$tmp/pp"
log="$("$bin" compare --model llama-tiny -n 2 --data "$tmp/data" --steps 2 --micro-batch 2 \
  --seq 64 --zero 1 --pipeline 1,2 --schedule gpipe,1f1b,interleaved,zb-h1,zbv --out "$pp" 2>&1)"
check_eq "pipeline compare exit code" 0 "$?"
md="$(cat "$pp/compare.md" 2>/dev/null)"
check "pipeline: model states check" "PASS: model states" "$md"
check "pipeline: loss check across schedules" "PASS: loss identical at every step across ZeRO stages, schedules" "$md"
check "pipeline: per-rank table names the stages" "| fp32 recompute:none P2 1f1b ZeRO-1 | s0 (0.." "$md"
check "pipeline: timeline linked" "![timeline](timeline-fp32-none-p2-gpipe-zero1.png)" "$md"
check "pipeline: interleaved's chunks" "| fp32 recompute:none P2 interleaved-v2 ZeRO-1 | s0 (0..1,3..4)" "$md"
check "pipeline: ZB-V's V" "| fp32 recompute:none P2 zbv ZeRO-1 | s0 (0..1,5..5)" "$md"
check "pipeline: ZB-V's bubble in theory, (P-1)/(6m+P-1)" \
  "on the busiest rank, 4.0% in theory (its schedule's formula" \
  "$(grep "P2 zbv ZeRO-1: step" <<<"$md")"
for f in timeline-fp32-none-p2-gpipe-zero1.png timeline-fp32-none-p2-1f1b-zero1.png \
  timeline-fp32-none-p2-interleaved-v2-zero1.png timeline-fp32-none-p2-zb-h1-zero1.png \
  timeline-fp32-none-p2-zbv-zero1.png; do
  check_eq "pipeline: $f is a PNG" "PNG" "$(head -c 4 "$pp/$f" 2>/dev/null | tail -c 3)"
done
check "pipeline: csv has the stage" "pipeline,schedule,world_size,rank,pipeline_stage" \
  "$(head -n 1 "$pp/compare.csv")"
# 1F1B and GPipe losses must agree: one ulp off in the 1F1B run fails.
cp -r "$pp" "$tmp/pp_loss"
python3 - "$tmp/pp_loss/compare_runs/fp32-none-p2-1f1b-zero1.jsonl" <<'PY'
import json, math, sys
p = sys.argv[1]
lines = [json.loads(l) for l in open(p)]
steps = [o for o in lines if "tokens_per_s" in o]
steps[0]["loss"] = math.nextafter(steps[0]["loss"], -math.inf)
open(p, "w").write("".join(json.dumps(o) + "\n" for o in lines))
PY
log="$("$bin" compare --model llama-tiny -n 2 --steps 2 --micro-batch 2 --seq 64 --zero 1 \
  --pipeline 1,2 --schedule gpipe,1f1b --out "$tmp/pp_loss" --reuse 2>&1)"
check_eq "pipeline: differing schedule losses exit code" 1 "$?"
check "pipeline: names the 1F1B run" "fp32 recompute:none P2 1f1b ZeRO-1, step 1" "$log"

# --no-chart: the same report without pictures (a GPU machine without
# gnuplot): no compare.png, no timeline links, the bubbles still measured.
cp -r "$pp" "$tmp/pp_nochart"
rm -f "$tmp/pp_nochart"/*.png "$tmp/pp_nochart/compare.md"
log="$("$bin" compare --model llama-tiny -n 2 --steps 2 --micro-batch 2 --seq 64 --zero 1 \
  --pipeline 1,2 --schedule gpipe,1f1b,interleaved,zb-h1,zbv --out "$tmp/pp_nochart" --reuse \
  --no-chart 2>&1)"
check_eq "no chart: exit code" 0 "$?"
md="$(cat "$tmp/pp_nochart/compare.md" 2>/dev/null)"
check "no chart: checks pass" "PASS: loss identical" "$md"
check "no chart: bubble still measured" "on the busiest rank, 4.0% in theory" \
  "$(grep "P2 zbv ZeRO-1: step" <<<"$md")"
absent "no chart: no picture linked" ".png" "$md"
check_eq "no chart: no png written" 0 "$(find "$tmp/pp_nochart" -name '*.png' | wc -l)"
check "no chart: terminal names md and csv only" "compare.md, $tmp/pp_nochart/compare.csv" \
  "$(tail -n 1 <<<"$log")"

# A run measured on a GPU: llama-124m bf16, ZeRO-0 on 2 ranks sharing one
# H200 (`.gpu/run_compare.sh`, 2026-11-28; testdata/compare_h200): its
# ledger equals this binary's cuda plan on both ranks, and the report
# says the ledger is the GPU's.
mkdir -p "$tmp/h200"
cp -r "$(dirname "${BASH_SOURCE[0]}")/testdata/compare_h200/compare_runs" "$tmp/h200/"
log="$("$bin" compare --model llama-124m -n 2 --zero 0 --dtype bf16 --micro-batch 4 --seq 1024 \
  --steps 3 --device cuda --reuse --no-chart --out "$tmp/h200" 2>&1)"
check_eq "h200: exit code" 0 "$?"
md="$(cat "$tmp/h200/compare.md" 2>/dev/null)"
check "h200: measured = plan" "PASS: model states" "$md"
check "h200: the ledger is the GPU's" "the ledger counts each rank's device memory" "$md"
absent "h200: not called CPU ranks" "CPU ranks" "$md"
check "h200: rank 1's peak" "| bf16 recompute:none ZeRO-0 | 3712.83 / 3712.83 (0) | 3712.83 / 3712.83 (0) |" "$md"
"$bin" compare --model llama-124m -n 2 --zero 0 --dtype bf16 --micro-batch 4 --seq 1024 \
  --steps 3 --reuse --no-chart --out "$tmp/h200" >/dev/null 2>&1
check "h200 read as cpu ranks: says so" "Device memory: none (CPU ranks)." \
  "$(cat "$tmp/h200/compare.md" 2>/dev/null)"

# Bad input: one line, exit 2, before any run.
bad() { # bad NAME EXPECTED-SUBSTRING ARGS...
  local name="$1" want="$2"
  shift 2
  local err
  err="$("$bin" compare "$@" 2>&1 >/dev/null)"
  local code=$?
  err_last="$err"
  check_eq "$name exit code" 2 "$code"
  check "$name message" "$want" "$err"
  check_eq "$name: one line" 1 "$(lines "$err")"
}
bad "unknown preset" "no-such-model" --model no-such-model -n 2 --out "$tmp/bad"
bad "ranks" "-n 0: expected an integer >= 1 (digits, or such as 1e9 or 7.5e9)" --model llama-tiny -n 0
bad "stage" "--zero 1,4: expected ZeRO stages 0, 1, 2 or 3 (not 4)" \
  --model llama-tiny -n 2 --zero 1,4
bad "dtype" "fp8" --model llama-tiny -n 2 --dtype fp32,fp8
# Past four stages, and past the list's room (stages[] once overflowed at a fifth).
bad "five stages" "--zero: at most the four stages 0, 1, 2, 3" \
  --model llama-tiny -n 2 --zero 0,1,2,3,0
bad "nine stages" "--zero 0,0,0,0,0,0,0,0,0: expected at most 8 values" \
  --model llama-tiny -n 2 --zero 0,0,0,0,0,0,0,0,0
grep -v '"hidden_size"' "$TESSERA_HOME/models/configs/llama-tiny.json" >"$tmp/no_hidden.json"
bad "pipeline not dividing" "--pipeline 3: expected a number of stages dividing -n 2" \
  --model llama-tiny -n 2 --pipeline 1,3
bad "schedule" "--schedule zigzag: expected gpipe, 1f1b, interleaved, zb-h1 or zbv" --model llama-tiny -n 2 --schedule zigzag
bad "config missing a field" "no_hidden.json" --model "$tmp/no_hidden.json" -n 2
check "names the field" "hidden_size" "$err_last"
# Without gnuplot (hidden by /dev/null, which is not executable, in a mount
# namespace of this test's own), compare refuses before any run.
if unshare -m true 2>/dev/null; then
  err="$(unshare -m bash -c 'mount --bind /dev/null /usr/bin/gnuplot && exec "$0" compare \
    --model llama-tiny -n 2 --out "$1"' "$bin" "$tmp/bad" 2>&1 >/dev/null)"
  check_eq "no gnuplot: exit code" 2 "$?"
  check_eq "no gnuplot: line" "tessera compare: /usr/bin/gnuplot not found: install gnuplot-nox \
(tools/setup.sh does), or pass --no-chart" "$err"
else
  echo "note no mount namespace here (not root): the no-gnuplot refusal is not checked"
fi
[[ ! -e "$tmp/bad" ]] && echo "ok   nothing written on bad input" ||
  { echo "FAIL: bad input created $tmp/bad"; fails=$((fails + 1)); }

((fails == 0)) || { echo "$fails failure(s)"; exit 1; }
echo "all passed"
