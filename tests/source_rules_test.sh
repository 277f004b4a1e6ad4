#!/usr/bin/env bash
# The library's source rules (tests/source_rules.py) over every C and C++
# file of base/, comm/, kernels/, shard/, models/ and engine/ (tests
# excluded): first the rules' own self-test on planted violations, then the
# files. Exit 1 when either fails.
set -uo pipefail
rules="$1"
shift
python3 "$rules" selftest || exit 1
files=()
for f in "$@"; do [[ "$f" == *_test.cc ]] || files+=("$f"); done
python3 "$rules" terms "${files[@]}"
