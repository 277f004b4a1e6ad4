#!/usr/bin/env bash
# Training throughput of llama-tiny and llama-small on one rank, next to
# OpenBLAS's sgemm rate measured in the same run on the same machine.
#
#   tools/bench_train.sh [STEPS]      (default 30 steps per model)
#
# TESSERA_BIN (with TESSERA_HOME for its presets) runs that binary instead
# of building the working tree's; BENCH_JSON=FILE appends one JSON line of
# the measured figures ({"bench": "train", "model": ..., "tokens_per_s": ...})
# per model to FILE (tools/bench_before_after.sh uses both).
#
# Prints a Markdown table: tokens/s and achieved model GFLOP/s (PaLM count,
# models/llama.h) averaged over the steps after the first five, and their
# ratio to sgemm's GFLOP/s at 1024^3 and at each model's MLP shape.
# Uses data/kjv (made by `./tessera demo` or prepared here if absent).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STEPS="${1:-30}"
B=16
T=128
cd "$ROOT"
tools/setup.sh
if [[ -n "${TESSERA_BIN:-}" ]]; then
  bazel build --ui_event_filters=-info,-progress --noshow_progress //kernels:bench_sgemm
  BIN="$TESSERA_BIN"
  export TESSERA_HOME="${TESSERA_HOME:-$ROOT}"
else
  bazel build --ui_event_filters=-info,-progress --noshow_progress //tools:tessera //kernels:bench_sgemm
  BIN="$ROOT/bazel-bin/tools/tessera"
  export TESSERA_HOME="$ROOT"
fi
DATA="$ROOT/data/kjv"
tools/kjv.sh "$BIN" >/dev/null
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# sgemm at 1024^3 and at each model's widest MLP product (M = B*T).
"$ROOT/bazel-bin/kernels/bench_sgemm" 1024 1024 1024 $((B * T)) 512 192 $((B * T)) 1280 512 \
  >"$TMP/sgemm.txt"

for model in llama-tiny llama-small; do
  "$BIN" train --model "$model" --data "$DATA" --steps "$STEPS" --micro-batch "$B" --seq "$T" \
    --lr 1e-3 --warmup 5 --eval-batches 1 --metrics "$TMP/$model.jsonl" --log-every "$STEPS" \
    >"$TMP/$model.log"
done

python3 - "$TMP" "$B" "$T" "${BENCH_JSON:-}" <<'PY'
import json, os, sys
tmp, B, T, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sgemm = {}
for line in open(os.path.join(tmp, "sgemm.txt")):
    f = line.split()
    if f and f[0] == "sgemm":
        sgemm[(int(f[1]), int(f[2]), int(f[3]))] = float(f[4])
peak = sgemm[(1024, 1024, 1024)]
mlp = {"llama-tiny": (B * T, 512, 192), "llama-small": (B * T, 1280, 512)}
print(f"sgemm 1024^3: {peak:.1f} GFLOP/s")
for k, v in sgemm.items():
    if k != (1024, 1024, 1024):
        print(f"sgemm {k[0]}x{k[1]}x{k[2]}: {v:.1f} GFLOP/s")
print()
print("| model | params | micro-batch x seq | tokens/s | GFLOP/s | / sgemm 1024^3 | / sgemm MLP shape |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for model in ("llama-tiny", "llama-small"):
    recs = [json.loads(l) for l in open(os.path.join(tmp, model + ".jsonl"))]
    steps = [r for r in recs if "tokens_per_s" in r and r["step"] > 5]
    tok = sum(r["tokens_per_s"] for r in steps) / len(steps)
    gf = sum(r["gflops"] for r in steps) / len(steps)
    log = open(os.path.join(tmp, model + ".log")).read()
    params = log.split("(")[1].split(" parameters")[0] if "parameters" in log else "?"
    print(f"| {model} | {params} | {B} x {T} | {tok:.0f} | {gf:.1f} | {gf / peak:.2f} | "
          f"{gf / sgemm[mlp[model]]:.2f} |")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"bench": "train", "model": model, "tokens_per_s": tok,
                                "gflops": gf, "sgemm_gflops": peak}) + "\n")
PY
