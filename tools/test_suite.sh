#!/usr/bin/env bash
# test_suite.sh — the whole test suite, as `./tessera test` runs it, with
# each target's time beside its limit:
#   1. plain:  bazel test //...
#   2. asan:   bazel test --config=asan --build_tests_only --test_lang_filters=cc //...
#              (the C and C++ unit tests again under AddressSanitizer and
#              UndefinedBehaviorSanitizer, .bazelrc), then the same for the
#              tests tagged "asan": every multi-rank test binary on 2 ranks
#              (comm/mpi_test.bzl)
#   3. fuzz:   tools/fuzz.sh 7 (every libFuzzer target 7 s from its seeds)
# Every pass runs even when an earlier one failed, so one run shows every
# failure; the exit status is the first failing pass's (Bazel's 3 when a
# test failed, fuzz.sh's 1 when a target crashed).
#
#   tools/test_suite.sh [--isa avx2|avx512|native] [--load N] [--times FILE] [BAZEL ARGS...]
#
# At the end it prints each pass's wall time, the slowest GoogleTest cases,
# and every test target sorted by its time: seconds, its limit (the Bazel
# timeout of its size in that pass, .bazelrc's --test_timeout), the
# headroom (limit / time) and "<3x" where that is under 3, the margin each
# test must keep on the slowest machine the project meets (an AVX2-only
# 2-core EPYC with a second CPU-bound process running).
#   --isa avx2|avx512  caps the instruction set the tests' libraries use
#                      (oneDNN's ONEDNN_MAX_CPU_ISA, OpenBLAS's
#                      OPENBLAS_CORETYPE): an AVX-512 machine then runs the
#                      products as an AVX2-only one does (tessera's own
#                      code is built without -march, so it is the same
#                      either way). native (default): no cap.
#   --load N           N CPU-bound processes (busy loops) run beside the
#                      suite from start to end: a shared machine.
#   --times FILE       also writes the table as Markdown to FILE.
# BAZEL ARGS go to both Bazel passes (e.g. --nocache_test_results).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

die() {
  echo "tools/test_suite.sh: $*" >&2
  exit 2
}

