#!/usr/bin/env bash
# Disk offload's cost (train --offload-dir): the step time of a one-rank
# run with the optimizer state in a scratch file beside the same run with
# it in memory, and the disk's own rate measured in the same script.
#
#   tools/bench_offload.sh [MODEL] [STEPS] [ROUNDS] [DIR]
#       (default llama-124m, 6, 2, a folder under /tmp)
#
# The disk: dd writes then reads 1 GiB with O_DIRECT (oflag/iflag=direct,
# 4 MiB blocks) in DIR: MB/s each way, the bound on what streaming the
# state can reach. Then ROUNDS interleaved rounds of tessera train MODEL
# (bf16, micro-batch 8 x 128, data/kjv) in memory and with --offload-dir
# DIR: tokens/s (median over the steps after the first two), the peak
# resident memory of the process (/usr/bin/time's maximum RSS) and the
# ledger's peak; a row per side with the best round, and offload's step
# time over in-memory's (the issue's target: at most 1.3). The state
# streamed per step: estimate --offload-dir's disk rows, read once and
# written once by the update.
# TESSERA_BIN as in tools/bench_env.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:-llama-124m}"
STEPS="${2:-6}"
ROUNDS="${3:-2}"
cd "$ROOT"
# shellcheck source=tools/bench_env.sh
source tools/bench_env.sh # BIN, DATA, TMP
DIR="${4:-$TMP/offload}"
mkdir -p "$DIR"
[[ -x /usr/bin/time ]] || { echo "bench_offload: needs /usr/bin/time (Debian's time)" >&2; exit 1; }

dd if=/dev/zero of="$DIR/dd.bin" bs=4M count=256 oflag=direct conv=fsync 2>"$TMP/ddw.txt"
dd if="$DIR/dd.bin" of=/dev/null bs=4M iflag=direct 2>"$TMP/ddr.txt"
rm -f "$DIR/dd.bin"
rate() { awk '/copied/ {for (i = 1; i < NF; i++) if ($(i + 1) ~ /^s,/) print $(NF - 1), $NF}' "$1"; }
echo "disk ($DIR): write $(rate "$TMP/ddw.txt"), read $(rate "$TMP/ddr.txt") (dd, O_DIRECT, 1 GiB)"
"$BIN" estimate --model "$MODEL" --dtype bf16 --micro-batch 8 --seq 128 --offload-dir "$DIR" |
  grep -E '^\| (category|disk|master|optim|peak total)' | cut -d'|' -f1-3

for ((r = 1; r <= ROUNDS; r++)); do
  for side in memory offload; do
    extra=()
    [[ "$side" == memory ]] || extra=(--offload-dir "$DIR")
    /usr/bin/time -f "%M" -o "$TMP/$side-$r.rss" "$BIN" train --model "$MODEL" --data "$DATA" \
      --dtype bf16 --micro-batch 8 --seq 128 --steps "$STEPS" --eval-batches 1 --log-every 1 \
      --metrics "$TMP/$side-$r.jsonl" "${extra[@]}" >"$TMP/$side-$r.log" 2>&1
  done
done

python3 - "$TMP" "$ROUNDS" "$MODEL" <<'PY'
import json, os, re, statistics, sys
tmp, rounds, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
best = {}
for side in ("memory", "offload"):
    for r in range(1, rounds + 1):
        recs = [json.loads(l) for l in open(os.path.join(tmp, "%s-%d.jsonl" % (side, r)))]
        steps = [x for x in recs if "tokens_per_s" in x and x["step"] > 2]
        tok = statistics.median(x["tokens_per_s"] for x in steps)
        rss = int(open(os.path.join(tmp, "%s-%d.rss" % (side, r))).read().split()[-1]) / 1024
        log = open(os.path.join(tmp, "%s-%d.log" % (side, r))).read()
        m = re.search(r"rank 0 peak ([0-9.]+) MiB", log)  # train's summary: the ledger's peak
        peak = float(m.group(1)) if m else 0.0
        if side not in best or tok > best[side][0]:
            best[side] = (tok, rss, peak)
print("\n%s, bf16, 1 rank, micro-batch 8 x 128: best of %d rounds\n" % (model, rounds))
print("| optimizer state | tokens/s | step time / in memory | peak RSS (MiB) | ledger peak (MiB) |")
print("| --- | ---: | ---: | ---: | ---: |")
for side in ("memory", "offload"):
    tok, rss, peak = best[side]
    print("| %s | %.0f | %.2f | %.0f | %s |" % ("in memory" if side == "memory" else "disk (--offload-dir)",
          tok, best["memory"][0] / tok, rss, "%.0f" % peak if peak else "-"))
PY
