#!/usr/bin/env bash
# offload_test.sh — train --offload-dir and --offload optimizer through the
# command line, on llama-tiny with generated token shards:
#  1. the same steps as without them (1 rank bf16; 2 ranks ZeRO-3 bf16,
#     ZeRO-1 fp32, 2 pipeline stages bf16), and their checkpoints
#     byte-identical to those of the run without (--offload optimizer on
#     the CPU: the GPU's host path, copies of 1024 elements; at ZeRO-3
#     --offload params too);
#  2. checkpoints go both ways: an offloaded run's checkpoint (disk, and
#     host) resumes without offload, a plain run's with it, each ending
#     byte-identical to the uninterrupted plain run;
#  3. the scratch file is gone after the run (and during it: unlinked);
#     estimate --offload-dir prints the disk's rows, equal to what the
#     run's ledger charged (train's metrics say nothing of the disk: the
#     plan is checked against the ledger in zero_test);
#  4. bad folders, one line each and the exact exit code: a file, a missing
#     folder, ""; --offload params below ZeRO-3, simulate --offload params
#     (not modelled); estimate --device cuda with
#     --offload optimizer or --offload-dir: master and optim on the host
#     rows, off the GPU's (--offload params: the shards too, nothing of
#     the parameters left on the GPU between steps); a disk too small for the state (a 64 KiB
#     tmpfs in a private mount namespace, where this machine allows one):
#     refused at create, before the first step, its --save folder's
#     checkpoint untouched;
#  5. under a memory cgroup's limit below the in-memory plan (a model of 8
#     wide blocks): refused at once in one line without offload, trains
#     with --offload-dir.
#  6. a disk failing mid-run (tessera_testing: a write-back fails with EIO
#     in step 4): one line naming the folder, the unit, the bytes and the
#     reason, exit 1; the step-2 checkpoint byte-identical to a clean run's
#     and resuming from it ends as the clean run does.
#   offload_test.sh TESSERA_BIN LAUNCH_SH TESSERA_TESTING_BIN
set -uo pipefail
bin="$1"
launch="$2"
testing_bin="$3"
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
  check "offloaded $run: the summary names the disk's bytes" \
    "offload: rank 0 kept " "$b"
  absent "plain $run: no offload line" "offload: rank 0" "$a"
  c="$("$launch" -n "$n" "$bin" train "${common[@]}" "${extra[@]}" --steps 6 --save "$tmp/h$tag" \
    --offload optimizer --offload-piece 1024 2>&1)"
  check_eq "--offload optimizer $run: exit" 0 $?
  check_eq "--offload optimizer $run: the same steps" "$(steps "$a")" "$(steps "$c")"
  check_eq "--offload optimizer $run: the same checkpoint" "$(shas "$tmp/p$tag/step-00000006")" \
    "$(shas "$tmp/h$tag/step-00000006")"
  [[ " ${extra[*]} " == *" --zero 3 "* ]] || continue
  d="$("$launch" -n "$n" "$bin" train "${common[@]}" "${extra[@]}" --steps 6 --save "$tmp/q$tag" \
    --offload params 2>&1)"
  check_eq "--offload params $run: exit" 0 $?
  check_eq "--offload params $run: the same steps" "$(steps "$a")" "$(steps "$d")"
  check_eq "--offload params $run: the same checkpoint" "$(shas "$tmp/p$tag/step-00000006")" \
    "$(shas "$tmp/q$tag/step-00000006")"
  check "--offload params $run: the summary says so" "and its parameter shards" "$d"
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
"$launch" -n 2 "$bin" train "${common[@]}" "${two[@]}" --steps 6 --resume "$tmp/whole/step-00000003" \
  --save "$tmp/host6" --offload optimizer >/dev/null 2>&1
check_eq "--offload optimizer resume of a plain checkpoint: exit" 0 $?
check_eq "plain -> --offload optimizer: byte-identical" "$(shas "$tmp/whole/step-00000006")" \
  "$(shas "$tmp/host6/step-00000006")"
"$launch" -n 2 "$bin" train "${common[@]}" "${two[@]}" --resume "$tmp/host6/step-00000006" \
  --steps 9 --save "$tmp/host9" --offload optimizer >/dev/null 2>&1
