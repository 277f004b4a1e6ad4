#!/usr/bin/env bash
# launch_test.sh — tools/launch.sh builds the right mpirun command and fails
# clearly without mpirun; `tessera train` rejects bad ZeRO stages, global
# batches, dtypes, loss-scale, checkpointing and pipeline flags before any work,
# printing the derived values (and a flag error) once.
#   launch_test.sh LAUNCH_SH TESSERA_BIN
set -uo pipefail
launch="$1"
bin="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fails=0

# check, check_eq, absent, lines
source "$(dirname "${BASH_SOURCE[0]}")/testing.sh"

# 1. No mpirun on PATH: exit 2 with one line naming mpirun and the package.
mkdir -p "$tmp/empty"
out="$(PATH="$tmp/empty" /bin/bash "$launch" -n 2 /bin/true 2>&1)"
rc=$?
check_eq "missing mpirun exit code" 2 "$rc"
check "missing mpirun message" "mpirun: not found on PATH" "$out"
check "missing mpirun names the package" "openmpi-bin" "$out"
check_eq "missing mpirun: one line" 1 "$(lines "$out")"

# 2. A fake mpirun records the command line.
mkdir -p "$tmp/bin"
printf '#!/bin/sh\necho "mpirun $*"\necho "OMP_NUM_THREADS=$OMP_NUM_THREADS"\n' >"$tmp/bin/mpirun"
chmod +x "$tmp/bin/mpirun"
out="$(env -u OMP_NUM_THREADS PATH="$tmp/bin:/usr/bin:/bin" /bin/bash "$launch" -n 4 /bin/echo a b 2>&1)"
check "ranks" "mpirun -n 4 " "$out"
check "oversubscribe" "--oversubscribe" "$out"
check "binary and args" "/bin/echo a b" "$out"
check_eq "threads per rank" "OMP_NUM_THREADS=$(($(nproc) / 4 > 1 ? $(nproc) / 4 : 1))" \
  "$(printf '%s\n' "$out" | grep '^OMP_NUM_THREADS=')"
if [[ "$(id -u)" == 0 ]]; then
  check "root adds --allow-run-as-root" "--allow-run-as-root" "$out"
else
  [[ "$out" != *--allow-run-as-root* ]] || { echo "FAIL non-root got --allow-run-as-root"; fails=$((fails + 1)); }
fi
echo "node1 slots=2" >"$tmp/hosts"
out="$(PATH="$tmp/bin:/usr/bin:/bin" /bin/bash "$launch" -n 2 --hostfile "$tmp/hosts" /bin/echo 2>&1)"
check "hostfile passes through" "--hostfile $tmp/hosts" "$out"
out="$(PATH="$tmp/bin:/usr/bin:/bin" /bin/bash "$launch" -n 0 /bin/echo 2>&1)"
check "bad -n" "-n 0: expected a number of ranks >= 1" "$out"
out="$(PATH="$tmp/bin:/usr/bin:/bin" /bin/bash "$launch" -n 2 --hostfile "$tmp/nope" /bin/echo 2>&1)"
check "missing hostfile" "--hostfile $tmp/nope: cannot read" "$out"

# 3. tessera train: bad use fails before any work, with the derived values.
out="$("$bin" train --model m --data d --zero 4 2>&1)"
rc=$?
check_eq "--zero 4 exit code" 2 "$rc"
check "--zero 4 message" "--zero 4: expected a ZeRO stage 0, 1, 2 or 3" "$out"
out="$("$bin" train --model m --data d --micro-batch 4 --global-batch 10 2>&1)"
rc=$?
check_eq "indivisible global batch exit code" 1 "$rc"
check "indivisible global batch" \
  "--global-batch 10: not divisible by 1 ranks x --micro-batch 4 = 4 (it would need --grad-accum 2.5)" "$out"
out="$("$bin" train --model m --data d --micro-batch 4 --grad-accum 2 --global-batch 16 2>&1)"
check "inconsistent global batch" \
  "--global-batch 16: expected 1 ranks x --micro-batch 4 x --grad-accum 2 = 8" "$out"
# Mixed precision and checkpointing flags: bad values name the flag and the choices.
out="$("$bin" train --model m --data d --dtype fp8 2>&1)"
check "--dtype fp8" "fp8" "$out"
check "--dtype choices" "fp16" "$out"
out="$("$bin" train --model m --data d --loss-scale 1024 2>&1)"
rc=$?
check_eq "--loss-scale without fp16 exit code" 2 "$rc"
check "--loss-scale without fp16" "--loss-scale applies to --dtype fp16 only (got --dtype fp32)" "$out"
out="$("$bin" train --model m --data d --comm-timeout -5 2>&1)"
rc=$?
check_eq "--comm-timeout -5 exit code" 2 "$rc"
check_eq "--comm-timeout -5 message" \
  "tessera train: --comm-timeout -5: expected 0 (wait forever) or seconds from 1 to 1e9, in decimal" \
  "$out"
