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

own_cluster() { # own_cluster PREFIX — exports TS_CLUSTER (tools/cluster.sh): PREFIX and a
  # number no namespace here has yet, since `cluster.sh up` replaces a cluster of the same
  # name (another test's). Clusters are separate namespaces: their subnets may repeat.
  for _ in $(seq 20); do
    export TS_CLUSTER="$1$(((RANDOM + $$) % 10000))"
    ip netns list 2>/dev/null | awk '{print $1}' | grep -q "^$TS_CLUSTER-" || return 0
  done
}
