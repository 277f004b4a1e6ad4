#!/usr/bin/env bash
# The library's source rules (tests/source_rules.py) over every C and C++
# file of base/, comm/, kernels/, shard/, models/ and engine/ (tests
# excluded): first the rules' own self-test on planted violations, then
# `terms` over all of them, `plan` over engine/'s and `heap` over comm/'s
# library. Exit 1 when any fails.
set -uo pipefail
rules="$1"
shift
python3 "$rules" selftest || exit 1
files=() engine=() comm=()
for f in "$@"; do
  [[ "$f" == *_test.cc ]] && continue
  files+=("$f")
  [[ "$f" == engine/* || "$f" == */engine/* ]] && engine+=("$f")
  # comm's library (its test programs mpi_fault.c and mpi_hang.c aside)
  [[ ("$f" == comm/*.c || "$f" == */comm/*.c) && "$f" != *mpi_fault.c && "$f" != *mpi_hang.c ]] &&
    comm+=("$f")
done
python3 "$rules" terms "${files[@]}" || exit 1
((${#engine[@]} > 10)) || { echo "expected engine/'s files among the arguments"; exit 1; }
python3 "$rules" plan "${engine[@]}" || exit 1
((${#comm[@]} > 5)) || { echo "expected comm/'s files among the arguments"; exit 1; }
python3 "$rules" heap "${comm[@]}"
