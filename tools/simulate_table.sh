#!/usr/bin/env bash
# simulate_table.sh — the table docs/BENCHMARKS.md gives for LLaMA-2 7B, 13B
# and 70B on 8, 64, 256 and 1024 H100s (8 per node, NVLink 4 within, IB NDR
# across): `tessera simulate`'s predicted tokens/s per GPU and MFU at ZeRO
# 0-3, ZeRO-3 with hybrid sharding over each node (--shard-group 8), and
# pipelines of 4 and 8 stages (1F1B) with ZeRO-1 within each stage's
# data-parallel ranks (a stage's ranks are consecutive: with 8 stages on
# 64 GPUs each node holds one stage and the activations cross IB).
# A global batch of 1024 sequences of 4096 tokens (4M tokens, LLaMA-2's),
# micro-batch 1, bf16, the FLOP model (simulate's defaults); activation
# checkpointing of every block for 13B and 70B. A cell whose plan does not
# fit 80 GB says so with the plan's peak.
# PROFILES=DIR: the compute measured instead of the FLOP model, from the
# traces of 2-block twins on one device (DIR/MODEL-2l.trace.json with
# DIR/MODEL-2l.metrics.jsonl for --step-overhead: tools/bench_twin.sh's;
# docs/profiles/h100 holds one H100's).
#   [PROFILES=DIR] tools/simulate_table.sh [TESSERA_BIN]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-$ROOT/bazel-bin/tools/tessera}"
export TESSERA_HOME="${TESSERA_HOME:-$ROOT}"
for model in llama-2-7b llama-2-13b llama-2-70b; do
  ckpt=none
  [[ "$model" == llama-2-7b ]] || ckpt=all
  echo
  measured=()
  how="the FLOP model"
  if [[ -n "${PROFILES:-}" ]]; then
    twin="$PROFILES/$model-2l"
    measured=(--profile "$twin.trace.json" --step-overhead
      "$("$ROOT/tools/step_overhead.sh" "$twin.trace.json" "$twin.metrics.jsonl")")
    how="compute measured: $(basename "$twin").trace.json"
  fi
  echo "**$model** (activation checkpointing: $ckpt; $how): tokens/s per GPU (MFU)"
  echo
  echo "| GPUs | grad-accum | ZeRO-0 | ZeRO-1 | ZeRO-2 | ZeRO-3 | ZeRO-3, S = 8 | exposed comm, ZeRO-3 / S = 8 | 4 stages, ZeRO-1 | 8 stages, ZeRO-1 | pipeline wait, 4 / 8 stages |"
  echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for n in 8 64 256 1024; do
    k=$((1024 / n))
    base=(--model "$model" -n "$n" --activation-checkpointing "$ckpt" --json
      ${measured[@]+"${measured[@]}"})
    common=("${base[@]}" --grad-accum "$k")
    plain="$("$BIN" simulate "${common[@]}")"
    hybrid="$("$BIN" simulate "${common[@]}" --zero 3 --shard-group 8)"
    # a pipeline of P stages runs N / P data-parallel ranks, each with
    # 1024 P / N micro-batches per step: the same global batch
    pp=()
    for P in 4 8; do
      pp+=("$("$BIN" simulate "${base[@]}" --zero 1 --pipeline "$P" \
        --grad-accum $((1024 * P / n)) --schedule 1f1b)")
    done
    python3 - "$n" "$k" "$plain" "$hybrid" "${pp[@]}" <<'EOF'
import json, sys
n, k, plain, hybrid = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
pp = [json.loads(a)["stages"][0] for a in sys.argv[5:7]]
def cell(s):
    if not s["fits"]:
        return "does not fit (%.0f GB)" % (s["peak_bytes"] / 1e9)
    return "%.0f (%.1f%%)" % (s["tokens_per_s_per_rank"], 100 * s["mfu"])
cells = [cell(s) for s in plain["stages"]] + [cell(hybrid["stages"][0])]
z3, hy = plain["stages"][3], hybrid["stages"][0]
exposed = "%.3f / %.3f s" % (z3["exposed_comm_s"], hy["exposed_comm_s"])
waits = "%.2f / %.2f s" % (pp[0]["pipeline_wait_s"], pp[1]["pipeline_wait_s"])
print("| %s | %s | %s | %s | %s | %s |" % (n, k, " | ".join(cells), exposed,
                                          " | ".join(cell(s) for s in pp), waits))
EOF
  done
done
