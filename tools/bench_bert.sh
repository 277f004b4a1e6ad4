#!/usr/bin/env bash
# BERT masked-LM training throughput on the CPU: tessera beside PyTorch's
# BertForMaskedLM (tools/peer/torch_bert.py) with the same config, micro-
# batch, sequence length and threads, measured in this run on this machine.
#
#   tools/bench_bert.sh [MODEL] [B] [T] [STEPS] [THREADS]
#       (defaults: bert-base 8 128 6 $(nproc))
#
# PYTHON names an interpreter with torch and transformers (default
# python3; e.g. a venv: python3 -m venv V && V/bin/pip install torch
# transformers). tessera trains on data/kjv-mlm (prepared here if absent)
# on one rank with OMP_NUM_THREADS=THREADS; PyTorch on random masked
# batches (speed does not depend on the text). Both report the median
# step over the steps after the first two. Prints a Markdown table.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:-bert-base}"
B="${2:-8}"
T="${3:-128}"
STEPS="${4:-6}"
THREADS="${5:-$(nproc)}"
PY="${PYTHON:-python3}"
cd "$ROOT"
tools/setup.sh
bazel build --ui_event_filters=-info,-progress --noshow_progress //tools:tessera
BIN="$ROOT/bazel-bin/tools/tessera"
export TESSERA_HOME="$ROOT"
tools/kjv.sh "$BIN" --mlm >/dev/null
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
CONFIG="$ROOT/models/configs/$MODEL.json"

OMP_NUM_THREADS="$THREADS" "$BIN" train --model "$MODEL" --data "$ROOT/data/kjv-mlm" \
  --steps $((STEPS + 2)) --micro-batch "$B" --seq "$T" --lr 1e-4 --warmup 1 --eval-batches 1 \
  --metrics "$TMP/tessera.jsonl" --log-every 1 >&2
"$PY" "$ROOT/tools/peer/torch_bert.py" --config "$CONFIG" --batch "$B" --seq "$T" \
  --threads "$THREADS" --steps "$STEPS" --warmup 2 >"$TMP/torch.json"

python3 - "$TMP" "$MODEL" "$B" "$T" "$THREADS" <<'PY'
import json, os, statistics, sys
tmp, model, B, T, threads = sys.argv[1:]
steps = [json.loads(l) for l in open(os.path.join(tmp, "tessera.jsonl"))]
tok = [s["tokens_per_s"] for s in steps if "tokens_per_s" in s and s.get("step", 0) > 2]
mine = statistics.median(tok)
peer = json.load(open(os.path.join(tmp, "torch.json")))
print(f"| model | B x T | threads | tessera tokens/s | PyTorch {peer['torch_version']} tokens/s | ratio |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
print(f"| {model} | {B} x {T} | {threads} | {mine:.0f} | {peer['tokens_per_s']:.0f} | "
      f"{mine / peer['tokens_per_s']:.2f} |")
PY
