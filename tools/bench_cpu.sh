#!/usr/bin/env bash
# CPU matrix products: the same one-rank training in fp32, in bf16 on fp32
# copies through OpenBLAS's sgemm (TESSERA_CPU_MATMUL=openblas, the path
# before oneDNN) and in bf16 through oneDNN's native kernel, interleaved
# in ROUNDS rounds in one script run, with the path each run's products
# took (`tessera train` prints it).
#
#   tools/bench_cpu.sh [MODEL] [STEPS] [ROUNDS]   (default llama-small, 8, 2)
#
# Micro-batch 16 x 128 tokens on one rank, OMP_NUM_THREADS = nproc. Prints
# first kernels/bench_matmul's table (every linear product of a llama-small
# step through tessera beside oneDNN's own primitive, M = 2048), then a
# Markdown table of the training runs: tokens/s per round (median over the
# steps after the first two) and the best round's ratio to fp32's best.
# TESSERA_BIN as in tools/bench_env.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:-llama-small}"
STEPS="${2:-8}"
ROUNDS="${3:-2}"
cd "$ROOT"
# shellcheck source=tools/bench_env.sh
source tools/bench_env.sh # BIN, DATA, TMP
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
bazel build --ui_event_filters=-info,-progress --noshow_progress //kernels:bench_matmul
bazel-bin/kernels/bench_matmul 2048
echo

RUNS=("fp32 -" "bf16 openblas" "bf16 -")
for ((r = 1; r <= ROUNDS; r++)); do
  for run in "${RUNS[@]}"; do
    read -r dtype path <<<"$run"
    name="$dtype-$path-$r"
    pre=(env)
    [[ "$path" == openblas ]] && pre+=(TESSERA_CPU_MATMUL=openblas)
    "${pre[@]}" "$BIN" train --model "$MODEL" --data "$DATA" --dtype "$dtype" --steps "$STEPS" \
      --micro-batch 16 --seq 128 --lr 1e-3 --warmup 2 --eval-batches 1 --log-every "$STEPS" \
      --metrics "$TMP/$name.jsonl" >"$TMP/$name.log" 2>&1
  done
done

python3 - "$TMP" "$MODEL" "$STEPS" "$ROUNDS" "$OMP_NUM_THREADS" <<'PY'
import json, os, re, statistics, sys
tmp, model, steps, rounds, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
print(f"{model}, micro-batch 16 x 128, one rank, {threads} threads, {steps} steps, {rounds} rounds")
print("| dtype | products | " + " | ".join(f"tokens/s round {r}" for r in range(1, rounds + 1)) + " | best / fp32 best |")
print("| :--- | :--- | " + " | ".join("---:" for _ in range(rounds)) + " | ---: |")
best = {}
rows = []
for dtype, path in (("fp32", "-"), ("bf16", "openblas"), ("bf16", "-")):
    rates, impl = [], "?"
    for r in range(1, rounds + 1):
        name = f"{dtype}-{path}-{r}"
        recs = [json.loads(l) for l in open(os.path.join(tmp, name + ".jsonl"))]
        tps = [x["tokens_per_s"] for x in recs if "tokens_per_s" in x][2:]
        rates.append(statistics.median(tps))
        m = re.search(r"matrix products: (.*)", open(os.path.join(tmp, name + ".log")).read())
        impl = m.group(1).strip() if m else "?"
    best[(dtype, path)] = max(rates)
    rows.append((dtype, impl, rates))
for (dtype, impl, rates), key in zip(rows, best):
    print(f"| {dtype} | {impl} | " + " | ".join(f"{x:.0f}" for x in rates) +
          f" | {best[key] / best[('fp32', '-')]:.2f} |")
PY
