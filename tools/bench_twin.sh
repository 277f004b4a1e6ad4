#!/usr/bin/env bash
# bench_twin.sh — `simulate --profile` from a shallow twin's trace against
# the deeper model measured on the same device: the twin (the model's
# config with 2 blocks) traced on one device predicts the model's step
# (each block costs the twin's median block; embedding and head their own;
# AdamW by the memory model; --step-overhead the twin's step outside its
# spans, tools/step_overhead.sh); beside it the FLOP model's prediction.
# Pairs (twin, model, micro-batch x seq, bf16, one device, ZeRO-0):
#   llama-1.1b-2l -> llama-1.1b (22 blocks), 4 x 2048
#   llama-2-7b-2l -> llama-2-7b-8l (8 blocks), 1 x 4096
# DIR holds the configs and, once measured, NAME.trace.json (twins) and
# NAME.metrics.jsonl (both); missing measurements are made here with
# $TESSERA_BIN train --device $DEVICE (default cuda: a GPU machine, e.g.
# through tools/gpu_bundle.sh's DIR/tessera; 12 steps, lr 3e-4, the KJV
# shards of $DATA). Prints predicted / measured per pair.
#   tools/bench_twin.sh [DIR]   (default docs/profiles/h100, measured on
#                                one H100 on 2026-11-26)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/docs/profiles/h100}"
BIN="${TESSERA_BIN:-$ROOT/bazel-bin/tools/tessera}"
DATA="${DATA:-$ROOT/data/kjv}"
DEVICE="${DEVICE:-cuda}"
cd "$ROOT"
measure() { # measure NAME B T [--trace]
  local name="$1" b="$2" t="$3"
  shift 3
  [[ -f "$DIR/$name.metrics.jsonl" ]] && return 0
  local config="$DIR/$name.json"
  [[ -f "$config" ]] || config="$name" # a preset
  "$BIN" train --model "$config" --data "$DATA" --device "$DEVICE" --dtype bf16 --micro-batch "$b" \
    --seq "$t" --steps 12 --log-every 4 --eval-batches 1 --lr 3e-4 \
    --metrics "$DIR/$name.metrics.jsonl" "$@" >&2
}
echo "| model | twin | B x T | predicted from the twin ms | FLOP model ms | measured ms | twin / measured | FLOP model / measured |"
echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"
for pair in "llama-1.1b-2l llama-1.1b 4 2048" "llama-2-7b-2l llama-2-7b-8l 1 4096"; do
  read -r twin model b t <<<"$pair"
  measure "$twin" "$b" "$t" --trace "$DIR/$twin.trace.json"
  measure "$model" "$b" "$t"
  config="$DIR/$model.json"
  [[ -f "$config" ]] || config="$model"
  overhead="$(tools/step_overhead.sh "$DIR/$twin.trace.json" "$DIR/$twin.metrics.jsonl")"
  common=(simulate --model "$config" -n 1 --zero 0 --micro-batch "$b" --seq "$t" --json)
  pred="$("$BIN" "${common[@]}" --profile "$DIR/$twin.trace.json" --step-overhead "$overhead")"
  flops="$("$BIN" "${common[@]}")"
  measured="$(tools/step_overhead.sh --median-step "$DIR/$model.metrics.jsonl")"
  python3 - "$model" "$twin" "$b x $t" "$pred" "$flops" "$measured" <<'PY'
import json, sys
model, twin, shape, pred, flops, measured = sys.argv[1:]
p = json.loads(pred)["stages"][0]["step_s"]
f = json.loads(flops)["stages"][0]["step_s"]
m = float(measured)
print("| %s | %s | %s | %.1f | %.1f | %.1f | %.3f | %.3f |" % (model, twin, shape, 1e3 * p, 1e3 * f,
                                                             1e3 * m, p / m, f / m))
PY
done
