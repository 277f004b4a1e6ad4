#!/bin/bash
# mpirun_test.sh NP BINARY [ARGS...] — runs BINARY on NP MPI ranks of this
# machine and exits with mpirun's status: the runner of ts_mpi_test
# (comm/mpi_test.bzl), usable by hand as well.
#
#   mpirun -n NP --oversubscribe --bind-to none [--allow-run-as-root] BINARY ARGS
#
# - --oversubscribe / --bind-to none: CI has 2 cores and runs 4 ranks.
# - --allow-run-as-root only when running as root (CI containers).
# - OMP_NUM_THREADS=1 unless already set, so oversubscribed ranks do not also
#   start an OpenMP thread per core each.
# - Under `timeout`, so a hang (a rank waiting in a collective its peer never
#   entered) fails with a message instead of eating the CI budget. The limit
#   is TS_MPIRUN_TIMEOUT seconds if set, else 240 s, lowered to Bazel's test
#   timeout (TEST_TIMEOUT) minus 10 s so that this message comes first.
# - A private scratch directory per run (see below).
# - BINARY may be absolute or relative to the working directory (under
#   `bazel test` that is the workspace's runfiles directory, which is where
#   $(rootpath ...) points); else it is looked up in the runfiles tree.
set -u

die() {
  echo "mpirun_test.sh: $*" >&2
  exit 2
}

[ $# -ge 2 ] || die "usage: mpirun_test.sh NP BINARY [ARGS...]"
np=$1
bin=$2
shift 2
case "$np" in
  '' | *[!0-9]* | 0) die "NP '$np' is not a positive integer" ;;
esac

# Run as plain `mpirun`, found on PATH: given an absolute path, Open MPI takes
# its directory as an installation --prefix, and /bin/mpirun (merged /usr,
# first on Bazel's PATH) gives the prefix "/", which it rejects.
command -v mpirun >/dev/null ||
  die "mpirun not found on PATH ($PATH); install Open MPI (Debian: openmpi-bin)"

if [ ! -f "$bin" ]; then
  for root in "${TEST_SRCDIR:-}/${TEST_WORKSPACE:-}" "${RUNFILES_DIR:-}/${TEST_WORKSPACE:-}"; do
    if [ -f "$root/$bin" ]; then
      bin=$root/$bin
      break
    fi
  done
fi
[ -f "$bin" ] || die "binary '$bin' not found (cwd $(pwd))"
[ -x "$bin" ] || die "binary '$bin' is not executable"
case "$bin" in
  /*) ;;
  *) bin=$(pwd)/$bin ;;
esac

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

# A private scratch directory per run for Open MPI's session directory, PMIx's
# store and the shared-memory (vader) segments. Bazel runs tests two at a time
# in separate PID namespaces, so two concurrent mpiruns can have the same PID,
# hence the same job id and the same file names under a shared /tmp and
# /dev/shm: MPI_Init then fails with PMIx errors. The path stays short
# because Unix socket paths are limited to 108 bytes.
scratch=$(mktemp -d /tmp/tsmpi.XXXXXX) || die "cannot create a directory under /tmp"
trap 'rm -rf "$scratch"' EXIT
trap 'exit 143' TERM INT
export TMPDIR=$scratch
export OMPI_MCA_orte_tmpdir_base=$scratch
export OMPI_MCA_btl_vader_backing_directory=$scratch

limit=${TS_MPIRUN_TIMEOUT:-240}
bazel_limit=${TEST_TIMEOUT:-0}
case "$bazel_limit" in '' | *[!0-9]*) bazel_limit=0 ;; esac
if [ -z "${TS_MPIRUN_TIMEOUT:-}" ] && [ "$bazel_limit" -gt 0 ]; then
  cap=$((bazel_limit - 10))
  [ "$cap" -ge 5 ] || cap=5
  [ "$cap" -lt "$limit" ] && limit=$cap
fi

flags=(-n "$np" --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)

timeout --kill-after=10 "$limit" mpirun "${flags[@]}" "$bin" "$@"
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "mpirun_test.sh: $bin on $np ranks did not finish within $limit s (killed, status $rc):" \
    "a hang, e.g. a rank waiting in a collective that a peer never entered" >&2
fi
exit "$rc"
