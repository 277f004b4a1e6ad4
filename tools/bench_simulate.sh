#!/usr/bin/env bash
# bench_simulate.sh — `tessera simulate` against the runs it can compare
# with (the issue asks within 20%), one script run:
#  A. this machine: MODEL at ZeRO 0-3 on 2 and 4 ranks, and hybrid
#     --shard-group 2 on 4;
#  B. the test bed (tools/cluster.sh; root): 2 nodes whose links tc shapes
#     to RATE each way (a token bucket on each node's eth0), ZeRO 0-3 with
#     one rank per node, and 2 x 2 ranks plain ZeRO-3 against hybrid S = 2.
# Every run: micro-batches of 2 x SEQ tokens, one per rank and step (the
# global batch grows with the ranks, so each rank's work is the profile's),
# STEPS steps; measured = the median step_seconds of steps 4.. (metrics),
# predicted = simulate's step.
#
# What the simulator is given, each measured once here and never fitted to
# the runs it predicts:
#  - compute: one rank with OMP_NUM_THREADS=1 (each rank's share of the
#    cores in every run), `train --trace`: the median forward, backward
#    and optimizer spans (--profile), and the step's time outside them
#    (--step-overhead: median step less the spans' sum); with 4 ranks,
#    --shared-cores (this machine's, which the test bed's nodes share
#    too): N / cores slower, but for a pipeline's stages waiting for
#    another, which leave their cores to the others;
#  - the link within this machine (Open MPI's shared memory, tessera's
#    direct exchanges): from one more run, 2 ranks ZeRO-0 --overlap off
#    (every collective waited for whole): bandwidth = its bytes per step /
#    (its step - the predicted compute - calls x 10 us);
#  - the link across nodes: TCP through the bucket carries another rate
#    than RATE (two thirds of it at 200mbit, and less in bursts than when
#    streaming), so its bandwidth is fitted on the test bed's ZeRO-0 run
#    (one rank per node): the bandwidth at which the simulator's step
#    equals that run's (bisection); latency 100 us assumed (netem, which
#    would add one, is absent here). That row is the fit, the others are
#    predictions.
# Pipeline rows: 2 and 4 ranks here and one stage per node on the test bed,
# 4 or 8 micro-batches per step (GLOBAL sequences), GPipe, 1F1B,
# interleaved (2 chunks per stage), ZB-H1 and ZB-V.
# PARTS="A B" (default) runs both; with PARTS=B, INTRA=GB/s skips part A.
#
#   tools/bench_simulate.sh [MODEL] [STEPS] [SEQ] [RATE]
#     (default llama-small, 12, 128, 1gbit). TESSERA_BIN as in bench_env.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:-llama-small}"
STEPS="${2:-12}"
SEQ="${3:-128}"
RATE="${4:-1gbit}"
cd "$ROOT"
# shellcheck source=tools/bench_env.sh
source tools/bench_env.sh # BIN, DATA, TMP
export PATH="$PATH:/usr/sbin:/sbin"
cores="$(nproc)"

# median_step METRICS — the median step_seconds of steps 4..
median_step() { tools/step_overhead.sh --median-step "$1"; }
# field JSON KEY — stages[0][KEY] of a simulate --json
field() { python3 -c 'import json,sys; print(json.load(sys.stdin)["stages"][0][sys.argv[1]])' "$1"; }
# train N NAME FLAGS... — N ranks on this machine, OMP_NUM_THREADS=1
train() {
  local n="$1" name="$2"
  shift 2
  OMP_NUM_THREADS=1 tools/launch.sh -n "$n" "$BIN" train --model "$MODEL" --data "$DATA" \
    --seq "$SEQ" --global-batch "${GLOBAL:-$((2 * n))}" --micro-batch 2 --steps "$STEPS" \
    --log-every "$STEPS" \
    --eval-batches 1 --metrics "$TMP/$name.jsonl" "$@" >"$TMP/$name.log" 2>&1
}

# 1. the compute profile: one rank, one thread
OMP_NUM_THREADS=1 "$BIN" train --model "$MODEL" --data "$DATA" --seq "$SEQ" --micro-batch 2 \
  --steps "$STEPS" --log-every "$STEPS" --eval-batches 1 --metrics "$TMP/prof.jsonl" \
  --trace "$TMP/prof.trace.json" >"$TMP/prof.log" 2>&1
overhead="$(tools/step_overhead.sh "$TMP/prof.trace.json" "$TMP/prof.jsonl")"
sim() { # sim N FLAGS... — simulate --json, this profile
  local n="$1"
  shift
  "$BIN" simulate --model "$MODEL" -n "$n" --dtype fp32 --micro-batch 2 --seq "$SEQ" \
    --profile "$TMP/prof.trace.json" --step-overhead "$overhead" --algorithm direct --json "$@"
}

