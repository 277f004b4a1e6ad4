#!/usr/bin/env bash
# launch.sh — runs a tessera binary on N ranks under Open MPI's mpirun.
#   tools/launch.sh -n N [--hostfile FILE] [--max-restarts R] BINARY [ARGS...]
# Adds --oversubscribe (more ranks than cores is allowed: 4 ranks on a
# 2-core machine), --bind-to none (each rank's OpenMP threads may use any
# core), and --allow-run-as-root only when running as root. --hostfile
# passes through for several nodes. On one node, OMP_NUM_THREADS defaults
# to cores / N (at least 1) so ranks do not fight over cores; set it to
# override (with a hostfile it is left to you). TESSERA_TTY tells the ranks
# whether this script's stdout is a terminal. `./tessera launch` builds the
# binary first and calls this.
#
# Faults (torchrun's elastic agent, for MPI jobs): when a rank dies, mpirun
# stops every other rank at once; its boilerplate becomes one line naming
# the rank and the host. --max-restarts R relaunches a job up to R times
# when a rank died or was signalled (or mpirun lost a node's daemon), or
# when a rank's watchdog stopped the job (exit 4: a peer silent past
# --comm-timeout), never when the ranks exited with an error of their
# own (a usage, configuration
# or data error would only repeat), adding `--resume auto` to a train
# command that saves (--save DIR) and names no --resume, so it goes on from
# the newest complete checkpoint.
# SIGINT/SIGTERM to this script are sent as SIGTERM to the ranks of this
# node (a train with --save saves at the next step boundary and exits 0)
# and end the restarts.
set -euo pipefail

die() {
  echo "tessera launch: $*" >&2
  exit 2
}

n="" hostfile="" max_restarts=0
while (($#)); do
  case "$1" in
    --max-restarts)
      (($# >= 2)) || die "--max-restarts needs a value"
      [[ "$2" =~ ^[0-9]+$ ]] || die "--max-restarts $2: expected a number of restarts >= 0"
      max_restarts="$2"
      shift 2
      ;;
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
# Bounds before mpirun starts anything: on this node alone (no hostfile)
# at most 16 ranks per core, oversubscribed; with a hostfile at most 2^20.
if [[ -z "$hostfile" ]]; then
  node_cores="$(unset OMP_NUM_THREADS OMP_THREAD_LIMIT; nproc)" # (nproc counts those)
  max_n=$((16 * node_cores))
  ((${#n} <= 9 && n <= max_n)) ||
    die "-n $n: expected at most 16 ranks per core of this node (16 x $node_cores = $max_n); give --hostfile for more nodes"
else
  ((${#n} <= 9 && n <= 1048576)) || die "-n $n: expected at most 1048576 ranks"
fi

args=(-n "$n" --oversubscribe --bind-to none)
if [[ "$(id -u)" == 0 ]]; then
  args+=(--allow-run-as-root)
fi
if [[ -n "$hostfile" ]]; then
  args+=(--hostfile "$hostfile")
elif [[ -z "${OMP_NUM_THREADS:-}" ]]; then
  cores="$node_cores"
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
# mpirun's stderr, its boilerplate after a rank's death cut to one line:
# blocks between dashed rules that say the job was aborted, or that a rank
# exited non-zero (it has printed its own one-line error), are dropped, and
# "mpirun noticed that process rank R with PID P on node H exited on signal
# S (NAME)." becomes "tessera launch: rank R on host H died: signal S
# (NAME); every rank was stopped". Everything else passes as it is. A
# death (that line, or a lost daemon) is also written to the file $1.
filter_mpirun() {
  awk -v died_file="$1" '
    function flush(   i, keep) {
      keep = 1
      for (i = 1; i <= nb; i++) {
        if (buf[i] ~ /Primary job +terminated normally/) keep = 0
        if (buf[i] ~ /exited with non-zero status, thus causing/) keep = 0
        if (match(buf[i], /process rank [0-9]+ with PID [0-9]+ on node [^ ]+ exited on signal [0-9]+ \([^)]*\)/)) {
          split(substr(buf[i], RSTART, RLENGTH), w, " ")
          sig = substr(buf[i], RSTART, RLENGTH); sub(/.*exited on signal /, "", sig)
          printf "tessera launch: rank %s on host %s died: signal %s; every rank was stopped\n", w[3], w[9], sig
          print "died" > died_file
          fflush(); keep = 0
        }
      }
      if (keep) for (i = 1; i <= nb; i++) print buf[i]
      nb = 0; fflush()
    }
    /lost communication with a remote daemon|lost connection to|exited on signal/ { print "died" > died_file }
    /^----------+$/ { if (inblock) { flush(); inblock = 0 } else { inblock = 1; nb = 0 } ; next }
    { if (inblock) buf[++nb] = $0; else { print; fflush() } }
    END { flush() }
  '
}

set +e # statuses are read and handled below
mpirun_pid="" stop=0
# A stop request: SIGTERM to the ranks on this node (mpirun then sees them
# end as they choose: 0 after a save), or to mpirun when it has none here.
on_stop() {
  stop=1
  if [[ -n "$mpirun_pid" ]]; then
    pkill -TERM -P "$mpirun_pid" 2>/dev/null || kill -TERM "$mpirun_pid" 2>/dev/null || true
  fi
}
trap on_stop INT TERM

fifo="$(mktemp -u "${TMPDIR:-/tmp}/tessera-launch.XXXXXX")"
mkfifo "$fifo"
died="$fifo.died"
trap 'rm -f "$fifo" "$died"' EXIT

# One run of the job; returns mpirun's status ($died exists after it if a
# rank died).
run_job() {
  rm -f "$died"
  filter_mpirun "$died" <"$fifo" >&2 &
  local filter_pid=$! rc
  # Plain `mpirun`, found on PATH again: given an absolute path, Open MPI takes
  # its directory as an installation --prefix, and /bin/mpirun (merged /usr,
  # first on Bazel's PATH) gives the prefix "/", which it rejects.
  mpirun "${args[@]}" "$@" 2>"$fifo" &
  mpirun_pid=$!
  while :; do
    wait "$mpirun_pid"
    rc=$?
    kill -0 "$mpirun_pid" 2>/dev/null || break # else a trapped signal woke the wait
  done
  mpirun_pid=""
  wait "$filter_pid" || true
  return "$rc"
}

# A train command that saves and names no --resume goes on from its newest
# checkpoint on a restart.
restart_args=("$@")
if [[ " $* " == *" train "* && " $* " == *" --save "* && " $* " != *" --resume "* ]]; then
  restart_args+=(--resume auto)
fi

attempt=0
run_job "$@"
rc=$?
# Exit 4: a rank's watchdog found a peer silent past --comm-timeout (a
# stopped process, a cut link): restartable like a death.
while ((rc != 0 && stop == 0 && attempt < max_restarts)) && [[ -e "$died" || "$rc" == 4 ]]; do
  attempt=$((attempt + 1))
  what="a rank died"
  [[ "$rc" == 4 && ! -e "$died" ]] && what="a peer stopped answering"
  echo "tessera launch: $what (exit $rc); restart $attempt of $max_restarts" \
    "from the newest complete checkpoint" >&2
  run_job "${restart_args[@]}"
  rc=$?
done
exit "$rc"
