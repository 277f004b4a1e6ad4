#!/usr/bin/env bash
# gpu_suite.sh — runs the GPU test binaries of tools/gpu_bundle.sh's bundle
# (copied there as run.sh) and gives one verdict that fits a 10-minute
# command with its log kept:
#
#   run.sh LOG_DIR [NAME...]    (default: every binary listed in tests.txt)
#
# First the stack the binaries will load (gpu_info: GPU, driver, CUDA
# runtime, cuDNN, cuBLASLt, NVRTC, NCCL, each with its version and file),
# then each binary under `timeout` with gtest's brief output (failures
# only), one status line per binary, and last a list of what failed and
# the line
#     N passed, N failed
# counting binaries; the exit status is 0 only when none failed.
#
# LOG_DIR (created) keeps everything: gpu_info.txt, NAME.log (the binary's
# whole output, brief), NAME.xml (gtest's report: every test, its time and
# its failure messages) and summary.txt (the lines printed after the runs).
#
# Ranks: a third column N > 1 in tests.txt runs the binary under the
# bundle's ./mpirun with N ranks (ranks on this one machine and its GPU).
#
# Time: tests.txt gives each binary's limit in seconds ("NAME SECONDS [N]"); a
# binary past it is killed (TERM, then KILL 10 s later) and counts as failed
# ("timed out"). BUDGET (default 540 s) caps the whole run: a binary is
# given no more than what is left of it, less 15 s for the summary, and one
# that would get under 10 s (and under its own limit) is not started ("not
# run: budget spent"), so
# the verdict prints inside a 10-minute command even when binaries hang.
# SCALE multiplies every limit (a slower machine).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if (($# < 1)) || [[ "$1" == -* ]]; then
  echo "usage: run.sh LOG_DIR [NAME...]  (NAMEs from $HERE/tests.txt)" >&2
  exit 2
fi
LOG_DIR="$1"
shift
BUDGET="${BUDGET:-540}"
SCALE="${SCALE:-1}"
[[ "$BUDGET" =~ ^[0-9]+$ ]] || { echo "run.sh: BUDGET=$BUDGET: expected whole seconds" >&2; exit 2; }
[[ "$SCALE" =~ ^[0-9]+$ && "$SCALE" -ge 1 ]] || { echo "run.sh: SCALE=$SCALE: expected a whole number >= 1" >&2; exit 2; }
mkdir -p "$LOG_DIR" || { echo "run.sh: cannot create $LOG_DIR" >&2; exit 2; }
LOG_DIR="$(cd "$LOG_DIR" && pwd)"
[[ -f "$HERE/tests.txt" ]] || { echo "run.sh: no $HERE/tests.txt" >&2; exit 2; }

declare -A LIMIT=() NP=()
ORDER=()
while read -r name secs np; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  [[ "$secs" =~ ^[0-9]+$ ]] || { echo "run.sh: tests.txt: $name: limit '$secs' is not whole seconds" >&2; exit 2; }
  [[ "${np:-1}" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: tests.txt: $name: ranks '$np' is not a positive number" >&2; exit 2; }
  LIMIT[$name]="$secs"
  NP[$name]="${np:-1}"
  ORDER+=("$name")
done <"$HERE/tests.txt"
if (($# > 0)); then
  for name in "$@"; do
    [[ -n "${LIMIT[$name]:-}" ]] || { echo "run.sh: $name is not in tests.txt (${ORDER[*]})" >&2; exit 2; }
  done
  ORDER=("$@")
fi

cd "$HERE" || exit 2
if [[ -f ./env.sh ]]; then
  # shellcheck source=/dev/null
  source ./env.sh # the bundle's libraries, and CUDA's from PyTorch's wheels where needed
fi

start=$SECONDS
{
  echo "== the GPU stack"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1 ||
    echo "nvidia-smi: not available"
  if [[ -x ./gpu_info ]]; then ./gpu_info; else echo "gpu_info: not in the bundle"; fi
} 2>&1 | tee "$LOG_DIR/gpu_info.txt"

passed=0 failed=0
summary=()
for name in "${ORDER[@]}"; do
  left=$((BUDGET - (SECONDS - start) - 15))
  want=$((LIMIT[$name] * SCALE))
  limit=$want
  ((limit <= left)) || limit=$left
  if ((limit < want && limit < 10)); then
    failed=$((failed + 1))
    summary+=("NOT RUN $name: the ${BUDGET} s budget is spent")
    echo "== $name: not run (budget spent)"
    continue
  fi
  echo "== $name (limit ${limit} s)"
  t0=$SECONDS
  launch=()
  ((NP[$name] == 1)) || launch=(./mpirun -n "${NP[$name]}") # ranks: the bundle's mpirun
  timeout --kill-after=10 "$limit" ${launch[@]+"${launch[@]}"} "./$name" --gtest_brief=1 \
    --gtest_color=no "--gtest_output=xml:$LOG_DIR/$name.xml" >"$LOG_DIR/$name.log" 2>&1
  rc=$?
  secs=$((SECONDS - t0))
  # The brief output: failures with their messages, and gtest's last lines.
  grep -v '^Running main() from' "$LOG_DIR/$name.log" | tail -n 40
  # The failed tests' names (Suite.Test, Param/Suite.Test/0), each once.
  failures="$(sed -n 's/^\[  FAILED  \] \([A-Za-z0-9_/]*\.[A-Za-z0-9_/]*\).*/\1/p' "$LOG_DIR/$name.log" |
    sort -u | tr '\n' ' ')"
  if ((rc == 0)); then
    passed=$((passed + 1))
    echo "-- $name: passed (${secs} s)"
  elif ((rc == 124 || rc == 137)); then
    failed=$((failed + 1))
    summary+=("TIMED OUT $name after ${limit} s${failures:+ (failed before: $failures)}")
    echo "-- $name: TIMED OUT after ${limit} s"
  else
    failed=$((failed + 1))
    if ((rc > 128)); then why="killed by signal $((rc - 128))"; else why="exit $rc"; fi
    summary+=("FAILED $name ($why, ${secs} s): ${failures:-no gtest failure line; see $LOG_DIR/$name.log}")
    echo "-- $name: FAILED ($why, ${secs} s)"
  fi
done

{
  echo "== summary ($((SECONDS - start)) s; logs in $LOG_DIR)"
  for line in ${summary[@]+"${summary[@]}"}; do echo "$line"; done
  echo "$passed passed, $failed failed"
} | tee "$LOG_DIR/summary.txt"
exit $((failed > 0))
