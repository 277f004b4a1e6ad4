# testing.sh — assertions shared by the shell tests of tools/ (sourced; each
# test sets fails=0 first and exits 1 when fails > 0 at the end).

check() { # check NAME EXPECTED-SUBSTRING ACTUAL
  if [[ "$3" != *"$2"* ]]; then
    echo "FAIL $1: expected to contain [$2], got [$3]"
    fails=$((fails + 1))
  else
    echo "ok   $1"
  fi
}

absent() { # absent NAME UNEXPECTED-SUBSTRING ACTUAL
  if [[ "$3" == *"$2"* ]]; then
    echo "FAIL $1: did not expect [$2] in [$3]"
    fails=$((fails + 1))
  else
    echo "ok   $1"
  fi
}