PARTS="${PARTS:-A B}"
# 2. the link within this machine, from 2 ranks ZeRO-0 without overlap
if [[ -n "${INTRA:-}" ]]; then
  intra="$INTRA"
else
train 2 fit --zero 0 --overlap off
fit_step="$(median_step "$TMP/fit.jsonl")"
fit="$(sim 2 --zero 0 --overlap off --ranks-per-node 2 --intra 1e9,0 --inter 1e9,0)"
intra="$(python3 - "$fit_step" "$(field compute_s <<<"$fit")" "$(field comm_bytes_per_step <<<"$fit")" \
  "$(field calls <<<"$fit")" <<'EOF'
import sys
step, compute, nbytes, calls = map(float, sys.argv[1:])
print("%.6g" % (nbytes / max(1e-9, step - compute - calls * 10e-6) / 1e9))
EOF
)"
fi
printf '%s, %s steps, micro-batch 2 x %s per rank, fp32; compute: one rank, one thread (%s cores); ' \
  "$MODEL" "$STEPS" "$SEQ" "$cores"
printf 'step overhead %.4f s; within this machine %s GB/s, 10 us (fitted: 2 ranks ZeRO-0, overlap off)\n' \
  "$overhead" "$intra"
printf '| where | ranks | run | measured s/step | predicted s/step | predicted / measured | within 20%% | exposed comm s (predicted) | MB across nodes (counted = predicted) |\n'
printf '| :--- | ---: | :--- | ---: | ---: | ---: | :---: | ---: | :---: |\n'
row() { # row WHERE N RUN MEASURED SIM_JSON [COUNTED_ACROSS]
  local p
  p="$(field step_s <<<"$5")"
  python3 - "$@" "$p" "$(field exposed_comm_s <<<"$5")" "$(field comm_bytes_across_nodes_per_step <<<"$5")" <<'EOF'
import sys
where, n, run, measured, _, *rest = sys.argv[1:]
counted = rest[0] if len(rest) == 4 else None
pred, exposed, across = map(float, rest[-3:])
m = float(measured)
ok = "yes" if abs(pred / m - 1) <= 0.2 else "no"
bytes_col = "—" if counted is None else ("%.2f = %.2f" % (float(counted) / 1e6, across / 1e6) if float(counted) == across else "%.2f != %.2f" % (float(counted) / 1e6, across / 1e6))
print("| %s | %s | %s | %.4f | %.4f | %.2f | %s | %.4f | %s |" % (where, n, run, m, pred, pred / m, ok, exposed, bytes_col))
EOF
}

# A. this machine
[[ " $PARTS " == *" A "* ]] && for n in 2 4; do
  for z in 0 1 2 3; do
    train "$n" "m$n-$z" --zero "$z"
    row "this machine" "$n" "ZeRO-$z" "$(median_step "$TMP/m$n-$z.jsonl")" \
      "$(sim "$n" --zero "$z" --ranks-per-node "$n" --intra "$intra,10" --shared-cores "$cores")"
  done
done
if [[ " $PARTS " == *" A "* ]]; then
  train 4 m4-hy --zero 3 --shard-group 2
  row "this machine" 4 "ZeRO-3, S = 2" "$(median_step "$TMP/m4-hy.jsonl")" \
    "$(sim 4 --zero 3 --shard-group 2 --ranks-per-node 4 --intra "$intra,10" --shared-cores "$cores")"
  # pipelines: N ranks, P stages, M micro-batches per step, a schedule, a
  # ZeRO stage (interleaved: 2 model chunks per stage)
  for run in "2 2 4 gpipe 0" "2 2 4 1f1b 0" "4 2 4 1f1b 1" "4 4 8 1f1b 0" "2 2 8 1f1b 0" \
    "2 2 8 interleaved 0" "2 2 8 zb-h1 0" "2 2 8 zbv 0" "4 4 8 interleaved 0" "4 4 8 zb-h1 0" \
    "4 4 8 zbv 0"; do
    read -r n P M k z <<<"$run"
    more=()
    [[ "$k" == interleaved ]] && more=(--virtual-stages 2)
    name="m$n-pp$P-$k-$M"
    GLOBAL=$((n / P * 2 * M)) train "$n" "$name" --zero "$z" --pipeline "$P" --schedule "$k" \
      "${more[@]}"
    row "this machine" "$n" "ZeRO-$z, $P stages, $k, $M micro-batches" \
      "$(median_step "$TMP/$name.jsonl")" \
      "$(sim "$n" --zero "$z" --pipeline "$P" --schedule "$k" "${more[@]}" --grad-accum "$M" \
        --ranks-per-node "$n" --intra "$intra,10" --shared-cores "$cores")"
  done
fi
[[ " $PARTS " == *" B "* ]] || exit 0

# B. the test bed, links shaped to RATE
if ! tools/cluster.sh check >/dev/null 2>&1; then
  echo "(the test bed: $(tools/cluster.sh check 2>&1))"
  exit 0
