#!/usr/bin/env bash
# ZeRO-3 gather-once per step (--reshard-after-forward false) against the
# default ZeRO-3 and stage 0, the same training in one script run.
#
#   tools/bench_gather_once.sh [MODEL] [RANKS] [STEPS] [ACCUM]
#     (default llama-tiny, "2 4", 20, 4)
#
# Per rank count N: `train` at stage 0 (the baseline that gathers nothing),
# stage 3 (each unit gathered for every forward and every backward of every
# micro-batch) and stage 3 with --reshard-after-forward false (each unit
# gathered once per step, held to its last backward), global batch 16 x 128
# tokens in ACCUM micro-batches per rank. Prints per configuration: tokens/s
# (median over the steps after the first three) and its ratio to default
# ZeRO-3, bytes sent per step per rank (comm/'s counters), rank 0's params
# peak and its peak total (the ledger), and whether the losses equal default
# ZeRO-3's at every step. TESSERA_BIN as in tools/bench_env.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:-llama-tiny}"
RANKS="${2:-2 4}"
STEPS="${3:-20}"
ACCUM="${4:-4}"
cd "$ROOT"
# shellcheck source=tools/bench_env.sh
source tools/bench_env.sh # BIN, DATA, TMP

printf '%s, %s steps, accumulation %s, global batch 16 x 128 (%s cores)\n' "$MODEL" "$STEPS" \
  "$ACCUM" "$(nproc)"
printf '| ranks | run | tokens/s | / ZeRO-3 | MB sent per step | params peak MiB | peak total MiB | losses = ZeRO-3 |\n'
printf '| ---: | :--- | ---: | ---: | ---: | ---: | ---: | :---: |\n'
for n in $RANKS; do
  mb=$((16 / (n * ACCUM)))
  ((mb >= 1 && mb * n * ACCUM == 16)) || {
    echo "bench_gather_once: $n ranks x $ACCUM micro-batches do not divide 16 sequences" >&2
    exit 2
  }
  for run in "0 true" "3 true" "3 false"; do
    read -r zero reshard <<<"$run"
    tools/launch.sh -n "$n" "$BIN" train --model "$MODEL" --data "$DATA" --zero "$zero" \
      --reshard-after-forward "$reshard" --steps "$STEPS" --micro-batch "$mb" \
      --grad-accum "$ACCUM" --seq 128 --lr 1e-3 --warmup 5 --eval-batches 1 \
      --log-every "$STEPS" --metrics "$TMP/go-$n-$zero-$reshard.jsonl" >"$TMP/go.log"
  done
  python3 - "$TMP" "$n" <<'PY'
import json, os, statistics, sys
tmp, n = sys.argv[1], sys.argv[2]
def load(zero, reshard):
    recs = [json.loads(l) for l in open(os.path.join(tmp, f"go-{n}-{zero}-{reshard}.jsonl"))]
    steps = [r for r in recs if "tokens_per_s" in r]
    summary = [r["summary"] for r in recs if "summary" in r][-1]
    return steps, summary
base_steps, _ = load(3, "true")
base_tok = statistics.median(r["tokens_per_s"] for r in base_steps[3:])
for zero, reshard, name in ((0, "true", "stage 0"), (3, "true", "ZeRO-3"),
                            (3, "false", "ZeRO-3 gather-once")):
    steps, s = load(zero, reshard)
    tok = statistics.median(r["tokens_per_s"] for r in steps[3:])
    r0 = s["mem_by_rank"][0]
    same = [r["loss"] for r in steps] == [r["loss"] for r in base_steps]
    print(f"| {n} | {name} | {tok:.0f} | {tok / base_tok:.3f} | "
          f"{s['comm_bytes_per_step'] / 1e6:.2f} | {r0['params'] / 2**20:.2f} | "
          f"{r0['total'] / 2**20:.2f} | {'yes' if same else 'no'} |")
PY
done
