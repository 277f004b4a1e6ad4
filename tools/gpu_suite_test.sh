#!/usr/bin/env bash
# The GPU suite's runner (tools/gpu_suite.sh, the bundle's run.sh) on fake
# test binaries that print what gtest prints: one passes, one fails a test,
# one crashes, one hangs past its limit, one is never reached because the
# budget is spent. Checks the printed verdicts, the last line, the exit
# status and the log folder, exactly.
set -uo pipefail
SUITE="$1"
source "$(dirname "$0")/testing.sh"
fails=0
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
B="$T/bundle"
mkdir -p "$B"
cp "$SUITE" "$B/run.sh"
chmod +x "$B/run.sh"
fake() { # fake NAME BODY: a gtest-like binary
  printf '#!/usr/bin/env bash\necho "Running main() from gtest_main.cc"\n%s\n' "$2" >"$B/$1"
  chmod +x "$B/$1"
}
fake pass_test 'echo "[==========] 3 tests from 1 test suite ran. (5 ms total)"; echo "[  PASSED  ] 3 tests."'
fake fail_test 'echo "x.cc:12: Failure"; echo "Expected equality"; echo "[  FAILED  ] Suite.Broken (3 ms)"
echo "[  PASSED  ] 1 test."; echo "[  FAILED  ] 1 test, listed below:"; echo "[  FAILED  ] Suite.Broken"; exit 1'
fake crash_test 'echo "[ RUN      ] Suite.Crash"; kill -SEGV $$'
fake hang_test 'echo "[ RUN      ] Suite.Hang"; exec sleep 100'
fake late_test 'echo "[  PASSED  ] 1 test."'
printf '# name seconds\npass_test 30\nfail_test 30\ncrash_test 30\nhang_test 2\nlate_test 60\n' >"$B/tests.txt"

t0=$SECONDS
out="$(BUDGET=26 "$B/run.sh" "$T/logs" 2>&1)"
rc=$?
took=$((SECONDS - t0))
echo "$out"
check_eq "exit status" 1 "$rc"
check_eq "last line" "1 passed, 4 failed" "$(tail -n 1 <<<"$out")"

# A third column N > 1 runs the binary under the bundle's ./mpirun with N
# ranks (here a fake mpirun that says how it was called, then runs it).
B2="$T/ranks"
mkdir -p "$B2"
cp "$SUITE" "$B2/run.sh"
printf '#!/usr/bin/env bash
echo "mpirun $1 $2"
shift 2
exec "$@"
' >"$B2/mpirun"
printf '#!/usr/bin/env bash
echo "[  PASSED  ] 1 test."
' >"$B2/ranks_test"
chmod +x "$B2/run.sh" "$B2/mpirun" "$B2/ranks_test"
printf 'ranks_test 30 2
' >"$B2/tests.txt"
out2="$("$B2/run.sh" "$T/logs2" 2>&1)"
check_eq "ranks: exit status" 0 "$?"
check_eq "ranks: run under mpirun -n 2" "mpirun -n 2" "$(head -n 1 "$T/logs2/ranks_test.log")"
check_eq "ranks: last line" "1 passed, 0 failed" "$(tail -n 1 <<<"$out2")"
printf 'ranks_test 30 0
' >"$B2/tests.txt"
check "ranks: 0 refused" "ranks '0' is not a positive number" "$("$B2/run.sh" "$T/logs3" 2>&1)"
check_eq "the hang killed at its limit (under 15 s in all)" 1 "$((took < 15))"
check_eq "pass verdict" 1 "$(grep -c '^-- pass_test: passed' <<<"$out")"
check_eq "fail summary" 1 "$(grep -c '^FAILED fail_test (exit 1, [0-9]* s): Suite.Broken $' <<<"$out")"
check_eq "crash summary" 1 "$(grep -c '^FAILED crash_test (killed by signal 11, ' <<<"$out")"
check_eq "hang summary" 1 "$(grep -c '^TIMED OUT hang_test after 2 s' <<<"$out")"
check_eq "budget summary" 1 "$(grep -c '^NOT RUN late_test: the 26 s budget is spent' <<<"$out")"
check_eq "the failure's message shown" 1 "$(grep -c '^Expected equality' <<<"$out")"
check_eq "gtest's banner dropped" 0 "$(grep -c '^Running main' <<<"$out")"
check_eq "the stack printed first" "== the GPU stack" "$(sed -n 1p <<<"$out")"
for f in gpu_info.txt summary.txt pass_test.log fail_test.log crash_test.log hang_test.log; do
  check_eq "log $f" yes "$([[ -s "$T/logs/$f" ]] && echo yes)"
done
check_eq "summary file" "1 passed, 4 failed" "$(tail -n 1 "$T/logs/summary.txt")"

# One named binary that passes: exit 0.
out="$("$B/run.sh" "$T/logs2" pass_test 2>&1)"
check_eq "one passing: status" 0 "$?"
check_eq "one passing: last line" "1 passed, 0 failed" "$(tail -n 1 <<<"$out")"
# Usage errors: exit 2 with one line.
out="$("$B/run.sh" 2>&1)"
check_eq "no log folder: status" 2 "$?"
out="$("$B/run.sh" "$T/logs3" nosuch_test 2>&1)"
check_eq "unknown name: status" 2 "$?"
check_eq "unknown name: message" \
  "run.sh: nosuch_test is not in tests.txt (pass_test fail_test crash_test hang_test late_test)" "$out"
echo "$fails failed"
exit $((fails > 0))