for v in 0.5 1e10 0x10 " 5" nan abc ""; do # too short, too long, not decimal
  out="$("$bin" train --model m --data d --comm-timeout "$v" 2>&1)"
  rc=$?
  check_eq "--comm-timeout [$v] exit code" 2 "$rc"
  check_eq "--comm-timeout [$v] message" \
    "tessera train: --comm-timeout $v: expected 0 (wait forever) or seconds from 1 to 1e9, in decimal" \
    "$out"
done
out="$("$bin" train --model m --data d --dtype fp16 --loss-scale -4 2>&1)"
check "--loss-scale -4" "--loss-scale -4: expected dynamic or a scale > 0" "$out"
out="$("$bin" train --model m --data d --activation-checkpointing every:0 2>&1)"
rc=$?
check_eq "--activation-checkpointing every:0 exit code" 2 "$rc"
check "--activation-checkpointing every:0" \
  "--activation-checkpointing every:0: expected none, all or every:K with K >= 1" "$out"
out="$("$bin" train --model m --data d --activation-checkpointing some 2>&1)"
check "--activation-checkpointing some" "--activation-checkpointing some: expected none" "$out"

# Pipeline flags: bad values name the flag and what fits.
out="$("$bin" train --model m --data d --pipeline 0 2>&1)"
check_eq "--pipeline 0 exit code" 2 "$?"
check "--pipeline 0" "--pipeline 0: expected an integer >= 1 (digits, or such as 1e9 or 7.5e9)" "$out"
out="$("$bin" train --model m --data d --pipeline 65 2>&1)"
check_eq "--pipeline 65 exit code" 2 "$?"
check "--pipeline 65" "--pipeline 65: expected 1 to 64 stages" "$out"
out="$("$bin" train --model m --data d --schedule zigzag 2>&1)"
check_eq "--schedule zigzag exit code" 2 "$?"
check "--schedule zigzag" "--schedule zigzag: expected gpipe, 1f1b, interleaved, zb-h1 or zbv" "$out"
out="$("$bin" train --model m --data d --pipeline 2 2>&1)"
check_eq "--pipeline 2 on one rank exit code" 1 "$?"
check "--pipeline 2 on one rank" "--pipeline 2: expected a number of stages dividing the 1 rank" "$out"
check_eq "--pipeline 2 on one rank: one line" 1 "$(lines "$out")"

# Two ranks: the same error, printed once, and the job fails.
out="$(OMP_NUM_THREADS=1 timeout 120 mpirun -n 2 --oversubscribe --bind-to none \
  $([[ "$(id -u)" == 0 ]] && echo --allow-run-as-root) \
  "$bin" train --model m --data d --micro-batch 4 --global-batch 12 2>&1)"
rc=$?
check_eq "2 ranks exit code" 1 "$rc"
check "2 ranks derived values" \
  "--global-batch 12: not divisible by 2 ranks x --micro-batch 4 = 8 (it would need --grad-accum 1.5)" "$out"
n="$(printf '%s\n' "$out" | grep -c "not divisible")"
check_eq "2 ranks print once" 1 "$n"
# A pipeline that does not divide the ranks: refused in setup, printed once.
out="$(OMP_NUM_THREADS=1 timeout 120 mpirun -n 2 --oversubscribe --bind-to none \
  $([[ "$(id -u)" == 0 ]] && echo --allow-run-as-root) \
  "$bin" train --model m --data d --pipeline 3 2>&1)"
check_eq "2 ranks --pipeline 3 exit code" 1 "$?"
n="$(printf '%s\n' "$out" | grep -c "tessera train: rank 0 of 2: --pipeline 3: expected a number of stages dividing the 2 ranks$")"
check_eq "2 ranks --pipeline 3 prints once" 1 "$n"
# Hybrid sharding whose group does not divide the ranks: refused in setup, once.
out="$(OMP_NUM_THREADS=1 timeout 120 mpirun -n 2 --oversubscribe --bind-to none \
  $([[ "$(id -u)" == 0 ]] && echo --allow-run-as-root) \
  "$bin" train --model m --data d --shard-group 3 2>&1)"
check_eq "2 ranks --shard-group 3 exit code" 1 "$?"
n="$(printf '%s\n' "$out" | grep -c "tessera train: rank 0 of 2: --shard-group 3: expected a divisor of the 2 data-parallel ranks (groups of S consecutive ranks)$")"
check_eq "2 ranks --shard-group 3 prints once" 1 "$n"
# A flag error, found by every rank before MPI starts, prints on rank 0 only.
out="$(OMP_NUM_THREADS=1 timeout 120 mpirun -n 2 --oversubscribe --bind-to none \
  $([[ "$(id -u)" == 0 ]] && echo --allow-run-as-root) \
  "$bin" train --model m --data d --steps 0 2>&1)"
rc=$?
check_eq "2 ranks flag error exit code" 2 "$rc"
n="$(printf '%s\n' "$out" | grep -c "^tessera train: --steps 0: expected an integer >= 1 (digits, or such as 1e9 or 7\.5e9)$")"
check_eq "2 ranks flag error prints once" 1 "$n"

if ((fails)); then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all launch checks passed"