isa=native load=0 times=""
while (($#)); do
  case "$1" in
    --isa)
      [[ "${2:-}" =~ ^(avx2|avx512|native)$ ]] || die "--isa ${2:-}: expected avx2, avx512 or native"
      isa="$2"
      shift 2
      ;;
    --load)
      [[ "${2:-}" =~ ^[0-9]+$ ]] || die "--load ${2:-}: expected a number of busy processes"
      load="$2"
      shift 2
      ;;
    --times)
      [[ -n "${2:-}" ]] || die "--times: expected a file"
      times="$2"
      [[ "$times" == /* ]] || times="$PWD/$times" # the caller's folder, not the repository
      shift 2
      ;;
    *) break ;;
  esac
done
cd "$root"

env_args=()
case "$isa" in
  avx2) env_args=(--test_env=ONEDNN_MAX_CPU_ISA=AVX2 --test_env=DNNL_MAX_CPU_ISA=AVX2
    --test_env=OPENBLAS_CORETYPE=Haswell) ;;
  avx512) env_args=(--test_env=ONEDNN_MAX_CPU_ISA=AVX512_CORE --test_env=DNNL_MAX_CPU_ISA=AVX512_CORE
    --test_env=OPENBLAS_CORETYPE=SkylakeX) ;;
esac

work="$(mktemp -d "${TMPDIR:-/tmp}/tessera-suite.XXXXXX")" || die "cannot create a folder under ${TMPDIR:-/tmp}"
bg_pids=()
cleanup() {
  for p in ${bg_pids[@]+"${bg_pids[@]}"}; do kill -- "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
for ((i = 0; i < load; i++)); do
  (while :; do :; done) &
  bg_pids+=($!)
done

# Each test's size and explicit timeout, for its limit (before any pass:
# a query does not disturb the build). Limits are .bazelrc's --test_timeout
# for that size, not one given in BAZEL ARGS.
bazel query --output=xml 'tests(//...)' >"$work/tests.xml" 2>"$work/query.log" ||
  echo "tools/test_suite.sh: bazel query failed, the table's limits are unknown: $(tail -n 1 "$work/query.log")" >&2

first_rc=0
note_rc() { ((first_rc == 0 && $1 != 0)) && first_rc=$1; return 0; }

# run_pass NAME CMD... — runs CMD with its output on the console and in
# $work/NAME.log, its wall time in $work/NAME.secs, and (Bazel passes) the
# GoogleTest XML of every test it ran copied under $work/NAME.xml/.
run_pass() {
  local name="$1" start=$SECONDS rc
  shift
  touch "$work/$name.start"
  "$@" 2>&1 | tee "$work/$name.log"
  rc=${PIPESTATUS[0]}
  echo $((SECONDS - start)) >"$work/$name.secs"
  note_rc "$rc"
  if [[ ("$1" == bazel || "$1" == asan_pass) && -d bazel-testlogs/ ]]; then
    mkdir -p "$work/$name.xml"
    (cd -P bazel-testlogs && find . -name test.xml -newer "$work/$name.start" \
      -exec cp --parents {} "$work/$name.xml" \;)
  fi
  return 0
}

# The fuzz targets' clang build (an output base and Bazel server of its
# own) runs from the start beside the other passes, at a lower priority: it
# takes the CPU the plain pass leaves idle while its tests wait (for
# timeouts, daemons, other ranks), instead of adding its minutes at the end.
# One compile at a time (--jobs=1) beside the plain pass's two. Its own
# process group (setsid), so that an interrupted suite stops all of it.
setsid bash -c 'start=$SECONDS
  nice -n 10 tools/fuzz.sh --build --jobs=1 >"$1/fuzz-build.log" 2>&1
  rc=$?
  echo $((SECONDS - start)) >"$1/fuzz-build.secs"
  exit "$rc"' fuzz-build "$work" &
fuzz_build=$!
bg_pids+=("-$fuzz_build")

run_pass plain bazel test --profile="$work/plain.prof" ${env_args[@]+"${env_args[@]}"} "$@" //...
# The sanitizer pass: the unit tests (cc_test), then the 2-rank run of
# every multi-rank test (sh_tests tagged "asan", under mpirun); both
# invocations run, the status is the first failing one's.
asan_pass() {
  local rc=0
  bazel test --config=asan --build_tests_only --test_lang_filters=cc \
    --profile="$work/asan.prof" "$@" //... || rc=$?
  bazel test --config=asan --build_tests_only --test_tag_filters=asan,-gpu \
    --profile="$work/asan-mpi.prof" "$@" //... || { local r=$?; ((rc)) || rc=$r; }
  return "$rc"
}
run_pass asan asan_pass ${env_args[@]+"${env_args[@]}"} "$@"
wait "$fuzz_build" || cat "$work/fuzz-build.log" >&2 # (fuzz.sh below builds again and fails alike)
unset 'bg_pids[${#bg_pids[@]}-1]'                   # (ended: its group id is not ours to kill)
run_pass fuzz tools/fuzz.sh 7

python3 - "$work" "$root/.bazelrc" "$isa" "$load" "$times" <<'PY'
import glob, json, os, re, sys, xml.etree.ElementTree as ET
work, bazelrc, isa, load, times = sys.argv[1:6]

# Bazel's --test_timeout per size, plain (build) and ASan (build:asan)
limits = {"plain": None, "asan": None}
for line in open(bazelrc):
    m = re.match(r"build(:asan)?\s+--test_timeout=([0-9,]+)", line.strip())
    if m:
        limits["asan" if m.group(1) else "plain"] = [int(x) for x in m.group(2).split(",")]
limits["asan"] = limits["asan"] or limits["plain"]
sizes = ["small", "medium", "large", "enormous"]
timeouts = {"short": 0, "moderate": 1, "long": 2, "eternal": 3}
tests = {}
try:
    for rule in ET.parse(os.path.join(work, "tests.xml")).getroot().iter("rule"):
        attrs = {a.get("name"): a.get("value") for a in rule if a.get("value") is not None}
        size = attrs.get("size", "medium")
        tests[rule.get("name")] = (timeouts[attrs["timeout"]] if "timeout" in attrs
                                   else sizes.index(size) if size in sizes else 1)
except (ET.ParseError, OSError):
    pass  # (the query failed: said above; every limit shows as unknown)

row = re.compile(r"^(//\S+)\s+(?:\(cached\) )?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)"
                 r"(?: in ([0-9.]+)s)?")
elapsed = re.compile(r"Elapsed time: ([0-9.]+)s, Critical Path: ([0-9.]+)s")
fuzz_row = re.compile(r"^(\w+): \d+ runs in (\d+) s, (\d+) crashes")
rows, passes = [], []
for name in ("plain", "asan", "fuzz"):
    log = os.path.join(work, name + ".log")
    if not os.path.exists(log):
        continue
    secs = open(os.path.join(work, name + ".secs")).read().strip()
    crit = ""
    for line in open(log, errors="replace"):
        m = row.match(line)
        if m and name != "fuzz":
            level = tests.get(m.group(1))
            limit = limits[name][level] if limits[name] and level is not None else None
            rows.append((float(m.group(3) or 0), limit, name, m.group(1), m.group(2)))
        m = elapsed.search(line)
        if m:
            crit = " (Bazel: %s s, critical path %s s)" % (m.group(1), m.group(2))
        m = fuzz_row.match(line)
        if m and name == "fuzz":
            rows.append((float(m.group(2)), None, name, m.group(1) + "_fuzzer",
                         "CRASHED" if m.group(3) != "0" else "PASSED"))
    passes.append("%s %s s%s" % (name, secs, crit))
    if name == "plain" and os.path.exists(os.path.join(work, "fuzz-build.secs")):
        passes.append("fuzz build %s s (beside plain and asan)" %
                      open(os.path.join(work, "fuzz-build.secs")).read().strip())

# Where each Bazel pass's time went: seconds of actions by kind, from its
# --profile (actions overlap, two or more at a time; on a loaded machine a
# second counts what the action waited for a core too).
def work_by_kind(prof):
    try:
        data = json.load(open(prof))
    except (OSError, ValueError):
        return None
    events = data["traceEvents"] if isinstance(data, dict) else data
    kinds = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "action processing":
            continue
        n = e.get("name") or ""
        k = ("test" if n.startswith("Testing") else "link" if n.startswith("Linking")
             else "compile (CUDA)" if "CUDA" in n or "attention_cudnn" in n
             else "compile (tests)" if n.startswith("Compiling") and "_test" in n
             else "compile" if n.startswith("Compiling") else "other")
        kinds[k] = kinds.get(k, 0.0) + e.get("dur", 0) / 1e6
    return kinds
work_lines = []
for name in ("plain", "asan"):
    kinds = {}
    for prof in (name, name + "-mpi"):  # asan: its two invocations
        for k, v in (work_by_kind(os.path.join(work, prof + ".prof")) or {}).items():
            kinds[k] = kinds.get(k, 0.0) + v
    if kinds:
        work_lines.append("%s: %s" % (name, ", ".join(
            "%s %.0f s" % (k, v) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))))

cases = []
for name in ("plain", "asan"):
    for f in glob.glob(os.path.join(work, name + ".xml", "**", "test.xml"), recursive=True):
        target = "//" + os.path.dirname(os.path.relpath(f, os.path.join(work, name + ".xml")))
        target = target.replace("//./", "//")
        target = target[: target.rfind("/")] + ":" + target[target.rfind("/") + 1:]
        try:
            for c in ET.parse(f).getroot().iter("testcase"):
                if c.get("classname"):
                    cases.append((float(c.get("time") or 0), name, target,
                                  c.get("classname") + "." + c.get("name")))
        except ET.ParseError:
            pass
cases.sort(reverse=True)
rows.sort(key=lambda r: -r[0])

def head(r):
    t, limit, name, target, status = r
    room = "%.1fx" % (limit / t) if limit and t > 0 else ("-" if not limit else "inf")
    flag = "<3x" if limit and t > 0 and limit / t < 3 else ""
    return "%7.1f  %6s  %7s %-3s  %-5s  %s%s" % (t, limit or "-", room, flag, name, target,
                                                   "" if status == "PASSED" else "  " + status)

print("\n== the test suite (isa %s, %s busy process%s beside it) ==" %
      (isa, load, "" if load == "1" else "es"))
print("passes: " + "; ".join(passes))
for line in work_lines:
    print("  actions, " + line)
print("slowest GoogleTest cases:")
for t, name, target, case in cases[:10]:
    print("%7.1f  %-5s  %s  %s" % (t, name, target, case))
print("targets, slowest first (seconds, limit, headroom, pass, target):")
for r in rows:
    print(head(r))
under = [r for r in rows if r[1] and r[0] > 0 and r[1] / r[0] < 3]
print("%d targets, %d with less than 3x headroom" % (len(rows), len(under)))

if times:
    with open(times, "w") as f:
        f.write("isa %s, %s busy process(es) beside the suite; %s\n\n" % (isa, load, "; ".join(passes)))
        for line in work_lines:
            f.write("- actions, %s\n" % line)
        f.write("\n")
        f.write("| s | limit s | headroom | pass | target |\n| ---: | ---: | ---: | --- | --- |\n")
        for t, limit, name, target, status in rows:
            room = "%.1f×" % (limit / t) if limit and t > 0 else "–"
            f.write("| %.1f | %s | %s | %s | `%s`%s |\n" % (t, limit or "–", room, name, target,
                                                            "" if status == "PASSED" else " " + status))
        f.write("\nslowest cases:\n\n")
        for t, name, target, case in cases[:10]:
            f.write("- %.1f s %s `%s` %s\n" % (t, name, target, case))
PY
exit "$first_rc"
