#!/bin/bash
# expect_job_fails.sh WANT_STATUS RUNNER NP BINARY [ARGS...] — runs
# `RUNNER NP BINARY ARGS` (RUNNER is mpirun_test.sh) and passes only if the
# job ends with exit status WANT_STATUS: a rank died or aborted and mpirun
# took the whole job down with that rank's status. It fails if the job
# succeeds, ends with another status, or hangs (mpirun_test.sh's timeout,
# TS_MPIRUN_TIMEOUT, 30 s here, reports 124 or 137).
set -u
if [ $# -lt 4 ]; then
  echo "usage: expect_job_fails.sh WANT_STATUS RUNNER NP BINARY [ARGS...]" >&2
  exit 2
fi
want=$1
runner=$2
shift 2
export TS_MPIRUN_TIMEOUT="${TS_MPIRUN_TIMEOUT:-30}"
start=$(date +%s%N)
"$runner" "$@"
rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
echo "expect_job_fails.sh: '$*' ended with status $rc after $ms ms (want $want)"
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "FAIL: the job hung until the $TS_MPIRUN_TIMEOUT s timeout instead of ending" >&2
  exit 1
fi
if [ "$rc" -ne "$want" ]; then
  echo "FAIL: wanted status $want from mpirun, got $rc" >&2
  exit 1
fi
echo "PASS"
