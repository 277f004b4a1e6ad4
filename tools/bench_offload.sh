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
# (bf16, micro-batch MB x SEQ, data/kjv) in memory and with --offload-dir
# DIR: tokens/s (median over the steps after the first two), the peak
# resident memory of the process (/usr/bin/time's maximum RSS) and the
# ledger's peak; a row per side with the best round, and offload's step
# time over in-memory's (the issue's target: at most 1.3). The state
# streamed per step: estimate --offload-dir's disk rows, read once and
# written once by the update.
# MB and SEQ set the micro-batch (default 8 x 128).
# MEM_LIMIT=BYTES runs both sides inside a memory cgroup of that limit (one
# of this script's own: cgroup v2, or v1's memory controller; root), as on
# a machine of that much memory: a side the limit refuses prints its line.
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
MB="${MB:-8}"
SEQ="${SEQ:-128}"
mkdir -p "$DIR"
[[ -x /usr/bin/time ]] || { echo "bench_offload: needs /usr/bin/time (Debian's time)" >&2; exit 1; }

dd if=/dev/zero of="$DIR/dd.bin" bs=4M count=256 oflag=direct conv=fsync 2>"$TMP/ddw.txt"
dd if="$DIR/dd.bin" of=/dev/null bs=4M iflag=direct 2>"$TMP/ddr.txt"
rm -f "$DIR/dd.bin"
rate() { awk '/copied/ {for (i = 1; i < NF; i++) if ($(i + 1) ~ /^s,/) print $(NF - 1), $NF}' "$1"; }
echo "disk ($DIR): write $(rate "$TMP/ddw.txt"), read $(rate "$TMP/ddr.txt") (dd, O_DIRECT, 1 GiB)"
"$BIN" estimate --model "$MODEL" --dtype bf16 --micro-batch "$MB" --seq "$SEQ" --offload-dir "$DIR" |
  grep -E '^\| (category|disk|master|optim|peak total)' | cut -d'|' -f1-3

cg=""
if [[ -n "${MEM_LIMIT:-}" ]]; then
  if grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null &&
    mkdir "/sys/fs/cgroup/tessera-bench-$$" 2>/dev/null; then
    cg="/sys/fs/cgroup/tessera-bench-$$" && echo "$MEM_LIMIT" >"$cg/memory.max"
  elif mkdir "/sys/fs/cgroup/memory/tessera-bench-$$" 2>/dev/null; then
    cg="/sys/fs/cgroup/memory/tessera-bench-$$" && echo "$MEM_LIMIT" >"$cg/memory.limit_in_bytes"
  else
    echo "bench_offload: MEM_LIMIT: cannot make a memory cgroup here" >&2
    exit 1
  fi
  trap 'rm -rf "$TMP"; rmdir "$cg" 2>/dev/null' EXIT
  echo "both sides in a memory cgroup of $MEM_LIMIT bytes ($cg)"
fi
in_cg() { if [[ -n "$cg" ]]; then sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' _ "$cg" "$@"; else "$@"; fi; }

for ((r = 1; r <= ROUNDS; r++)); do
  for side in memory offload; do
    extra=()
    [[ "$side" == memory ]] || extra=(--offload-dir "$DIR")
    in_cg /usr/bin/time -f "%M" -o "$TMP/$side-$r.rss" "$BIN" train --model "$MODEL" --data "$DATA" \
      --dtype bf16 --micro-batch "$MB" --seq "$SEQ" --steps "$STEPS" --eval-batches 1 --log-every 1 \
      --metrics "$TMP/$side-$r.jsonl" "${extra[@]}" >"$TMP/$side-$r.log" 2>&1 || true
  done
done

python3 - "$TMP" "$ROUNDS" "$MODEL" "$MB" "$SEQ" <<'PY'
import json, os, re, statistics, sys
tmp, rounds, model, mb, seq = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
best, refused = {}, {}
for side in ("memory", "offload"):
    for r in range(1, rounds + 1):
        log = open(os.path.join(tmp, "%s-%d.log" % (side, r))).read()
        path = os.path.join(tmp, "%s-%d.jsonl" % (side, r))
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            refused[side] = log.strip().splitlines()[-1] if log.strip() else "no output"
            continue
        recs = [json.loads(l) for l in open(path)]
        steps = [x for x in recs if "tokens_per_s" in x and x["step"] > 2]
        tok = statistics.median(x["tokens_per_s"] for x in steps)
        rss = int(open(os.path.join(tmp, "%s-%d.rss" % (side, r))).read().split()[-1]) / 1024
        m = re.search(r"rank 0 peak ([0-9.]+) MiB", log)  # train's summary: the ledger's peak
        peak = float(m.group(1)) if m else 0.0
        if side not in best or tok > best[side][0]:
            best[side] = (tok, rss, peak)
print("\n%s, bf16, 1 rank, micro-batch %s x %s: best of %d rounds\n" % (model, mb, seq, rounds))
print("| optimizer state | tokens/s | step time / in memory | peak RSS (MiB) | ledger peak (MiB) |")
print("| --- | ---: | ---: | ---: | ---: |")
for side in ("memory", "offload"):
    name = "in memory" if side == "memory" else "disk (--offload-dir)"
    if side not in best:
        print("| %s | refused: %s | | | |" % (name, refused.get(side, "?")))
        continue
    tok, rss, peak = best[side]
    ratio = "%.2f" % (best["memory"][0] / tok) if "memory" in best else "-"
    print("| %s | %.0f | %s | %.0f | %s |" % (name, tok, ratio, rss, "%.0f" % peak if peak else "-"))
PY