"$launch" -n 2 "$bin" train "${common[@]}" "${two[@]}" --steps 9 --resume "$tmp/host6/step-00000006" \
  --save "$tmp/plain9" >/dev/null 2>&1
check_eq "--offload optimizer -> plain: byte-identical" "$(shas "$tmp/host9/step-00000009")" \
  "$(shas "$tmp/plain9/step-00000009")"

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
exact "--offload-piece not a multiple of 1024" 2 \
  "tessera train: --offload-piece 1500: expected a multiple of 1024 elements" \
  "$bin" train "${common[@]}" --steps 2 --offload-dir "$tmp/off" --offload-piece 1500
exact "--offload-piece alone" 2 \
  "tessera train: --offload-piece applies to --offload-dir and --offload optimizer only" \
  "$bin" train "${common[@]}" --steps 2 --offload-piece 2048
exact "--offload params below ZeRO-3" 2 \
  "tessera train: --offload params: expected --zero 3 (the parameters sharded)" \
  "$bin" train "${common[@]}" --steps 2 --offload params --zero 2
exact "--offload nonsense" 2 "tessera train: --offload cpu: expected none, optimizer or params" \
  "$bin" train "${common[@]}" --steps 2 --offload cpu
exact "simulate --offload params" 2 \
  "tessera simulate: --offload params: not modelled (each gather's copy to the device); expected none or optimizer" \
  "$bin" simulate --model llama-tiny --offload params
for how in "--offload optimizer" "--offload-dir $tmp/off" "--offload params --zero 3"; do
  read -ra how_a <<<"$how"
  j="$("$bin" estimate --model llama-tiny --seq 32 --micro-batch 2 --dtype bf16 --device cuda \
    "${how_a[@]}" --json)"
  check_eq "estimate --device cuda $how: exit" 0 $?
  python3 - "$how" "$j" <<'PY' || fails=$((fails + 1))
import json, sys
how, s = sys.argv[1], json.loads(sys.argv[2])["stages"][0]
gpu, host = s["peak"], s["host_peak"]
ok = gpu["master"] == 0 and gpu["optim"] == 0 and host["master"] > 0 and host["optim"] > 0
ok = ok and host["staging"] > 0  # the update's gradient and parameter pieces
if "params" in how:  # the shards on the host; the card holds the gathered units only
    ok = ok and host.get("params", 0) > 0 and s["between_steps"]["params"] == 0
print(("ok" if ok else "FAIL") + " estimate --device cuda %s: the state on the host: gpu %s, host %s"
      % (how, {k: gpu[k] for k in ("master", "optim")}, {k: host[k] for k in ("master", "optim", "staging")}))
sys.exit(0 if ok else 1)
PY
done
t="$("$bin" estimate --model llama-tiny --seq 32 --micro-batch 2 --dtype bf16 --device cuda \
  --offload optimizer)"
check "estimate --device cuda --offload optimizer: a host row" "| host: optim |" "$t"
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
  check "a disk too small: the plan's bytes and the free space" \
    "the plan keeps 24.0 MiB per rank there (master 0.0, optim 24.0) x 1 rank on this node, more than its" \
    "$o"
  check "a disk too small: what to do" "free: expected a folder on a larger disk, or more nodes" "$o"
  check_eq "a disk too small: the checkpoint untouched" "$before" "$(shas "$tmp/keep/step-00000002")"
  check_eq "a disk too small: nothing saved after it" "step-00000002" "$(ls -d "$tmp"/keep/step-* | xargs -n 1 basename)"
else
  echo "note: no private mount namespace here (unshare -m): the small-disk case is skipped"
fi

# 5. a memory limit below the in-memory plan: refused at once without
#    offload, trains with it (a cgroup of this test's own, where the
#    machine lets it make one: v2, or v1's memory controller)
cg=""
cg_v2="/sys/fs/cgroup/tessera-offload-$$"
cg_v1="/sys/fs/cgroup/memory/tessera-offload-$$"
if grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null && mkdir "$cg_v2" 2>/dev/null; then
  cg="$cg_v2" limit_file=memory.max
elif [[ -d /sys/fs/cgroup/memory ]] && mkdir "$cg_v1" 2>/dev/null; then
  cg="$cg_v1" limit_file=memory.limit_in_bytes
