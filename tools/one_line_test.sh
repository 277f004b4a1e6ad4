#!/usr/bin/env bash
# one_line_test.sh — four inputs that gave many lines or the wrong words,
# each now one exact line with its exact exit code, and nothing lost:
#  1. a stray word where a flag should stand (was "unknown flag WORD"), in
#     every command that parses flags (tools/flags.c), and under launch;
#  2. a file input of prepare that is a folder (was "--text PATH: read
#     failed" for --tokenizer's tokenizer.model);
#  3. launch -n 2 with no tessera command, or none (was the usage from the
#     lead rank after mpirun started);
#  4. a disk that fills during a save (a tmpfs of its own in a mount
#     namespace), on 1 rank and on 2, asynchronous and synchronous saves
#     (was 9 lines of MPI_Abort text on 2 ranks): one rank's line naming the
#     file and "No space left on device", exit 1, the previous checkpoint
#     complete and intact, the half-written one no checkpoint.
#   one_line_test.sh TESSERA_BIN LAUNCH_SH
set -uo pipefail
bin="$1"
launch="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fails=0
source "$(dirname "${BASH_SOURCE[0]}")/testing.sh"
presets_home
mpi_scratch
make_token_shards "$tmp/data"

# 1. a stray word, every command of tools/flags.c
stray() { # stray SUB WORD CMD... — CMD says WORD is no flag, exit 2
  exact "$1 $2" 2 \
    "tessera $1: unexpected argument \"$2\": expected only flags and their values (--help lists the flags)" \
    "${@:3}"
}
stray train extra "$bin" train --model llama-tiny extra
stray estimate foo "$bin" estimate foo --model llama-tiny
stray simulate 4 "$bin" simulate --model llama-tiny -n 2 4
stray compare extra "$bin" compare --model llama-tiny -n 1 extra
stray prepare extra "$bin" prepare --text "$tmp/none.txt" extra --vocab-size 300 --out "$tmp/p"
stray generate God "$bin" generate --hf "$tmp/none" --prompt And God said
stray export extra "$bin" export "$tmp/none" extra --out "$tmp/e"
stray timeline extra "$bin" timeline "$tmp/none.json" extra
exact "train extra under launch -n 2: once" 2 \
  "tessera train: unexpected argument \"extra\": expected only flags and their values (--help lists the flags)" \
  "$launch" -n 2 "$bin" train --model llama-tiny --data "$tmp/data" extra

# 2. a folder where prepare reads a file
printf 'in the beginning\n\nwas the word\n' >"$tmp/text.txt"
mkdir -p "$tmp/hf/tokenizer.model"
exact "prepare --tokenizer with a folder tokenizer.model" 2 \
  "tessera prepare: $tmp/hf/tokenizer.model: is a folder; expected a file" \
  "$bin" prepare --text "$tmp/text.txt" --tokenizer "$tmp/hf" --out "$tmp/p"
check_eq "prepare --tokenizer with a folder tokenizer.model: no --out" "" "$(ls -d "$tmp/p"* 2>/dev/null)"

# 3. launch with no tessera command, before mpirun starts
commands="prepare, train, estimate, simulate, compare, export, generate, timeline"
exact "launch -n 2 tessera frobnicate" 2 \
  "tessera launch: frobnicate: not a tessera command; expected one of $commands" \
  "$launch" -n 2 "$bin" frobnicate --model llama-tiny
exact "launch -n 2 --max-restarts 3 tessera frobnicate" 2 \
  "tessera launch: frobnicate: not a tessera command; expected one of $commands" \
  "$launch" -n 2 --max-restarts 3 "$bin" frobnicate
exact "launch -n 2 tessera" 2 "tessera launch: no command given: expected one of $commands" \
  "$launch" -n 2 "$bin"
o="$("$launch" -n 1 "$bin" --help 2>&1)"
check_eq "launch -n 1 tessera --help: exit" 0 $?
check "launch -n 1 tessera --help: the usage" "usage: tessera <command>" "$o"

# 4. a full disk during a save: a 60 MiB tmpfs holds one llama-tiny
# checkpoint (37.8 MB, every rank's files), not two
if ! why="$(unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs "$1"' sh "$tmp" 2>&1)"; then
  echo "SKIP 4. a full disk: cannot mount a tmpfs in a mount namespace (unshare -m, as root):" \
    "$(tr '\n' ' ' <<<"$why")"
else
  cat >"$tmp/full.sh" <<'EOF'
#!/bin/bash
# full.sh DISK OUT CMD... — in a mount namespace of its own: DISK a 60 MiB tmpfs;
# CMD's stderr to OUT.err, its status to OUT.rc; DISK/ck copied to OUT.ck
disk="$1" out="$2"
shift 2
mount -t tmpfs -o size=60m tmpfs "$disk" || exit 99
"$@" 2>"$out.err" >"$out.log"
echo $? >"$out.rc"
cp -a "$disk/ck" "$out.ck"
EOF
  chmod +x "$tmp/full.sh"
  train=(train --model llama-tiny --data "$tmp/data" --seq 32 --micro-batch 2 --steps 4
    --eval-batches 1 --save-every 2)
  # full ID RANKS [FLAGS...] — a run on RANKS ranks that saves at steps 2 and 4 onto the
  # tmpfs $tmp/ID.disk: one line, the lowest failing rank's (each rank writes its own
  # file), exit 1; step 2 kept whole, step 4 no checkpoint
  full() {
    local id="$1" ranks="$2" name="a full disk ($1)" disk="$tmp/$1.disk" run=()
    shift 2
    mkdir -p "$disk"
    ((ranks == 1)) || run=("$launch" -n "$ranks")
    unshare -m "$tmp/full.sh" "$disk" "$tmp/$id" "${run[@]}" "$bin" "${train[@]}" \
      --save "$disk/ck" "$@"
    check_eq "$name: exit" 1 "$(cat "$tmp/$id.rc" 2>/dev/null)"
    local err r="" f="0" nospace="write failed: No space left on device"
    err="$(cat "$tmp/$id.err" 2>/dev/null)"
    ((ranks == 1)) || r="rank ([0-9]) of $ranks: "
    if [[ "$err" =~ ^"tessera train: "$r"$disk/ck/step-00000004/rank-0000"([0-9])".bin.tmp: $nospace"$ ]]; then
      ((ranks == 1)) || f="${BASH_REMATCH[1]}"
    fi
    check_eq "$name: the line" \
      "tessera train: ${r:+rank $f of $ranks: }$disk/ck/step-00000004/rank-0000$f.bin.tmp: $nospace" "$err"
    local ck="$tmp/$id.ck/step-00000002" got=""
    check_eq "$name: step 2 complete" "$ck/index.json" "$(ls "$ck/index.json" 2>/dev/null)"
    for f in "$ck"/rank-*.bin; do got+="\"sha256\":\"$(sha256sum <"$f" | cut -d' ' -f1)\""$'\n'; done
    check_eq "$name: step 2 whole (its files' SHA-256 as its index says)" "$(shas "$ck")" \
      "${got%$'\n'}"
    check_eq "$name: step 4 no checkpoint" "" "$(ls "$tmp/$id.ck/step-00000004/index.json" 2>/dev/null)"
    "$bin" export "$tmp/$id.ck" --out "$tmp/$id.hf" >/dev/null 2>&1
    check_eq "$name: the newest complete checkpoint exports" 0 $?
  }
  full 1-rank 1
  full 2-ranks 2
  full 2-ranks-sync 2 --save-sync
fi

echo "$fails failure(s)"
((fails == 0))
