# testing.sh — assertions and fixtures shared by the shell tests of tools/ (sourced; each
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

exact() { # exact NAME CODE EXPECTED-OUTPUT CMD... — the whole output and the exit code
  local name="$1" code="$2" want="$3"
  shift 3
  local o
  o="$("$@" 2>&1)"
  check_eq "$name: exit" "$code" $?
  check_eq "$name: the line" "$want" "$o"
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

presets_home() { # TESSERA_HOME where models/configs is: Bazel's runfiles tree, else here
  export TESSERA_HOME="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tessera}"
  [[ -d "$TESSERA_HOME/models/configs" ]] || export TESSERA_HOME="$(pwd)"
}

shas() { # shas CKPT — the rank files' SHA-256 in checkpoint folder CKPT's index.json, a line each
  grep -A2 '"rank-' "$1/index.json" | grep sha256 | tr -d ' \t'
}

steps() { # steps LOG — a train log's step lines, without evaluations and timings
  grep '^step ' <<<"$1" | grep -v val | sed 's/ | [0-9]* tok\/s.*//'
}

rank_pids() { # rank_pids BIN SAVE_DIR — the processes whose command line is exactly BIN train
  # … --save SAVE_DIR … (a job's ranks), one pid a line; fixed strings, no pattern
  local p args
  for p in /proc/[0-9]*; do
    mapfile -d '' -t args <"$p/cmdline" 2>/dev/null || continue
    ((${#args[@]} >= 2)) && [[ "${args[0]}" == "$1" && "${args[1]}" == train ]] || continue
    local i
    for ((i = 2; i + 1 < ${#args[@]}; i++)); do
      [[ "${args[i]}" == --save && "${args[i + 1]}" == "$2" ]] && echo "${p#/proc/}" && break
    done
  done
}

alive() { # alive PID... — how many of the PIDs still run (a zombie has ended)
  local p n=0 state
  for p in "$@"; do
    state="$(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null)"
    [[ -n "$state" && "$state" != Z ]] && n=$((n + 1))
  done
  echo "$n"
}

mpi_scratch() { # a private MPI scratch folder, removed at exit (see comm/mpirun_test.sh:
  # concurrent tests may share PIDs, hence Open MPI session names, in /tmp); one thread per rank
  scratch="$(mktemp -d /tmp/tstest.XXXXXX)"
  trap 'rm -rf "$scratch"' EXIT
  export TMPDIR="$scratch" OMPI_MCA_orte_tmpdir_base="$scratch"
  export OMPI_MCA_btl_vader_backing_directory="$scratch" OMP_NUM_THREADS=1
}

make_token_shards() { # make_token_shards DIR — train.bin (40000) and val.bin (4000) in
  # llm.c's layout (engine/token_file.h): random ids below 4096, seeded
  python3 - "$1" <<'PY'
import os, random, struct, sys
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
rng = random.Random(5)
for name, n in (("train.bin", 40000), ("val.bin", 4000)):
    header = [20240520, 1, n] + [0] * 253
    with open(os.path.join(d, name), "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{n}H", *(rng.randrange(4096) for _ in range(n))))
PY
}

make_mlm_corpus() { # make_mlm_corpus FILE — 120 paragraphs of seeded words (vocabulary ~40
  # words) under "Chapter N" headings, for prepare --mlm
  python3 - "$1" <<'PY'
import random, sys
rng = random.Random(3)
words = "the lord said unto moses and aaron go forth into land of egypt people house israel".split()
words += "day night light darkness water earth heaven god man woman son daughter king".split()
with open(sys.argv[1], "w") as f:
    for p in range(120):
        f.write(f"Chapter {p}\n")
        for _ in range(4):
            f.write(" ".join(rng.choice(words) for _ in range(rng.randrange(6, 16))) + ".\n")
        f.write("\n")
PY
}

abs() { # abs PATH — PATH made absolute (symlinks not resolved)
  echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
}

own_cluster() { # own_cluster PREFIX — exports TS_CLUSTER (tools/cluster.sh): PREFIX and a
  # number no namespace here has yet, since `cluster.sh up` replaces a cluster of the same
  # name (another test's). Clusters are separate namespaces: their subnets may repeat.
  for _ in $(seq 20); do
    export TS_CLUSTER="$1$(((RANDOM + $$) % 10000))"
    ip netns list 2>/dev/null | awk '{print $1}' | grep -q "^$TS_CLUSTER-" || return 0
  done
}

cluster_fixture() { # cluster_fixture TEST PREFIX NET — the cluster tests' setup: where network
  # namespaces cannot be made, one line "SKIP: TEST: why" and exit 0; else a cluster of 2 nodes
  # ($n1, $n2; tools/cluster.sh at $cluster) named PREFIX and a number, on 198.18.NET.0/24, the
  # test's folder $tmp, presets_home and mpi_scratch; on exit $cluster_on_exit runs (if set),
  # then the cluster goes down and the files go (kept, and named, after a failure)
  own_cluster "$2"
  export TS_CLUSTER_NET="$3"
  n1="$TS_CLUSTER-n1" n2="$TS_CLUSTER-n2"
  local why
  if ! why="$("$cluster" check 2>&1)"; then
    echo "SKIP: $1: $(tr '\n' ' ' <<<"$why" | sed 's/ *$//')"
    exit 0
  fi
  own_tmp=""
  [[ -n "${TEST_TMPDIR:-}" ]] || own_tmp="$(mktemp -d)"
  tmp="${TEST_TMPDIR:-$own_tmp}"
  presets_home
  mpi_scratch # its trap is replaced by cluster_cleanup's, which does its part too
  trap cluster_cleanup EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
  local up
  up="$("$cluster" up 2 2>&1)"
  check_eq "cluster up" "cluster $TS_CLUSTER: 2 nodes ($n1 $n2) on 198.18.$TS_CLUSTER_NET.0/24" "$up"
}

cluster_cleanup() { # cluster_fixture's exit trap
  [[ -z "${cluster_on_exit:-}" ]] || "$cluster_on_exit" >/dev/null 2>&1
  "$cluster" down >/dev/null 2>&1
  rm -rf "$scratch"
  if [[ -n "$own_tmp" ]]; then
    if ((fails == 0)); then rm -rf "$own_tmp"; else echo "(the runs' files: $own_tmp)"; fi
  fi
}

where_wrapper() { # where_wrapper BIN RANK_VAR — $tmp/where.sh: every rank writes "RANK hostname
  # netns" to $tmp/hosts/rank-RANK (RANK from the variable RANK_VAR: OMPI_COMM_WORLD_RANK,
  # SLURM_PROCID), then becomes BIN; where_want: ranks 0-1 on $n1, 2-3 on $n2
  cat >"$tmp/where.sh" <<EOF
#!/bin/sh
echo "\$$2 \$(hostname) \$(ip netns identify \$\$)" >$(printf %q "$tmp")/hosts/rank-\$$2
exec $(printf %q "$1") "\$@"
EOF
  chmod +x "$tmp/where.sh"
  where_want="$(printf '0 %s %s\n1 %s %s\n2 %s %s\n3 %s %s' "$n1" "$n1" "$n1" "$n1" "$n2" "$n2" "$n2" "$n2")"
}

same_checkpoint() { # same_checkpoint NAME WANT GOT — checkpoint folder GOT's rank files are
  # byte-identical to WANT's (their SHA-256 in index.json; WANT must have some)
  [[ -n "$(shas "$2")" ]] || {
    echo "FAIL $1: no checksums in $2"
    fails=$((fails + 1))
  }
  check_eq "$1" "$(shas "$2")" "$(shas "$3")"
}
