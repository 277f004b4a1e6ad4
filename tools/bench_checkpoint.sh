#!/usr/bin/env bash
# Checkpoint save and load against this disk's own rate, in one script run.
#
#   tools/bench_checkpoint.sh [MODEL] [RANKS] [REPEATS]
#     (default llama-small, "1 2 4", 3)
#
# Baseline: dd of a file the size of the checkpoint, written with
# conv=fsync (sequential write, flushed to the disk) and read back with
# iflag=direct (no page cache), the same bytes the same way each time.
# tessera: per rank count N, `train --steps 1 --save --save-sync` (every
# rank writes its file, SHA-256 computed while writing, fsync, rename, the
# index last: training waits for all of it), `train --steps 8 --save-every 4`
# (asynchronous, the default: each save stalls training for the copy of the
# rank's state to host staging, and for the previous save's write if it is
# not done; a thread writes while training goes on), the same 8 steps
# without saves (their tokens/s against the asynchronous run's: what the
# writer thread takes from the steps it overlaps) and `train --resume`
# (every rank checks its share of the checksums, then reads its slices).
# The stall column is training's wait per asynchronous save (the copy, and
# any wait for the previous write) against the synchronous save's; the
# load's time includes the checksum pass (GB/s are the checkpoint's bytes
# over the wall time: the disk delivers them once, the slices then come
# from the page cache). The page cache is dropped before each load and each
# dd read when the script may (root); otherwise reads may come from memory
# and say so. Figures are the best of REPEATS (the tokens/s ratio: their
# median). Prints a table, and the per-rank cost of a LLaMA-2 70B save (16
# bytes per parameter in bf16: 2 params + 4 master + 8 Adam, over its
# ranks) at the measured rate. TESSERA_BIN as in tools/bench_env.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:-llama-small}"
RANKS="${2:-1 2 4}"
REPEATS="${3:-3}"
cd "$ROOT"
# shellcheck source=tools/bench_env.sh
source tools/bench_env.sh # BIN, DATA, TMP
export OMP_NUM_THREADS=1
OUT="${BENCH_DIR:-$TMP}" # where checkpoints go: the disk measured

drop_caches() { # 1 when the page cache was dropped
  sync
  if [[ -w /proc/sys/vm/drop_caches ]] && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
    echo 1
  else
    echo 0
  fi
}
best() { sort -g | head -n 1; }
# The GB/s of a dd line ("... copied, 0.25 s, 1.3 GB/s"), as bytes / seconds.
dd_rate() { awk '/copied/ { for (i = 1; i <= NF; i++) if ($i == "s,") print $1 / $(i - 1) / 1e9 }'; }

printf '%s: save and load on %s (best of %s)\n' "$MODEL" "$OUT" "$REPEATS"
printf '| ranks | checkpoint GB | sync save s | save GB/s | dd write GB/s | save / dd | async stall s | stall / sync save | tok/s async / none | load s | load GB/s | dd read GB/s | load / dd | cache dropped |\n'
printf '| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |\n'
for n in $RANKS; do
  saves=() stalls=() speeds=() loads=() writes=() reads=() gb="" dropped=1
  for ((k = 0; k < REPEATS; k++)); do
    rm -rf "$OUT/ck"
    log="$(tools/launch.sh -n "$n" "$BIN" train --model "$MODEL" --data "$DATA" --steps 1 \
      --micro-batch 1 --seq 64 --zero 3 --eval-batches 1 --save "$OUT/ck" --save-sync 2>&1)"
    line="$(grep '^checkpoint save:' <<<"$log")"
    gb="$(sed 's/.* saved, \([0-9.]*\) GB each.*/\1/' <<<"$line")"
    saves+=("$(sed 's/.* GB each in \([0-9.]*\) s.*/\1/' <<<"$line")")
    rm -rf "$OUT/ck"
    log="$(tools/launch.sh -n "$n" "$BIN" train --model "$MODEL" --data "$DATA" --steps 8 \
      --save-every 4 --micro-batch 1 --seq 64 --zero 3 --eval-batches 1 --save "$OUT/ck" 2>&1)"
    line="$(grep '^checkpoint save:' <<<"$log")"
    stalls+=("$(sed 's/.* training blocked \([0-9.]*\) s per save.*/\1/' <<<"$line")")
    async_tok="$(grep '^trained' <<<"$log" | sed 's/.*, \([0-9.]*\) tok\/s.*/\1/')"
    log="$(tools/launch.sh -n "$n" "$BIN" train --model "$MODEL" --data "$DATA" --steps 8 \
      --micro-batch 1 --seq 64 --zero 3 --eval-batches 1 2>&1)"
    none_tok="$(grep '^trained' <<<"$log" | sed 's/.*, \([0-9.]*\) tok\/s.*/\1/')"
    speeds+=("$(python3 -c "print($async_tok / $none_tok)")")
    d="$(drop_caches)"
    ((d)) || dropped=0
    log="$(tools/launch.sh -n "$n" "$BIN" train --model "$MODEL" --data "$DATA" --steps 9 \
      --micro-batch 1 --seq 64 --zero 3 --eval-batches 1 --resume "$OUT/ck" 2>&1)"
    line="$(grep '^checkpoint load:' <<<"$log")"
    loads+=("$(sed 's/.* in \([0-9.]*\) s, .*/\1/' <<<"$line")")
    mb=$(python3 -c "print(max(1, round($gb * 1e9 / 2**20)))")
    writes+=("$(dd if=/dev/zero of="$OUT/dd" bs=1M count="$mb" conv=fsync 2>&1 | dd_rate)")
    drop_caches >/dev/null
    reads+=("$(dd if="$OUT/dd" of=/dev/null bs=1M iflag=direct 2>&1 | dd_rate)")
    rm -f "$OUT/dd"
  done
  s="$(printf '%s\n' "${saves[@]}" | best)"
  a="$(printf '%s\n' "${stalls[@]}" | best)"
  v="$(printf '%s\n' "${speeds[@]}" | sort -g | awk '{ x[NR] = $1 } END { print x[int((NR + 1) / 2)] }')"
  l="$(printf '%s\n' "${loads[@]}" | best)"
  w="$(printf '%s\n' "${writes[@]}" | sort -g | tail -n 1)"
  r="$(printf '%s\n' "${reads[@]}" | sort -g | tail -n 1)"
  python3 - "$n" "$gb" "$s" "$w" "$a" "$v" "$l" "$r" "$dropped" <<'PY'
import sys
n, gb, s, w, a, v, l, r, dropped = sys.argv[1:]
gb, s, w, a, v, l, r = map(float, (gb, s, w, a, v, l, r))
print(f"| {n} | {gb:.3f} | {s:.3f} | {gb / s:.3f} | {w:.3f} | {gb / s / w:.0%} | {a:.4f} | "
      f"{a / s:.1%} | {v:.3f} | {l:.3f} | {gb / l:.3f} | {r:.3f} | {gb / l / r:.0%} | "
      f"{'yes' if dropped == '1' else 'no'} |")
PY
  last_rate="$(python3 -c "print($gb / $s)")"
done
python3 - "$last_rate" <<'PY'
import sys
rate = float(sys.argv[1])  # GB/s of the last row's save, over all its ranks on this one disk
psi = 70e9
for ranks in (64, 512, 1024):
    per_rank = 16 * psi / ranks / 1e9
    print(f"LLaMA-2 70B, bf16, ZeRO-3 on {ranks} ranks: {per_rank:.2f} GB per rank; at this "
          f"disk's measured {rate:.2f} GB/s per node of 8 ranks: "
          f"{8 * per_rank / rate:.1f} s per save")
PY
