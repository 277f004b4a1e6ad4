#!/usr/bin/env bash
# fuzz.sh — runs every libFuzzer target of //fuzz (the parsers of untrusted
# input: safetensors, config.json, index.json, trainer.json, meta.json,
# token files) for SECONDS each, with AddressSanitizer and
# UndefinedBehaviorSanitizer, from its seeds (fuzz/seeds/NAME) and the
# corpus it grew before, two targets at a time ($TESSERA_FUZZ_JOBS).
#   tools/fuzz.sh SECONDS [NAME...]
#   tools/fuzz.sh --build [--BAZEL_FLAG...] [NAME...]
#                                       only build the targets (tools/test_suite.sh does
#                                       this early, beside the other passes, --jobs=1)
# Builds with clang (Debian's clang and libclang-rt-dev, tools/setup.sh)
# under --config=fuzz in an output base of its own
# ($TESSERA_FUZZ_BASE, default ~/.cache/tessera-fuzz), so the gcc build's
# cache and bazel-* links are left alone. The corpus and any crashing input
# go to $TESSERA_FUZZ_DIR (default $TMPDIR/tessera-fuzz): NAME/ and
# NAME-crash-*. Prints one line per target, in the order given ("NAME: R
# runs in S s, C crashes, corpus N") and exits 1 if any target crashed, 2 on
# bad usage or a failed build.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
all=(safetensors config checkpoint_index trainer_state meta token_file)
die() {
  echo "tools/fuzz.sh: $*" >&2
  exit 2
}
(($# >= 1)) || die "usage: tools/fuzz.sh SECONDS|--build [NAME...] (NAME: ${all[*]})"
secs="$1"
shift
[[ "$secs" == --build || "$secs" =~ ^[1-9][0-9]*$ ]] ||
  die "SECONDS $secs: expected a whole number of seconds >= 1, or --build"
parallel="${TESSERA_FUZZ_JOBS:-2}"
[[ "$parallel" =~ ^[1-9][0-9]*$ ]] || die "TESSERA_FUZZ_JOBS=$parallel: expected a whole number >= 1"
build_flags=()
while [[ "$secs" == --build && "${1:-}" == --* ]]; do
  build_flags+=("$1")
  shift
done
names=("$@")
((${#names[@]})) || names=("${all[@]}")
for n in "${names[@]}"; do
  [[ " ${all[*]} " == *" $n "* ]] || die "$n: expected one of ${all[*]}"
done
command -v clang >/dev/null || die "clang: not found; run tools/setup.sh"

base="${TESSERA_FUZZ_BASE:-$HOME/.cache/tessera-fuzz}"
work="${TESSERA_FUZZ_DIR:-${TMPDIR:-/tmp}/tessera-fuzz}"
bazel_fuzz() { (cd "$root" && CC=clang bazel --output_base="$base" "$@"); }
targets=()
for n in "${names[@]}"; do targets+=("//fuzz:${n}_fuzzer"); done
mkdir -p "$work" || die "cannot create $work"
bazel_fuzz build --config=fuzz --symlink_prefix=/ --ui_event_filters=-info,-progress \
  --noshow_progress --show_result=0 ${build_flags[@]+"${build_flags[@]}"} "${targets[@]}" ||
  die "the clang build of the fuzz targets failed"
[[ "$secs" == --build ]] && exit 0
bin="$(bazel_fuzz info --config=fuzz bazel-bin 2>/dev/null)"

# run NAME — fuzzes NAME for $secs s; its line (and, after a crash, what
# it found) to $work/NAME.out, 1 to $work/NAME.crashed after a crash.
run() {
  local n="$1" log="$work/$1.log" start=$SECONDS rc runs crashes
  mkdir -p "$work/$n"
  # -rss_limit_mb: a parser that allocates 2 GiB for a small input is a finding too
  "$bin/fuzz/${n}_fuzzer" -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/$n-crash-" "$work/$n" "$root/fuzz/seeds/$n" >"$log" 2>&1
  rc=$?
  runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)"
  crashes=$((rc == 0 ? 0 : 1)) # libFuzzer stops at its first crash
  {
    printf '%s: %s runs in %d s, %d crashes, corpus %d\n' "$n" "${runs:-0}" $((SECONDS - start)) \
      "$crashes" "$(ls "$work/$n" | wc -l)"
    if ((crashes)); then
      grep -m 3 -E 'ERROR|SUMMARY|runtime error' "$log" | sed 's/^/  /'
      echo "  log: $log; input: $(ls "$work/$n"-crash-* 2>/dev/null | head -n 1)"
    fi
  } >"$work/$n.out"
  ((crashes)) && echo 1 >"$work/$n.crashed"
  return 0
}

pids=()
for n in "${names[@]}"; do
  rm -f "$work/$n.out" "$work/$n.crashed"
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n; done
  run "$n" &
  pids+=($!)
done
wait "${pids[@]}"
crashed=0
for n in "${names[@]}"; do
  cat "$work/$n.out" 2>/dev/null || echo "$n: did not run"
  [[ -e "$work/$n.crashed" ]] && crashed=1
done
exit "$crashed"
