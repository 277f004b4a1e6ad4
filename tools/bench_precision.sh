#!/usr/bin/env bash
# Mixed precision and activation checkpointing side by side: the same
# training on N ranks at one ZeRO stage in fp32, bf16 and fp16, each with
# activation checkpointing off and on (all blocks), in one script run, on
# the KJV corpus.
#
#   tools/bench_precision.sh [STEPS] [RANKS] [MODEL] [STAGE]
#                            (default 30, 2, llama-tiny, 3)
#
# Prints a Markdown table, one row per run: tokens/s (mean over steps after
# the first three) and its ratio to the fp32 run without checkpointing,
# the largest and the last |loss - fp32 loss| over the steps, the final
# validation loss, fp16's skipped steps and final loss scale, rank 0's peak
# memory per ledger category, and the activation bytes the engine predicted
# beside the measured peak. Global batch 16 x 128 tokens (micro-batch 16 / N).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STEPS="${1:-30}"
N="${2:-2}"
MODEL="${3:-llama-tiny}"
STAGE="${4:-3}"
cd "$ROOT"
# shellcheck source=tools/bench_env.sh
source tools/bench_env.sh # BIN, DATA, TMP

RUNS=()
for dtype in fp32 bf16 fp16; do
  for recompute in none all; do
    name="$dtype-$recompute"
    RUNS+=("$name")
    tools/launch.sh -n "$N" "$BIN" train --model "$MODEL" --data data/kjv --zero "$STAGE" \
      --dtype "$dtype" --activation-checkpointing "$recompute" \
      --steps "$STEPS" --micro-batch $((16 / N)) --global-batch 16 --seq 128 --lr 1e-3 \
      --warmup 5 --eval-batches 4 --metrics "$TMP/$name.jsonl" --log-every "$STEPS" \
      >"$TMP/$name.log"
  done
done

python3 - "$TMP" "$N" "$MODEL" "$STAGE" "$(nproc)" "${RUNS[@]}" <<'PY'
import json, os, sys
tmp, n, model, stage, cores, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
runs = {}
for name in names:
    recs = [json.loads(l) for l in open(os.path.join(tmp, f"{name}.jsonl"))]
    steps = [r for r in recs if "tokens_per_s" in r]
    val = [r["val_loss"] for r in recs if "val_loss" in r][-1]
    summary = next(r["summary"] for r in recs if "summary" in r)
    runs[name] = (steps, val, summary)
mib = 1024.0 ** 2
base_steps, _, base_sm = runs["fp32-none"]
def tok_s(steps):
    timed = [r for r in steps if r["step"] > 3] or steps
    return sum(r["tokens_per_s"] for r in timed) / len(timed)
base_tok = tok_s(base_steps)
print(f"{model}, {n} ranks on {cores} cores, ZeRO stage {stage}, global batch 16 x 128, "
      f"{len(base_steps)} steps, Ψ = {base_sm['params']['unpadded']} "
      f"({base_sm['params']['padded']} padded); memory: rank 0's peak per category, MiB")
print()
cats = ["params", "grads", "master", "optim", "activations", "comm", "workspace", "total"]
print("| dtype | checkpointing | tokens/s | vs fp32 | max \\|Δloss\\| | last \\|Δloss\\| | val loss "
      "| skipped | loss scale | " + " | ".join(cats) + " | activations predicted |")
print("| --- " * (10 + len(cats)) + "|")
for name in names:
    steps, val, sm = runs[name]
    tok = tok_s(steps)
    d = [abs(a["loss"] - b["loss"]) for a, b in zip(steps, base_steps)]
    m = sm["mem_by_rank"][0]
    dtype, recompute = name.split("-")
    print(f"| {dtype} | {recompute} | {tok:.0f} | {tok / base_tok:.2f} | {max(d):.4f} | {d[-1]:.4f} "
          f"| {val:.4f} | {sm['skipped_steps']} | {sm['loss_scale']:g} | "
          + " | ".join(f"{m[c] / mib:.2f}" for c in cats)
          + f" | {sm['activation_bytes_predicted'] / mib:.2f} |")
PY
