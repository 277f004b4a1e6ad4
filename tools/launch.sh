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
# Inside a SLURM allocation srun starts the ranks instead ("SLURM" below).
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
# A train command that saves and names no --resume goes on from its newest
# checkpoint on a restart.
restart_args=("$@")
if [[ " $* " == *" train "* && " $* " == *" --save "* && " $* " != *" --resume "* ]]; then
  restart_args+=(--resume auto)
fi
# wait_child PID — waits until child PID has ended (a trapped signal wakes
# `wait` early) and returns its status.
wait_child() {
  local rc
  while :; do
    wait "$1" 2>/dev/null # (bash's own "Killed" line when watch_step stops srun)
    rc=$?
    kill -0 "$1" 2>/dev/null || return "$rc"
  done
}
# say_restart RC DIED — the line before restart $attempt: DIED 1 when a rank
# died, else the watchdog's exit 4 (a peer silent past --comm-timeout).
say_restart() {
  local what="a rank died"
  (($2)) || what="a peer stopped answering"
  echo "tessera launch: $what (exit $1); restart $attempt of $max_restarts" \
    "from the newest complete checkpoint" >&2
}
# SLURM: inside an allocation (sbatch, salloc: SLURM_JOB_ID is set) and with
# no --hostfile, srun starts the N ranks on the allocation's nodes in place
# of mpirun (Open MPI's direct launch; Debian's Open MPI 4.1 forms one world
# only through --mpi=pmix, which TESSERA_SRUN_MPI overrides). N must fit the
# allocation (srun says so when it does not); OMP_NUM_THREADS defaults to
# the job's --cpus-per-task when it set one, else is left to you. Faults as
# under mpirun (--kill-on-bad-exit): a rank's error stops every rank and
# launch exits with that rank's code (it has printed its own error); a rank
# killed by a signal, or a node lost, is one line "tessera launch: rank R on
# host H died: signal S (NAME); every rank was stopped" (exit 128 + S) and
# counts for --max-restarts, as does exit 4 (a rank's watchdog); srun's
# boilerplate after either is dropped.
# SIGINT/SIGTERM become SIGTERM to every rank of the step (scancel --signal:
# srun itself would kill the step) and end the restarts.
# Slurm's PMIx fences all use its ring algorithm (SLURM_PMIX_FENCE=ring, as
# mpi.conf's PMIxCollFence=ring; a value you set is kept). By default
# (mixed) Open MPI's two fences in MPI_Init go through two algorithms, the
# ring for the one that exchanges addresses and the tree for the barrier
# after it, and with one node's ranks slow to start (Slurm 22.05, Open MPI
# 4.1) the other node's ranks came out of both while these were still in
# the first: a rank then received an MPI message before its PML could take
# one and crashed at address 0 inside MPI_Init (srun of a 4-rank
# MPI_Allreduce on the test cluster, one node's ranks at nice 19, load
# beside: 4 crashes in 150 jobs mixed, 0 in 450 ring).
if [[ -z "$hostfile" && -n "${SLURM_JOB_ID:-${SLURM_JOBID:-}}" ]] && command -v srun >/dev/null; then
  job="${SLURM_JOB_ID:-$SLURM_JOBID}" step_name="tessera-launch-$$"
  export SLURM_PMIX_FENCE="${SLURM_PMIX_FENCE:-ring}"
  if [[ -z "${OMP_NUM_THREADS:-}" && -n "${SLURM_CPUS_PER_TASK:-}" ]]; then
    export OMP_NUM_THREADS="$SLURM_CPUS_PER_TASK"
  fi
  if [[ -t 1 ]]; then export TESSERA_TTY=1; else export TESSERA_TTY=0; fi
  srun_args=(-n "$n" --mpi="${TESSERA_SRUN_MPI:-pmix}" --kill-on-bad-exit=1 --job-name="$step_name")
  fifo="$(mktemp -u "${TMPDIR:-/tmp}/tessera-launch.XXXXXX")"
  mkfifo "$fifo"
  outcome="$fifo.outcome"
  trap 'rm -f "$fifo" "$outcome"' EXIT
  set +e # statuses are read and handled below
  srun_pid="" stop=0
  on_stop() {
    stop=1
    [[ -n "$srun_pid" ]] || return 0
    local step
    step="$(squeue --noheader --steps --jobs="$job" --format='%i %j' 2>/dev/null |
      awk -v name="$step_name" '$2 == name { print $1; exit }')"
    if [[ -n "$step" ]]; then scancel --quiet --signal=TERM "$step"; else kill -TERM "$srun_pid"; fi
  }
  trap on_stop INT TERM
  # srun's stderr (the ranks' too) to ours; the first task that ended badly
  # is written to $outcome as "exit CODE" or "died SIGNAL".
  filter_srun() {
    awk -v outcome="$outcome" '
      BEGIN { split("Hangup,Interrupt,Quit,Illegal instruction,Trace/breakpoint trap,Aborted,Bus error," \
                    "Floating point exception,Killed,User defined signal 1,Segmentation fault," \
                    "User defined signal 2,Broken pipe,Alarm clock,Terminated", names, ",")
              for (s in names) signo[names[s]] = s }
      /^srun: error: [^:]+: tasks? [0-9,-]+: / {
        if (!ended) {
          ended = 1; host = $3; sub(/:$/, "", host); ranks = $5; sub(/:$/, "", ranks)
          what = $0; sub(/^srun: error: [^:]+: tasks? [0-9,-]+: /, "", what)
          if (match(what, /^Exited with exit code [0-9]+$/)) { print "exit " $NF > outcome }
          else {
            s = (what in signo) ? signo[what] : 0
            printf "tessera launch: rank%s %s on host %s died: signal %d (%s); every rank was stopped\n",
              (ranks ~ /[,-]/ ? "s" : ""), ranks, host, s, what
            print "died " s > outcome
          }
          fflush()
        }
        next
      }
      /^srun: error: Node failure on / { if (!ended) { ended = 1; print "died 0" > outcome }; print; fflush(); next }
      /^slurmstepd[^ ]*: error: \*\*\* STEP [0-9.]+ ON .* CANCELLED AT / { next }
      ended && /^slurmstepd[^ ]*: error: +mpi\/pmix/ { next }
      /^\[[^]]*\] Read -1, expected [0-9]+, errno = [0-9]+$/ { next }
      /^srun: (launch\/slurm: _step_signal: Terminating|Job step aborted|Force Terminated|forcing job termination)/ { next }
      { print; fflush() }
    '
  }
  # srun ends when every node has reported its tasks' ends. A node whose
  # link is down when its tasks end loses that report (its slurmstepd logs
  # "Failed to send MESSAGE_TASK_EXIT") and srun would wait forever for a
  # step slurmctld has already ended: once the step was seen in squeue and
  # has been gone from it for 10 s (squeue answering) while srun still runs,
  # srun is stopped and the step counts as a death (restartable).
  watch_step() {
    local seen=0 gone=0 steps
    # stopped (kill): its nap goes too, no sleep left behind
    trap 'kill $(jobs -p) 2>/dev/null; exit 0' TERM
    while kill -0 "$1" 2>/dev/null; do
      sleep 2 &
      wait $!
      steps="$(squeue --noheader --steps --jobs="$job" --format='%j' 2>/dev/null)" || continue
      if grep -qxF "$step_name" <<<"$steps"; then
        seen=1 gone=0
      elif ((seen)) && { gone=$((gone + 2)); ((gone >= 10)); }; then
        echo "tessera launch: the job step ended but srun did not hear from every node" \
          "within 10 s (a node's report was lost); every rank was stopped" >&2
        [[ -s "$outcome" ]] || echo "died 0" >"$outcome"
        kill -KILL "$1" 2>/dev/null
        return 0
      fi
    done
  }
  attempt=0
  while :; do
    : >"$outcome"
    filter_srun <"$fifo" >&2 &
    filter_pid=$!
    srun "${srun_args[@]}" "$@" 2>"$fifo" &
    srun_pid=$!
    watch_step "$srun_pid" &
    watch_pid=$!
    wait_child "$srun_pid"
    rc=$?
    kill "$watch_pid" 2>/dev/null
    wait "$watch_pid" 2>/dev/null
    srun_pid=""
    wait "$filter_pid"
    how="" code=""
    read -r how code <"$outcome"
    if [[ "$how" == exit ]]; then rc="$code"; elif [[ "$how" == died ]] && ((code > 0)); then rc=$((128 + code)); fi
    ((rc != 0 && stop == 0 && attempt < max_restarts)) && [[ "$how" == died || "$rc" == 4 ]] ||
      exit "$rc"
    attempt=$((attempt + 1))
    say_restart "$rc" "$([[ "$how" == died ]] && echo 1 || echo 0)"
    set -- "${restart_args[@]}"
  done
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
# (NAME); every rank was stopped". The ranks' shared-memory transport's
# "[host:pid] Read -1, expected N, errno = E" lines (a peer's memory read
# after it was stopped or killed) are dropped, and so is the remote
# launcher's "[host:pid] plm:rsh: Warning: setpgid(P,P) failed in parent
# with errno=Permission denied(13)" (its child had already run the remote
# command: a race on a loaded machine, harmless; it broke cluster_test's
# "no other lines" once). Everything else passes as it is. A
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
    /^\[[^]]*\] Read -1, expected [0-9]+, errno = [0-9]+$/ { next }
    /^\[[^]]*\] plm:rsh: Warning: setpgid\([0-9]+,[0-9]+\) failed in parent with errno=Permission denied\([0-9]+\)$/ { next }
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
  wait_child "$mpirun_pid"
  rc=$?
  mpirun_pid=""
  wait "$filter_pid" || true
  return "$rc"
}

attempt=0
run_job "$@"
rc=$?
# Exit 4: a rank's watchdog found a peer silent past --comm-timeout (a
# stopped process, a cut link): restartable like a death.
while ((rc != 0 && stop == 0 && attempt < max_restarts)) && [[ -e "$died" || "$rc" == 4 ]]; do
  attempt=$((attempt + 1))
  say_restart "$rc" "$([[ -e "$died" ]] && echo 1 || echo 0)"
  run_job "${restart_args[@]}"
  rc=$?
done
exit "$rc"
