#!/usr/bin/env bash
# launch.sh — runs a tessera binary on N ranks under Open MPI's mpirun.
#   tools/launch.sh -n N [--hostfile FILE] BINARY [ARGS...]
# Adds --oversubscribe (more ranks than cores is allowed: 4 ranks on a
# 2-core machine), --bind-to none (each rank's OpenMP threads may use any
# core), and --allow-run-as-root only when running as root. --hostfile
# passes through for several nodes. On one node, OMP_NUM_THREADS defaults
# to cores / N (at least 1) so ranks do not fight over cores; set it to
# override (with a hostfile it is left to you). TESSERA_TTY tells the ranks
# whether this script's stdout is a terminal. `./tessera launch` builds the
# binary first and calls this.
set -euo pipefail

die() {
  echo "tessera launch: $*" >&2
  exit 2
}

n="" hostfile=""
while (($#)); do
  case "$1" in
    -n | -np | --np)
      (($# >= 2)) || die "$1 needs a value"
      n="$2"
      shift 2
      ;;
    --hostfile)
      (($# >= 2)) || die "--hostfile needs a value"
      hostfile="$2"
      shift 2
      ;;
    *) break ;;
  esac
done
(($# >= 1)) || die "usage: tessera launch -n N [--hostfile FILE] <command> [flags]"
[[ "$n" =~ ^[1-9][0-9]*$ ]] || die "-n ${n:-<missing>}: expected a number of ranks >= 1"
if [[ -n "$hostfile" && ! -r "$hostfile" ]]; then
  die "--hostfile $hostfile: cannot read the file"
fi
mpirun_bin="$(command -v mpirun || true)"
[[ -n "$mpirun_bin" ]] ||
  die "mpirun: not found on PATH; install Open MPI (Debian: apt-get install openmpi-bin, which tools/setup.sh does)"

args=(-n "$n" --oversubscribe --bind-to none)
if [[ "$(id -u)" == 0 ]]; then
  args+=(--allow-run-as-root)
fi
if [[ -n "$hostfile" ]]; then
  args+=(--hostfile "$hostfile")
elif [[ -z "${OMP_NUM_THREADS:-}" ]]; then
  cores="$(nproc)"
  export OMP_NUM_THREADS=$((cores / n > 1 ? cores / n : 1))
fi
# Ranks see a pseudo-terminal whatever our stdout is; tell them the truth so
# progress lines redraw only on a real terminal.
if [[ -t 1 ]]; then export TESSERA_TTY=1; else export TESSERA_TTY=0; fi
# Forward the variables tessera reads to every rank (remote nodes included).
for v in OMP_NUM_THREADS TESSERA_HOME TESSERA_TTY; do
  if [[ -n "${!v:-}" ]]; then
    args+=(-x "$v")
  fi
done
# Plain `mpirun`, found on PATH again: given an absolute path, Open MPI takes
# its directory as an installation --prefix, and /bin/mpirun (merged /usr,
# first on Bazel's PATH) gives the prefix "/", which it rejects.
exec mpirun "${args[@]}" "$@"
