#!/bin/bash
# watchdog_test.sh RUNNER MPI_HANG — the watchdog (comm.h,
# ts_comm_set_timeout) on jobs whose last rank is stopped with SIGSTOP
# (alive, never answering) while the others wait for it with a 2 s
# deadline (mpi_hang.c):
#  - an all-reduce on 3 ranks, on the caller's thread: ranks 0 and 1 each
#    print one line naming the call, the step, unit and micro-batch, and
#    rank 2 as the rank that did not arrive;
#  - an all-gather through a communication thread (the polled path), 2 ranks;
#  - a receive on rank 0 from the stopped rank 1: "peer rank 1";
#  - the last of 2 ranks stopped before MPI_Init_thread: the other waits
#    inside MPI, where the watchdog's guard thread ends it, naming the
#    call.
# Each job must end with exit status 4 within 2 s + 10 s of the rank's stop
# (mpirun stops the stopped rank; the stop is the mark file mpi_hang
# creates, so a slow start-up on a loaded machine counts for nothing), and
# name no other rank. Where several ranks wait, the first
# to time out ends the job and mpirun may stop the others before they
# print: at least one waiting rank's line, and every line one of theirs.
set -u
runner="$1"
hang="$2"
fails=0
source "$(dirname "${BASH_SOURCE[0]}")/../tools/testing.sh"
export TS_MPIRUN_TIMEOUT=30
host="$(hostname)"

mark="$(mktemp -u "${TEST_TMPDIR:-/tmp}/hang.XXXXXX")"
trap 'rm -f "$mark"' EXIT

# run NP MODE — sets out (stderr and stdout) and rc, and checks the time
# from the stop to the job's end (whole seconds of the mark's mtime).
run() {
  rm -f "$mark"
  out="$(TS_HANG_MARK="$mark" "$runner" "$1" "$hang" "$2" 2>&1)"
  rc=$?
  local end took
  end="$(date +%s)"
  took=$((end - $(stat -c %Y "$mark" 2>/dev/null || echo 0)))
  echo "--- mpi_hang $2 on $1 ranks: exit $rc, $took s after the stop"
  echo "$out" | grep -v '^ *$' | head -20
  check_eq "$2: exit status 4 (the watchdog's)" 4 "$rc"
  ((took <= 12)) || {
    echo "FAIL $2: ended $took s after the stop, more than the 2 s timeout + 10 s"
    fails=$((fails + 1))
  }
}

# some_lines CASE LINE RANKS... — LINE with @R@ for the rank: the job printed
# it for at least one of RANKS, and each "tessera: comm timeout" line it
# printed is LINE for one of them.
some_lines() {
  local c="$1" want="$2" r w got hit n=0
  shift 2
  while IFS= read -r got; do
    hit=0
    for r in "$@"; do
      w="${want//@R@/$r}"
      [[ "$got" == "$w" ]] && hit=1
    done
    if ((hit)); then n=$((n + 1)); else
      echo "FAIL $c: a line of no waiting rank: [$got]"
      fails=$((fails + 1))
    fi
  done < <(grep '^tessera: comm timeout' <<<"$out")
  check_eq "$c: at least one waiting rank's line" 1 "$((n >= 1))"
}

run 3 all-reduce
some_lines all-reduce "tessera: comm timeout on rank @R@ of 3 (host $host): all-reduce on group \"world\" waited 2 s (--comm-timeout 2) at step 7, unit 3, micro-batch 1: ranks that did not arrive: 2 (host $host); stopping the job (exit code 4)" 0 1
absent "all-reduce: no rank returned" "returned: " "$out"

run 2 thread
check "thread: rank 0's line" "tessera: comm timeout on rank 0 of 2 (host $host): all-gather on group \"world\" waited 2 s (--comm-timeout 2) at step 7, unit 3, micro-batch 1: ranks that did not arrive: 1 (host $host); stopping" "$out"
absent "thread: no rank returned" "returned: " "$out"

run 2 recv
check "recv: rank 0's line" "tessera: comm timeout on rank 0 of 2 (host $host): recv on group \"world\" waited 2 s (--comm-timeout 2) at step 4, pipeline stage 0: peer rank 1 (host $host) did not answer; stopping the job (exit code 4)" "$out"
absent "recv: rank 0 did not return" "returned: " "$out"

# (2 ranks: with two waiting, the one that times out second may still be
# connecting to mpirun's PMIx server when mpirun aborts the job, and mpirun
# then hung until the 30 s limit: "PMIX ERROR: UNREACHABLE", once under load)
run 2 init
some_lines init "tessera: comm timeout on rank @R@ (host $host): MPI_Init_thread waited 2 s (--comm-timeout 2) during start-up: ranks that did not arrive: not known inside MPI; stopping the job (exit code 4)" 0

if ((fails)); then
  echo "$fails check(s) failed"
  exit 1
fi
echo "PASS"
