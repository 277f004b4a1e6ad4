#!/usr/bin/env bash
# simulate_schedules.sh — the pipeline schedules side by side for
# LLaMA-2 70B on 64, 256 and 1024 H100s (8 per node, NVLink 4 within, IB
# NDR across), `tessera simulate`'s FLOP model: 1F1B, interleaved 1F1B
# (--virtual-stages V, default 2), ZB-H1 and ZB-V, with P = 4 and 8 pipeline
# stages of N / P data-parallel ranks at ZeRO-1, a global batch of 1024
# sequences of 4096 tokens (m = 1024 P / N micro-batches of 1 per step),
# bf16, every block recomputed (CKPT=all, the default; CKPT=none: none), a stage's
# ranks consecutive (with 8 stages on 64 GPUs each node holds one stage).
# Per cell: tokens/s per GPU (MFU), the pipeline wait of the slowest stage
# (the bubble and the transfers between stages) as a part of its step, and
# the bubble of the schedule's formula (equal stages, free links); a plan
# that does not fit 80 GB says so.
#   tools/simulate_schedules.sh [TESSERA_BIN] [MODEL]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-$ROOT/bazel-bin/tools/tessera}"
MODEL="${2:-llama-2-70b}"
V="${VIRTUAL_STAGES:-2}"
CKPT="${CKPT:-all}"
export TESSERA_HOME="${TESSERA_HOME:-$ROOT}"
echo "**$MODEL**, bf16, activation checkpointing $CKPT, ZeRO-1 within each stage: tokens/s per GPU (MFU); pipeline wait / step (formula's bubble)"
echo
echo "| GPUs | stages | micro-batches | 1F1B | interleaved, v = $V | ZB-H1 | ZB-V |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for n in 64 256 1024; do
  for P in 4 8; do
    m=$((1024 * P / n))
    cells=()
    for k in 1f1b interleaved zb-h1 zbv; do
      more=()
      [[ "$k" == interleaved ]] && more=(--virtual-stages "$V")
      cells+=("$("$BIN" simulate --model "$MODEL" -n "$n" --zero 1 --pipeline "$P" --schedule "$k" \
        "${more[@]}" --grad-accum "$m" --activation-checkpointing "$CKPT" --json)")
    done
    python3 - "$n" "$P" "$m" "$V" "${cells[@]}" <<'PY'
import json, sys
n, P, m, v = map(int, sys.argv[1:5])
theory = [(P - 1) / (m + P - 1), (P - 1) / (v * m + P - 1), (P - 1) / (3 * m + P - 1),
          (P - 1) / (6 * m + P - 1)]
out = []
for text, th in zip(sys.argv[5:9], theory):
    s = json.loads(text)["stages"][0]
    if not s["fits"]:
        out.append("does not fit (%.0f GB)" % (s["peak_bytes"] / 1e9))
        continue
    out.append("%.0f (%.1f%%); %.1f%% (%.1f%%)" % (s["tokens_per_s_per_rank"], 100 * s["mfu"],
                                                  100 * s["pipeline_wait_s"] / s["step_s"], 100 * th))
print("| %d | %d | %d | %s |" % (n, P, m, " | ".join(out)))
PY
  done
done