fi
if [[ -n "$cg" ]]; then
  trap 'rmdir "$cg" 2>/dev/null' EXIT
  # a model whose optimizer state outweighs its activations: 8 wide blocks
  sed -e 's/"hidden_size": 192/"hidden_size": 1024/' -e 's/"intermediate_size": 512/"intermediate_size": 2816/' \
    -e 's/"num_hidden_layers": 4/"num_hidden_layers": 8/' -e 's/"num_attention_heads": 6/"num_attention_heads": 16/' \
    -e 's/"num_key_value_heads": 2/"num_key_value_heads": 4/' "$TESSERA_HOME/models/configs/llama-tiny.json" \
    >"$tmp/wide.json"
  wide=(--model "$tmp/wide.json" --data "$tmp/data" --seq 16 --micro-batch 1 --steps 2 --eval-batches 1)
  peak() { "$bin" estimate --model "$tmp/wide.json" --seq 16 --micro-batch 1 --json "$@" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["stages"][0]["peak_total"])'; }
  in_memory="$(peak)"
  offloaded="$(peak --offload-dir "$tmp/off")"
  limit=$((offloaded + 400 * 1024 * 1024)) # the plan, and the process's own (MPI, libraries)
  echo "in-memory plan $in_memory, offloaded $offloaded, cgroup limit $limit bytes"
  if ((in_memory <= limit)); then
    echo "FAIL the in-memory plan $in_memory fits the limit $limit: the case shows nothing"
    fails=$((fails + 1))
  fi
  echo "$limit" >"$cg/$limit_file"
  in_cg() { sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' _ "$cg" "$@"; }
  o="$(in_cg "$bin" train "${wide[@]}" 2>&1)"
  check_eq "under the limit, in memory: exit" 1 $?
  check_eq "under the limit, in memory: one line" 1 "$(lines "$o")"
  check "under the limit, in memory: the limit named" "of memory (its cgroup's limit): expected" "$o"
  o="$(in_cg "$bin" train "${wide[@]}" --offload-dir "$tmp/off" 2>&1)"
  check_eq "under the limit, offloaded: exit" 0 $?
  check "under the limit, offloaded: trains" "step     2/2" "$o"
else
  echo "note: no memory cgroup can be made here: the memory-limit case is skipped"
fi

# 6. a disk failing mid-run
six=(--model llama-tiny --data "$tmp/data" --seq 32 --micro-batch 2 --log-every 1 --steps 6
  --save-every 2 --save-sync)
"$bin" train "${six[@]}" --save "$tmp/clean" >/dev/null 2>&1
check_eq "clean: exit" 0 $?
o="$(TESSERA_TEST_DISK_FAIL=0:40 "$testing_bin" train "${six[@]}" --save "$tmp/failing" \
  --offload-dir "$tmp/off" 2>&1)"
check_eq "a failing disk: exit" 1 $?
check "a failing disk: the line" \
  "tessera train: --offload-dir $tmp/off: write of unit " "$o"
check "a failing disk: the bytes, the offset, the reason" \
  "bytes at offset " "$(grep '^tessera train:' <<<"$o")"
check "a failing disk: the system's reason" "of the scratch file): Input/output error" "$o"
check_eq "a failing disk: one error line" 1 "$(grep -c '^tessera train:' <<<"$o")"
check_eq "a failing disk: its checkpoints are the clean run's" "$(shas "$tmp/clean/step-00000002")" \
  "$(shas "$tmp/failing/step-00000002")"
check_eq "a failing disk: no later checkpoint" "step-00000002" "$(ls -d "$tmp"/failing/step-* | xargs -n 1 basename)"
"$bin" train "${six[@]}" --resume "$tmp/failing/step-00000002" --save "$tmp/after" \
  --offload-dir "$tmp/off" >/dev/null 2>&1
check_eq "a failing disk: resumed: exit" 0 $?
check_eq "a failing disk: resumed, it ends as the clean run" "$(shas "$tmp/clean/step-00000006")" \
  "$(shas "$tmp/after/step-00000006")"
check_eq "a failing disk: nothing left in the folder" "" "$(ls -A "$tmp/off")"

echo "offload_test: $fails failure(s)"
[[ $fails -eq 0 ]]
