#!/usr/bin/env bash
# bench_fp8.sh — issue 46's fp8 target on one GPU, in one run on one card:
# a llama model in bf16, then with --fp8 tensorwise and --fp8 rowwise, each
# STEPS steps on the KJV tokens through tools/bench_gpu.sh (its tokens/s are
# medians over the steps after WARMUP). Prints bench_gpu.sh's table, then per
# scaling two verdict lines:
#   fp8 tensorwise: 1.21x bf16's tokens/s (target >= 1.15): ok
#   fp8 tensorwise: loss 4.123 at step 200, bf16 4.101: +0.54% (target within 1%): ok
# (the figures above are an example of the form, not a measurement). The
# loss is the mean of the last 10 steps' training losses of each run, the
# same batches in each (a batch is a function of the seed and the step).
#
#   tools/bench_fp8.sh [STEPS]      (default 200)
#   DIR/run_fp8.sh [STEPS]          the same from tools/gpu_bundle.sh's folder
# Environment: MODEL (default llama-1.1b:8x2048), BENCH_LOGS (kept logs;
# default a temporary folder), and bench_gpu.sh's (TESSERA_BIN, DATA, ...).
# Exit 1 if a run failed or a target was missed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STEPS="${1:-200}"
MODEL="${MODEL:-llama-1.1b:8x2048}"
LOGS="${BENCH_LOGS:-$(mktemp -d)}"
mkdir -p "$LOGS"
name="$(basename "${MODEL%%:*}" .json)"
rc=0
BENCH_LOGS="$LOGS/tensorwise" BENCH_JSON="$LOGS/tensorwise.json" IMPLS="tessera tessera-fp8" \
  MODELS="$MODEL" FP8=tensorwise "$ROOT/tools/bench_gpu.sh" "$STEPS" || rc=1
BENCH_LOGS="$LOGS/rowwise" BENCH_JSON="$LOGS/rowwise.json" IMPLS="tessera-fp8" \
  MODELS="$MODEL" FP8=rowwise "$ROOT/tools/bench_gpu.sh" "$STEPS" || rc=1
python3 - "$LOGS" "$name" "${WARMUP:-5}" <<'PY' || rc=1
import json, statistics, sys
logs, name, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])

def run(path):
    recs = [json.loads(l) for l in open(path) if l.strip()]
    steps = [r for r in recs if "tokens_per_s" in r and "loss" in r]
    tok = statistics.median(r["tokens_per_s"] for r in steps if r["step"] > warmup)
    last = steps[-10:]
    return tok, sum(r["loss"] for r in last) / len(last), steps[-1]["step"]

base_tok, base_loss, _ = run(f"{logs}/tensorwise/tessera-{name}.jsonl")
bad = 0
for scaling in ("tensorwise", "rowwise"):
    tok, loss, step = run(f"{logs}/{scaling}/tessera-fp8-{name}.jsonl")
    speed, dl = tok / base_tok, (loss - base_loss) / base_loss
    ok1, ok2 = speed >= 1.15, abs(dl) <= 0.01
    bad += (not ok1) + (not ok2)
    print(f"fp8 {scaling}: {speed:.2f}x bf16's tokens/s (target >= 1.15): {'ok' if ok1 else 'MISSED'}")
    print(f"fp8 {scaling}: loss {loss:.4f} at step {step}, bf16 {base_loss:.4f}: {100 * dl:+.2f}% "
          f"(target within 1%): {'ok' if ok2 else 'MISSED'}")
sys.exit(1 if bad else 0)
PY
exit $rc
