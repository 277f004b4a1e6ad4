#!/usr/bin/env bash
# Communication overlap (--overlap on|off) and ZeRO-3 gather-once
# (--reshard-after-forward false) beside stage 0 and default ZeRO-3, the
# same training in one script run, with the communication each step waits
# for measured from the trace.
#
#   tools/bench_overlap.sh [MODEL] [RANKS] [STEPS] [ACCUM]
#     (default llama-tiny, "2 4", 20, 4)
#
# Per rank count N: `train --trace` at stage 0, ZeRO-3 and ZeRO-3
# gather-once, each with --overlap off and on, global batch 16 x 128 tokens
# in ACCUM micro-batches per rank. Prints per run: tokens/s (median over
# the steps after the first three) and the ratio on/off of the same
# configuration; from `tessera timeline --json` on every step after the
# third (median over steps of the mean over ranks), the time in collectives
# per step and the part of it the step waited for (exposed), and that
# exposed time over the time in collectives of the same configuration
# without overlap (where every collective is exposed); bytes sent per step
# per rank (comm/'s counters), rank 0's params peak and peak total (the
# ledger), and whether the losses equal default ZeRO-3's without overlap at
# every step. TESSERA_BIN as in tools/bench_env.sh.
#
# On a GPU (the bundle's run_overlap.sh sets these): DEVICE=cuda trains
# there (every rank on the GPU its local rank picks; 2 ranks on one card go
# through the host-staged transport), LAUNCH is the launcher (a command
# taking -n N PROGRAM ARGS; default tools/launch.sh), and with TESSERA_BIN
# and DATA both given the script builds and prepares nothing (TESSERA_TOOL:
# the binary for `timeline`, default TESSERA_BIN; BENCH_TMP: a folder that
# keeps each run's log, metrics, trace and timeline instead of a temporary
# one). Each run's training and timeline seconds print on stderr as it ends.
# OVERLAPS=off (or on) runs only those (default "off on"); a row then leaves
# out what needs the other.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:-llama-tiny}"
RANKS="${2:-2 4}"
STEPS="${3:-20}"
ACCUM="${4:-4}"
OVERLAPS="${OVERLAPS:-off on}"
DEVICE="${DEVICE:-cpu}"
LAUNCH="${LAUNCH:-$ROOT/tools/launch.sh}"
cd "$ROOT"
if [[ -n "${TESSERA_BIN:-}" && -n "${DATA:-}" ]]; then # a bundle: nothing to build
  BIN="$TESSERA_BIN"
  if [[ -n "${BENCH_TMP:-}" ]]; then # kept: each run's log, metrics and trace
    TMP="$BENCH_TMP"
    mkdir -p "$TMP"
  else
    TMP="$(mktemp -d)"
    trap 'rm -rf "$TMP"' EXIT
  fi
else
  # shellcheck source=tools/bench_env.sh
  source tools/bench_env.sh # BIN, DATA, TMP
fi
TOOL="${TESSERA_TOOL:-$BIN}"

printf '%s, %s steps, accumulation %s, global batch 16 x 128 (%s cores, device %s)\n' "$MODEL" \
  "$STEPS" "$ACCUM" "$(nproc)" "$DEVICE"
printf '| ranks | run | overlap | tokens/s | on / off | comm ms/step | exposed ms/step | exposed / off comm | MB sent per step | params peak MiB | peak total MiB | losses = ZeRO-3 |\n'
printf '| ---: | :--- | :---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |\n'
for n in $RANKS; do
  mb=$((16 / (n * ACCUM)))
  ((mb >= 1 && mb * n * ACCUM == 16)) || {
    echo "bench_overlap: $n ranks x $ACCUM micro-batches do not divide 16 sequences" >&2
    exit 2
  }
  for run in "0 true" "3 true" "3 false"; do
    read -r zero reshard <<<"$run"
    for overlap in $OVERLAPS; do
      name="$n-$zero-$reshard-$overlap"
      t0=$SECONDS
      "$LAUNCH" -n "$n" "$BIN" train --device "$DEVICE" --model "$MODEL" --data "$DATA" --zero "$zero" \
        --reshard-after-forward "$reshard" --overlap "$overlap" --steps "$STEPS" \
        --micro-batch "$mb" --grad-accum "$ACCUM" --seq 128 --lr 1e-3 --warmup 5 \
        --eval-batches 1 --log-every "$STEPS" --metrics "$TMP/$name.jsonl" \
        --trace "$TMP/$name.trace.json" >"$TMP/$name.log"
      t1=$SECONDS
      for ((k = 4; k <= STEPS; k++)); do
        "$TOOL" timeline "$TMP/$name.trace.json" --step "$k" --json
        echo
      done >"$TMP/$name.timeline.jsonl"
      echo "bench_overlap: $name: train $((t1 - t0)) s, timeline $((SECONDS - t1)) s" >&2
    done
  done
  python3 - "$TMP" "$n" <<'PY'
import json, os, statistics, sys
tmp, n = sys.argv[1], sys.argv[2]
def load(zero, reshard, overlap):
    name = f"{n}-{zero}-{reshard}-{overlap}"
    if not os.path.exists(os.path.join(tmp, name + ".jsonl")):
        return None
    recs = [json.loads(l) for l in open(os.path.join(tmp, name + ".jsonl"))]
    steps = [r for r in recs if "tokens_per_s" in r]
    summary = [r["summary"] for r in recs if "summary" in r][-1]
    tl = [json.loads(l) for l in open(os.path.join(tmp, name + ".timeline.jsonl")) if l.strip()]
    comm = statistics.median(statistics.mean(t["comm_ms"]) for t in tl)
    exposed = statistics.median(statistics.mean(t["exposed_comm_ms"]) for t in tl)
    tok = statistics.median(r["tokens_per_s"] for r in steps[3:])
    return steps, summary, tok, comm, exposed
base = load(3, "true", "off")
def ratio(a, b, fmt):
    return fmt % (a / b) if b else "-"
for zero, reshard, name in ((0, "true", "stage 0"), (3, "true", "ZeRO-3"),
                            (3, "false", "ZeRO-3 gather-once")):
    off = load(zero, reshard, "off")
    for overlap in ("off", "on"):
        run = load(zero, reshard, overlap)
        if run is None:
            continue
        steps, s, tok, comm, exposed = run
        r0 = s["mem_by_rank"][0]
        same = "-" if base is None else \
            "yes" if [r["loss"] for r in steps] == [r["loss"] for r in base[0]] else "no"
        print(f"| {n} | {name} | {overlap} | {tok:.0f} | "
              f"{ratio(tok, off[2] if off else 0, '%.3f')} | {comm:.2f} | "
              f"{exposed:.2f} | {ratio(exposed, off[3] if off else 0, '%.3f')} | "
              f"{s['comm_bytes_per_step'] / 1e6:.2f} | {r0['params'] / 2**20:.2f} | "
              f"{r0['total'] / 2**20:.2f} | {same} |")
PY
done
