# testing.sh — assertions shared by the shell tests of tools/ (sourced; each
# test sets fails=0 first and exits 1 when fails > 0 at the end). Exit codes
# and counts go through check_eq, never check: a substring match would let
# a crash's 139 pass a check for 1, or 12 lines pass a check for 1.

check() { # check NAME EXPECTED-SUBSTRING ACTUAL
  if [[ "$3" != *"$2"* ]]; then
    echo "FAIL $1: expected to contain [$2], got [$3]"
    fails=$((fails + 1))
  else
    echo "ok   $1"
  fi
}

check_eq() { # check_eq NAME EXPECTED ACTUAL — the whole of ACTUAL equals EXPECTED
  if [[ "$3" != "$2" ]]; then
    echo "FAIL $1: expected [$2], got [$3]"
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

lines() { # lines TEXT — how many lines TEXT has ("" has none)
  if [[ -z "$1" ]]; then echo 0; else printf '%s\n' "$1" | wc -l; fi
}