fi
export TS_CLUSTER="bs$$" TS_CLUSTER_NET=231
tools/cluster.sh up 2 >/dev/null
trap 'tools/cluster.sh down >/dev/null 2>&1; rm -rf "$TMP"' EXIT
n1="$TS_CLUSTER-n1" n2="$TS_CLUSTER-n2"
tools/cluster.sh shape "$n1" "$RATE"
tools/cluster.sh shape "$n2" "$RATE"
rate_gbs="$(python3 -c "
import re; m = re.match(r'([0-9.]+)([kmg]?)(bit|bps)', '$RATE'); v = float(m[1]) * {'': 1, 'k': 1e3, 'm': 1e6, 'g': 1e9}[m[2]]
print(v / 8e9 if m[3] == 'bit' else v / 1e9)")"
mpienv="$(tools/cluster.sh mpirun-env)"
bed() { # bed PER_NODE NAME FLAGS... — 2 nodes x PER_NODE ranks, OMP_NUM_THREADS=1
  local per="$1" name="$2" n=$((2 * $1))
  shift 2
  printf '%s slots=%s\n%s slots=%s\n' "$n1" "$per" "$n2" "$per" >"$TMP/hostfile"
  (
    eval "$mpienv"
    export OMP_NUM_THREADS=1
    tools/cluster.sh exec "$n1" tools/launch.sh -n "$n" --hostfile "$TMP/hostfile" "$BIN" train \
      --model "$MODEL" --data "$DATA" --seq "$SEQ" --global-batch "${GLOBAL:-$((2 * n))}" --micro-batch 2 \
      --steps "$STEPS" --log-every "$STEPS" --eval-batches 1 --metrics "$TMP/$name.jsonl" "$@" \
      >"$TMP/$name.log" 2>&1
  )
}
across() { python3 -c 'import json,sys; print(int(json.loads(open(sys.argv[1]).readlines()[-1])["summary"]["comm_bytes_across_nodes_per_step"]))' "$1"; }
# the fit: the bandwidth at which the simulated ZeRO-0 step (one rank per
# node) equals the measured one; the simulator's step falls as it grows
bed 1 b1-0 --zero 0
target="$(median_step "$TMP/b1-0.jsonl")"
lo=0.001 hi=100
for _ in $(seq 40); do
  mid="$(python3 -c "print(($lo * $hi) ** 0.5)")"
  p="$(sim 2 --zero 0 --ranks-per-node 1 --intra "$intra,10" --inter "$mid,100" | field step_s)"
  if python3 -c "import sys; sys.exit(0 if $p > $target else 1)"; then lo="$mid"; else hi="$mid"; fi
done
inter="$(python3 -c "print('%.4g' % (($lo * $hi) ** 0.5))")"
echo "(the test bed: each node's link shaped to $RATE = $rate_gbs GB/s; TCP through it fitted at $inter GB/s on the ZeRO-0 row, one rank per node)"
row "2 nodes, $RATE (the fit)" 2 "ZeRO-0" "$target" \
  "$(sim 2 --zero 0 --ranks-per-node 1 --intra "$intra,10" --inter "$inter,100")" \
  "$(across "$TMP/b1-0.jsonl")"
for z in 1 2 3; do
  bed 1 "b1-$z" --zero "$z"
  row "2 nodes, $RATE" 2 "ZeRO-$z" "$(median_step "$TMP/b1-$z.jsonl")" \
    "$(sim 2 --zero "$z" --ranks-per-node 1 --intra "$intra,10" --inter "$inter,100")" \
    "$(across "$TMP/b1-$z.jsonl")"
done
for run in "plain 0" "hybrid 2"; do
  read -r name S <<<"$run"
  flags=(--zero 3)
  ((S)) && flags+=(--shard-group "$S")
  bed 2 "b2-$name" "${flags[@]}"
  row "2 nodes, $RATE" 4 "ZeRO-3$( ((S)) && echo ", S = $S")" "$(median_step "$TMP/b2-$name.jsonl")" \
    "$(sim 4 "${flags[@]}" --ranks-per-node 2 --intra "$intra,10" --inter "$inter,100" \
      --shared-cores "$cores")" "$(across "$TMP/b2-$name.jsonl")"
done
# a pipeline of 2 stages, one per node: activations and their gradients
# cross the shaped link
GLOBAL=8 bed 1 b1-pp --zero 0 --pipeline 2 --schedule 1f1b
row "2 nodes, $RATE" 2 "ZeRO-0, 2 stages, 1f1b, 4 micro-batches" "$(median_step "$TMP/b1-pp.jsonl")" \
  "$(sim 2 --zero 0 --pipeline 2 --schedule 1f1b --grad-accum 4 --ranks-per-node 1 \
    --intra "$intra,10" --inter "$inter,100")" "$(across "$TMP/b1-pp.jsonl")"
