#!/usr/bin/env bash
# ZeRO stages side by side: the same training on N ranks at stages 0-3 in
# one script run, on the KJV corpus.
#
#   tools/bench_zero.sh [STEPS] [RANKS] [MODEL]   (default 30, 2, llama-tiny)
#
# TESSERA_BIN (with TESSERA_HOME for its presets) runs that binary instead
# of building the working tree's; BENCH_JSON=FILE appends one JSON line per
# stage ({"bench": "zero", "stage": S, "tokens_per_s": ...}) to FILE.
#
# Prints a Markdown table per stage: tokens/s (mean over steps after the
# first three) and its ratio to stage 0 of the same run, bytes sent per step
# per rank (measured by comm/'s counters) beside the ZeRO-paper figure
# 2Ψ(N-1)/N (stages 0-2) or 3Ψ(N-1)/N (stage 3) for the padded Ψ in fp32,
# whether the loss matched stage 0 at every step, and rank 0's peak memory
# per ledger category. Global batch 16 x 128 tokens (micro-batch 16 / N).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STEPS="${1:-30}"
N="${2:-2}"
MODEL="${3:-llama-tiny}"
cd "$ROOT"
# shellcheck source=tools/bench_env.sh
source tools/bench_env.sh # BIN, DATA, TMP

for stage in 0 1 2 3; do
  tools/launch.sh -n "$N" "$BIN" train --model "$MODEL" --data "$DATA" --zero "$stage" \
    --steps "$STEPS" --micro-batch $((16 / N)) --global-batch 16 --seq 128 --lr 1e-3 \
    --warmup 5 --eval-batches 1 --metrics "$TMP/zero$stage.jsonl" --log-every "$STEPS" \
    >"$TMP/zero$stage.log"
done

python3 - "$TMP" "$N" "$MODEL" "$(nproc)" "${BENCH_JSON:-}" <<'PY'
import json, os, sys
tmp, n, model, cores, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
runs = {}
for s in range(4):
    recs = [json.loads(l) for l in open(os.path.join(tmp, f"zero{s}.jsonl"))]
    steps = [r for r in recs if "tokens_per_s" in r]
    summary = next(r["summary"] for r in recs if "summary" in r)
    runs[s] = (steps, summary)
base_tok = None
mib = 1024.0 ** 2
print(f"{model}, {n} ranks on {cores} cores, fp32, global batch 16 x 128, "
      f"Ψ = {runs[0][1]['params']['unpadded']} ({runs[0][1]['params']['padded']} padded)")
print()
print("| stage | tokens/s | vs stage 0 | MB sent/step/rank | theory | losses = stage 0 "
      "| params MiB | grads MiB | optim MiB | activations MiB | comm MiB | workspace MiB "
      "| peak total MiB |")
print("| --- " * 13 + "|")
for s in range(4):
    steps, sm = runs[s]
    timed = [r for r in steps if r["step"] > 3] or steps
    tok = sum(r["tokens_per_s"] for r in timed) / len(timed)
    base_tok = base_tok or tok
    psi = sm["params"]["padded"]
    theory = (3 if s == 3 else 2) * psi * 4 * (n - 1) / n
    same = all(a["loss"] == b["loss"] for a, b in zip(steps, runs[0][0]))
    m = sm["mem_by_rank"][0]
    cats = ["params", "grads", "optim", "activations", "comm", "workspace", "total"]
    print(f"| {s} | {tok:.0f} | {tok / base_tok:.2f} | {sm['comm_bytes_per_step'] / 1e6:.3f} | "
          f"{theory / 1e6:.3f} | {'yes' if same else 'NO'} | "
          + " | ".join(f"{m[c] / mib:.2f}" for c in cats) + " |")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"bench": "zero", "model": model, "ranks": n, "stage": s,
                                "tokens_per_s": tok, "same_losses": same}) + "\n")
PY
