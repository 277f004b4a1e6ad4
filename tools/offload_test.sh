#!/usr/bin/env bash
# offload_test.sh — train --offload-dir through the command line, on
# llama-tiny with generated token shards:
#  1. the same steps as without it (1 rank bf16; 2 ranks ZeRO-3 bf16, ZeRO-1
#     fp32, 2 pipeline stages bf16), and its
#     checkpoints byte-identical to those of the run without it;
#  2. checkpoints go both ways: an offloaded run's checkpoint resumes
#     without offload, a plain run's with it, each ending byte-identical
#     to the uninterrupted plain run;
#  3. the scratch file is gone after the run (and during it: unlinked);
#     estimate --offload-dir prints the disk's rows, equal to what the
#     run's ledger charged (train's metrics say nothing of the disk: the
#     plan is checked against the ledger in zero_test);
#  4. bad folders, one line each and the exact exit code: a file, a missing
#     folder, ""; estimate --device cuda (the GPU's offload is not built
#     yet); a disk too small for the state (a 64 KiB
#     tmpfs in a private mount namespace, where this machine allows one):
#     refused at create, before the first step, its --save folder's
#     checkpoint untouched.
#   offload_test.sh TESSERA_BIN LAUNCH_SH
set -uo pipefail
bin="$1"
launch="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fails=0
source "$(dirname "${BASH_SOURCE[0]}")/testing.sh"
presets_home
mpi_scratch
make_token_shards "$tmp/data"
mkdir -p "$tmp/off"
common=(--model llama-tiny --data "$tmp/data" --seq 32 --micro-batch 2 --log-every 1)

# 1. the same steps and checkpoints as without offload
for run in "1 --dtype bf16" "2 --zero 3 --dtype bf16" "2 --zero 1" "2 --pipeline 2 --dtype bf16"; do
  read -r n rest <<<"$run"
  read -ra extra <<<"$rest"
  tag="$n-${extra[*]// /}"
  tag="${tag//-/}"
  a="$("$launch" -n "$n" "$bin" train "${common[@]}" "${extra[@]}" --steps 6 --save "$tmp/p$tag" 2>&1)"
  check_eq "plain $run: exit" 0 $?
  b="$("$launch" -n "$n" "$bin" train "${common[@]}" "${extra[@]}" --steps 6 --save "$tmp/o$tag" \
    --offload-dir "$tmp/off" 2>&1)"
  check_eq "offloaded $run: exit" 0 $?
  [[ -n "$(steps "$a")" ]] || { echo "FAIL $run: no step lines"; fails=$((fails + 1)); }
  check_eq "offloaded $run: the same steps" "$(steps "$a")" "$(steps "$b")"
  check_eq "offloaded $run: the same checkpoint" "$(shas "$tmp/p$tag/step-00000006")" \
    "$(shas "$tmp/o$tag/step-00000006")"
done

# 2. checkpoints both ways, 2 ranks ZeRO-2 fp16 (loss scaling's state too)
two=(--zero 2 --dtype fp16 --save-every 3)
"$launch" -n 2 "$bin" train "${common[@]}" "${two[@]}" --steps 6 --save "$tmp/whole" >/dev/null 2>&1
check_eq "uninterrupted: exit" 0 $?
"$launch" -n 2 "$bin" train "${common[@]}" "${two[@]}" --steps 6 --save "$tmp/off3" \
  --offload-dir "$tmp/off" >/dev/null 2>&1
check_eq "offloaded: exit" 0 $?
check_eq "offloaded: its step-3 checkpoint the plain run's" "$(shas "$tmp/whole/step-00000003")" \
  "$(shas "$tmp/off3/step-00000003")"
"$launch" -n 2 "$bin" train "${common[@]}" "${two[@]}" --steps 6 --resume "$tmp/off3/step-00000003" \
  --save "$tmp/plain6" >/dev/null 2>&1
check_eq "plain resume of an offloaded checkpoint: exit" 0 $?
check_eq "offloaded -> plain: byte-identical" "$(shas "$tmp/whole/step-00000006")" \
  "$(shas "$tmp/plain6/step-00000006")"
"$launch" -n 2 "$bin" train "${common[@]}" "${two[@]}" --steps 6 --resume "$tmp/whole/step-00000003" \
  --save "$tmp/off6" --offload-dir "$tmp/off" >/dev/null 2>&1
check_eq "offloaded resume of a plain checkpoint: exit" 0 $?
check_eq "plain -> offloaded: byte-identical" "$(shas "$tmp/whole/step-00000006")" \
  "$(shas "$tmp/off6/step-00000006")"

# 3. nothing left behind; the plan's disk rows
check_eq "no scratch file left" "" "$(ls -A "$tmp/off")"
j="$("$bin" estimate --model llama-tiny --seq 32 --micro-batch 2 --dtype bf16 \
  --offload-dir "$tmp/off" --json)"
check_eq "estimate: exit" 0 $?
check "estimate --json: the disk's master" '"master":' "$(grep -A3 '"disk"' <<<"$j")"
t="$("$bin" estimate --model llama-tiny --seq 32 --micro-batch 2 --dtype bf16 \
  --offload-dir "$tmp/off")"
check "estimate: a disk row" "| disk: optim |" "$t"
check_eq "estimate leaves the folder alone" "" "$(ls -A "$tmp/off")"

# 4. bad folders
touch "$tmp/file"
exact "--offload-dir FILE" 1 \
  "tessera train: --offload-dir $tmp/file: cannot create a scratch file there: Not a directory" \
  "$bin" train "${common[@]}" --steps 2 --offload-dir "$tmp/file"
exact "--offload-dir missing" 1 \
  "tessera train: --offload-dir $tmp/none: cannot create a scratch file there: No such file or directory" \
  "$bin" train "${common[@]}" --steps 2 --offload-dir "$tmp/none"
exact "--offload-dir \"\"" 1 "tessera train: --offload-dir \"\": expected a folder" \
  "$bin" train "${common[@]}" --steps 2 --offload-dir ""
exact "--offload-dir on cuda" 2 \
  "tessera estimate: --offload-dir $tmp/off on cuda: the GPU's offload is not built yet; expected the cpu device" \
  "$bin" estimate --model llama-tiny --device cuda --offload-dir "$tmp/off"
if unshare -m true 2>/dev/null; then
  mkdir -p "$tmp/small" "$tmp/keep"
  "$bin" train "${common[@]}" --steps 2 --save "$tmp/keep" >/dev/null 2>&1
  before="$(shas "$tmp/keep/step-00000002")"
  o="$(unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs "$1" && shift && exec "$@"' _ \
    "$tmp/small" "$bin" train "${common[@]}" --steps 4 --resume "$tmp/keep/step-00000002" \
    --save "$tmp/keep" --offload-dir "$tmp/small" 2>&1)"
  rc=$?
  check_eq "a disk too small: exit" 1 "$rc"
  check_eq "a disk too small: one line" 1 "$(lines "$o")"
  check "a disk too small: says so" \
    "tessera train: --offload-dir $tmp/small: " "$o"
  check "a disk too small: the bytes and the reason" \
    "bytes of optimizer state do not fit: No space left on device" "$o"
  check_eq "a disk too small: the checkpoint untouched" "$before" "$(shas "$tmp/keep/step-00000002")"
  check_eq "a disk too small: nothing saved after it" "step-00000002" "$(ls "$tmp/keep")"
else
  echo "note: no private mount namespace here (unshare -m): the small-disk case is skipped"
fi

echo "offload_test: $fails failure(s)"
[[ $fails -eq 0 ]]
