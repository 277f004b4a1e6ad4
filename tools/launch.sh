#!/usr/bin/env bash
# launch.sh — runs a tessera binary on N ranks under Open MPI's mpirun.
#   tools/launch.sh -n N [--hostfile FILE] [--max-restarts R] BINARY [ARGS...]
#   tools/launch.sh --nodes MIN:MAX [--hostfile FILE] [--max-restarts R] BINARY train ... --save DIR
#     (elastic, below: inside a SLURM allocation the allocation's nodes)
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
# SIGINT to this script goes to the ranks of this node as SIGINT (a train
# with --save saves at the next step boundary and exits 0); SIGTERM and
# SIGUSR1 (a preemption's warning) go to every rank as SIGUSR1 (it saves and
# exits 5, which tools/slurm/train.sbatch requeues on). Either ends the
# restarts.
set -euo pipefail

die() {
  echo "tessera launch: $*" >&2
  exit 2
}

n="" hostfile="" max_restarts=0 nodes_range=""
while (($#)); do
  case "$1" in
    --nodes)
      (($# >= 2)) || die "--nodes needs a value"
      [[ "$2" =~ ^([1-9][0-9]{0,5}):([1-9][0-9]{0,5})$ ]] && ((BASH_REMATCH[1] <= BASH_REMATCH[2])) ||
        die "--nodes $2: expected MIN:MAX, node counts with 1 <= MIN <= MAX"
      nodes_range="$2"
      shift 2
      ;;
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
(($# >= 1)) || die "usage: tessera launch -n N [--hostfile FILE] <command> [flags], or --nodes MIN:MAX"
if [[ -n "$nodes_range" ]]; then
  [[ -z "$n" ]] || die "-n $n: with --nodes the ranks are the slots of the nodes in use; drop -n"
  [[ -n "$hostfile" || -n "${SLURM_JOB_ID:-${SLURM_JOBID:-}}" ]] ||
    die "--nodes $nodes_range: expected --hostfile FILE naming the nodes, or a SLURM allocation"
  [[ " $* " == *" train "* && " $* " == *" --save "* ]] ||
    die "--nodes $nodes_range: expected a train command with --save DIR (a job that changes size goes on from its checkpoints)"
  n=1 # the world is each launch's own (elastic below)
fi
[[ "$n" =~ ^[1-9][0-9]*$ ]] || die "-n ${n:-<missing>}: expected a number of ranks >= 1"
if [[ -n "$hostfile" && ! -r "$hostfile" ]]; then
  die "--hostfile $hostfile: cannot read the file"
fi
# A tessera binary's command is one its --help lists, said here once, before
# any rank starts (every rank would print the usage, mpirun its own lines).
if [[ "${1##*/}" == tessera || "${1##*/}" == tessera_testing ]]; then
  commands="$("$1" --help 2>/dev/null | awk '/^commands:/ { on = 1; next }
    on && /^  [a-z]/ { printf "%s%s", sep, $1; sep = ", " }')"
  if [[ -n "$commands" && $# -lt 2 ]]; then
    die "no command given: expected one of $commands"
  elif [[ -n "$commands" && " ${commands//,/} -h --help " != *" $2 "* ]]; then
    die "$2: not a tessera command; expected one of $commands"
  fi
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
# ---- elastic: --nodes MIN:MAX -------------------------------------------
# torchrun's elastic agent for MPI jobs. The nodes (the hostfile's lines
# "HOST [slots=S]", S ranks each, default 1, re-read before every launch;
# or a SLURM allocation's) are probed (TESSERA_PROBE HOST, default: `true`
# started on HOST as the ranks are, mpirun through the job's own remote
# launcher and network or srun --overlap, TESSERA_PROBE_TIMEOUT seconds at
# most, default 10); the job
# runs on the first K that answer, K the most in MIN..MAX whose world
# (their slots) the layout allows: world = P pipeline stages x dp, and the
# global batch G (--global-batch, else the flags' dp x micro-batch x
# accumulation on MAX nodes) = dp x micro-batch x accumulation, the
# micro-batch the largest that divides (at most the one given): G and the
# learning-rate schedule never change, and a batch is a pure function of
# (seed, step, sample index), so every size sees the same samples. A
# failure (a rank died, a node's daemon was lost, the watchdog's exit 4)
# counts for --max-restarts and relaunches on the nodes that answer,
# resumed from the newest complete checkpoint (--resume auto: a damaged
# one gives way to the next older). Every node is probed while the job runs
# (watch_nodes): one in use that stops answering stops the job at once (a
# failure, as above); while fewer than MAX run, one that answers again
# makes the ranks stop (SIGUSR1: they save at the next step boundary and
# exit 5) and the job relaunch larger from that checkpoint. Each
# change of size is one line: which node, old and new world, micro-batch x
# accumulation, the step resumed from and the steps redone. No layout of
# MIN nodes: one line, the last exit code.

# The value of train flag $1 in the words after it, else $2.
flag_value() {
  local name="$1" def="$2" i
  shift 2
  local a=("$@")
  for ((i = 0; i < ${#a[@]} - 1; i++)); do
    [[ "${a[i]}" == "$name" ]] && def="${a[i + 1]}"
  done
  echo "$def"
}

# The words after $1 without the train flags that fix the batch's shape.
without_batch_flags() {
  local a=("$@") i out=()
  for ((i = 0; i < ${#a[@]}; i++)); do
    case "${a[i]}" in
      --micro-batch | --grad-accum | --global-batch) i=$((i + 1)) ;;
      *) out+=("${a[i]}") ;;
    esac
  done
  printf '%s\0' "${out[@]}"
}

# The nodes as "HOST SLOTS" lines, in order: the hostfile's, or the SLURM
# allocation's (SLURM_JOB_NODELIST, its tasks per node from
# SLURM_TASKS_PER_NODE, e.g. "2(x3)").
read_nodes() {
  [[ -n "$hostfile" ]] || {
    slurm_nodes
    return
  }
  awk '{ sub(/#.*/, "") } NF { s = 1; for (i = 2; i <= NF; i++) if ($i ~ /^slots=[0-9]+$/) { s = substr($i, 7) }
         print $1, s }' "$hostfile"
}

slurm_nodes() {
  local hosts=() counts=() specs=() spec i
  mapfile -t hosts < <(scontrol show hostnames "${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}}" 2>/dev/null)
  IFS=, read -ra specs <<<"${SLURM_TASKS_PER_NODE:-}"
  for spec in "${specs[@]}"; do
    if [[ "$spec" =~ ^([0-9]+)\(x([0-9]+)\)$ ]]; then
      for ((i = 0; i < BASH_REMATCH[2]; i++)); do counts+=("${BASH_REMATCH[1]}"); done
    elif [[ "$spec" =~ ^[0-9]+$ ]]; then
      counts+=("$spec")
    fi
  done
  for i in "${!hosts[@]}"; do echo "${hosts[i]} ${counts[i]:-1}"; done
}

# Whether node $1 answers (stdin not read: probes run inside read loops;
# in a subshell that is no bare exec, so the shell's "Killed" line for a
# timed-out probe, timeout's own SIGKILL to its group, goes to /dev/null):
# TESSERA_PROBE, else `true` started there as the job's ranks are (srun
# --overlap in an allocation, beside the running step; else mpirun).
probe() {
  if [[ -z "${TESSERA_PROBE:-}" && -z "$hostfile" ]]; then
    (timeout -k 2 "${TESSERA_PROBE_TIMEOUT:-10}" srun --overlap --nodes=1 --ntasks=1 \
      --nodelist="$1" --job-name=tessera-probe --quiet true; exit) </dev/null >/dev/null 2>&1
  elif [[ -n "${TESSERA_PROBE:-}" ]]; then
    (timeout -k 2 "${TESSERA_PROBE_TIMEOUT:-10}" $TESSERA_PROBE "$1"; exit) </dev/null >/dev/null 2>&1
  else
    local root=()
    [[ "$(id -u)" != 0 ]] || root=(--allow-run-as-root)
    (timeout -k 2 "${TESSERA_PROBE_TIMEOUT:-10}" mpirun "${root[@]}" -n 1 --host "$1" true; exit) </dev/null >/dev/null 2>&1
  fi
}

# Probes every node of the hostfile at once; prints those that answer,
# "HOST SLOTS" lines in the hostfile's order.
answering() {
  local dir host slots i=0
  dir="$(mktemp -d "${TMPDIR:-/tmp}/tessera-probe.XXXXXX")"
  while read -r host slots; do
    { probe "$host" && echo "$host $slots" >"$dir/$(printf %06d $i)"; } &
    i=$((i + 1))
  done < <(read_nodes)
  wait
  cat "$dir"/* 2>/dev/null
  rm -rf "$dir"
}

# Chooses the layout on the answering nodes ($1, lines "HOST SLOTS"): sets
# use_nodes (lines), use_world, use_mb, use_accum; returns 1 when no K in
# MIN..MAX fits.
choose_layout() {
  local lines=() k w dp mb
  mapfile -t lines <<<"$1"
  [[ -n "$1" ]] || lines=()
  for ((k = (${#lines[@]} < node_max ? ${#lines[@]} : node_max); k >= node_min; k--)); do
    w=0
    for ((i = 0; i < k; i++)); do w=$((w + ${lines[i]##* })); done
    ((w % pipeline == 0)) || continue
    dp=$((w / pipeline))
    ((global % dp == 0)) || continue
    for ((mb = micro; mb >= 1; mb--)); do ((global / dp % mb == 0)) && break; done
    use_nodes="$(printf '%s\n' "${lines[@]:0:k}")"
    use_world=$w use_mb=$mb use_accum=$((global / dp / mb))
    return 0
  done
  return 1
}

# The newest complete checkpoint's step under the save folder, else 0.
newest_step() {
  local d best=0 s
  for d in "$save_dir"/step-*/index.json; do
    [[ -e "$d" ]] || continue
    s="${d%/index.json}"
    s="${s##*/step-}"
    s=$((10#$s))
    ((s > best)) && best=$s
  done
  echo "$best"
}

# The last step the previous run finished (the trainer's progress.json).
last_step() {
  sed -n 's/^{"step": \([0-9]*\)}$/\1/p' "$save_dir/progress.json" 2>/dev/null || true
}

names() { awk '{ printf "%s%s", sep, $1; sep = " " }' <<<"$1"; }

# The names of node lines $1 that node lines $2 lack, space-separated, with a
# trailing space ("" when none).
not_in() { comm -23 <(awk '{ print $1 }' <<<"$1" | sort) <(awk '{ print $1 }' <<<"$2" | sort) | tr '\n' ' '; }

# Watches the nodes while the job runs (mpirun's pid $1), probing each
# every TESSERA_NODE_POLL seconds (default 30): a node in use that fails two
# probes in a row is lost: its name goes to $lost_file and the job is
# stopped at once (a cut link would otherwise wait out --comm-timeout,
# 600 s by default, and mpirun then wait for the node forever); a node not
# in use that answers has come back: its name goes to $grow_file and the
# ranks get SIGUSR1 (they save at the next step boundary and exit 5).
watch_nodes() {
  trap 'kill $(jobs -p) 2>/dev/null; exit 0' TERM
  local host slots in_use
  declare -A misses=()
  in_use="$(awk '{ print $1 }' <<<"$use_nodes")"
  while kill -0 "$1" 2>/dev/null; do
    sleep "${TESSERA_NODE_POLL:-30}" &
    wait $!
    while read -r host slots; do
      if grep -qx "$host" <<<"$in_use"; then
        if probe "$host"; then misses[$host]=0; else misses[$host]=$((${misses[$host]:-0} + 1)); fi
        if ((${misses[$host]} >= 2)); then
          echo "$host" >"$lost_file"
          job_stop "$1"
          return 0
        fi
      elif ((grow)) && probe "$host"; then
        echo "$host" >"$grow_file"
        job_signal "$1" USR1
        grow=0 # once: the ranks are saving
      fi
    done < <(read_nodes)
  done
}

# The running job (mpirun's or srun's pid $1): signal $2 to every rank
# (mpirun forwards SIGUSR1; under SLURM scancel --signal to the step), or
# stopped at once (mpirun and its remote launches; srun's step).
job_signal() {
  if [[ -n "$hostfile" ]]; then kill -"$2" "$1" 2>/dev/null; else step_signal "$2"; fi
}
job_stop() {
  if [[ -n "$hostfile" ]]; then
    kill_tree "$1"
  else
    step_signal KILL
    kill -KILL "$1" 2>/dev/null # srun would wait for the lost node
  fi
}

elastic() {
  node_min="${nodes_range%:*}" node_max="${nodes_range#*:}"
  save_dir="$(flag_value --save "" "$@")"
  pipeline="$(flag_value --pipeline 1 "$@")"
  micro="$(flag_value --micro-batch 8 "$@")"
  local accum all full=0 host slots i=0
  accum="$(flag_value --grad-accum 1 "$@")"
  all="$(read_nodes)"
  local whose="the allocation's"
  [[ -z "$hostfile" ]] || whose="the hostfile's"
  [[ -n "$all" ]] || die "--nodes $nodes_range: $whose nodes: none (a hostfile has lines HOST [slots=S])"
  while read -r host slots; do
    ((i < node_max)) && full=$((full + slots))
    i=$((i + 1))
  done <<<"$all"
  ((i >= node_min)) || die "--nodes $nodes_range: $whose nodes are $i; expected at least $node_min"
  [[ "$pipeline$micro$accum" =~ ^[0-9]+$ ]] && ((pipeline >= 1 && micro >= 1 && accum >= 1)) ||
    die "--pipeline, --micro-batch, --grad-accum: expected numbers >= 1"
  global="$(flag_value --global-batch $((full / pipeline * micro * accum)) "$@")"
  [[ "$global" =~ ^[1-9][0-9]*$ ]] || die "--global-batch $global: expected a number >= 1"
  local base=() words=() rc why="" old_world=0 old_shape="" first=1 answer
  mapfile -d '' base < <(without_batch_flags "$@")
  grow_file="$fifo.grow" lost_file="$fifo.lost"
  local probed=0 # answer already holds this round's probes (after a failure)
  while :; do
    ((probed)) || answer="$(answering)"
    probed=0
    if ! choose_layout "$answer"; then
      local missing
      missing="$(not_in "$all" "$answer")"
      echo "tessera launch: --nodes $nodes_range: $(grep -c . <<<"$answer") of $whose" \
        "$(grep -c . <<<"$all") nodes answer${missing:+ (not: ${missing% })}; no layout on $node_min" \
        "or more fits --pipeline $pipeline and global batch $global; stopping" >&2
      exit "${rc:-1}"
    fi
    local shape="$use_mb x $use_accum" on
    on="$(names "$use_nodes") (pipeline $pipeline x dp $((use_world / pipeline)))"
    if ((first)); then
      local missing
      missing="$(not_in "$all" "$answer")"
      echo "tessera launch: --nodes $nodes_range: $(grep -c . <<<"$answer") of $(grep -c . <<<"$all")" \
        "nodes answer${missing:+ (not: ${missing% })}: world $use_world ranks on $on," \
        "micro-batch x accumulation $shape" >&2
    else
      local from redone last
      from="$(newest_step)" last="$(last_step)"
      redone=$(( ${last:-0} > from ? ${last:-0} - from : 0 ))
      echo "tessera launch: $why: world $old_world -> $use_world ranks on $on," \
        "micro-batch x accumulation $old_shape -> $shape, resuming from step $from ($redone steps redone)" >&2
    fi
    first=0 old_world=$use_world old_shape="$shape"
    words=("${base[@]}" --micro-batch "$use_mb" --global-batch "$global")
    rm -f "$grow_file" "$lost_file"
    if [[ -n "$hostfile" ]]; then
      printf '%s\n' "$use_nodes" | awk '{ print $1, "slots=" $2 }' >"$fifo.hosts"
      args=(-n "$use_world" --oversubscribe --bind-to none --hostfile "$fifo.hosts")
      [[ "$(id -u)" != 0 ]] || args+=(--allow-run-as-root)
      for v in OMP_NUM_THREADS TESSERA_HOME TESSERA_TTY; do
        [[ -z "${!v:-}" ]] || args+=(-x "$v")
      done
      run_job_elastic "${words[@]}"
    else
      run_step_elastic "${words[@]}"
    fi
    rc=$?
    if [[ -s "$grow_file" && "$rc" == 5 && "$stop" == 0 ]]; then
      why="node $(cat "$grow_file") answers again"
    elif ((rc != 0 && stop == 0)) && [[ -e "$died" || -s "$lost_file" || "$rc" == 4 ]] &&
      ((attempt < max_restarts)); then
      attempt=$((attempt + 1))
      local gone
      answer="$(answering)" probed=1
      gone="$(not_in "$use_nodes" "$answer")"
      if [[ -n "$gone" ]]; then why="node ${gone% } lost"
      elif [[ -e "$died" ]]; then why="a rank died"
      else why="a peer stopped answering"; fi
      why+=" (exit $rc; restart $attempt of $max_restarts)"
    else
      exit "$rc"
    fi
    [[ " ${base[*]} " == *" --resume "* ]] || base+=(--resume auto)
  done
}

# SIGKILL to process $1 and every process below it.
kill_tree() {
  local child
  kill -STOP "$1" 2>/dev/null # no new children meanwhile
  for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$child"; done
  kill -KILL "$1" 2>/dev/null
}

# Whether mpirun (pid $1) has ranks on this node: children other than its
# remote launches (the rsh agent's commands that start orted elsewhere).
has_children() { ps -o args= --ppid "$1" 2>/dev/null | grep -qv orted; }

# mpirun ends only when it has heard from every node's daemon: after a cut
# link it would wait for the lost node forever (and hold the ranks' lines
# until then). Once this node's ranks have all ended, mpirun is given
# TESSERA_HANG_GRACE seconds (default 20) to end, then stopped, and the run
# counts as a death (a restart). (A launch from a node without ranks of
# its own is not watched so.)
watch_hang() {
  trap 'kill $(jobs -p) 2>/dev/null; exit 0' TERM
  local quiet=0 seen=0
  while kill -0 "$1" 2>/dev/null; do
    sleep 1 &
    wait $!
    if has_children "$1"; then
      seen=1
    elif ((seen)); then
      quiet=$((quiet + 1))
      if ((quiet >= ${TESSERA_HANG_GRACE:-20})); then
        echo "died" >"$died"
        kill_tree "$1" # its remote launches too: they hold its stderr open
        return 0
      fi
    else
      quiet=0
    fi
  done
}

# run_job, with the grow watcher beside mpirun while nodes are left out.
run_job_elastic() {
  rm -f "$died"
  filter_mpirun "$died" <"$fifo" >&2 &
  local filter_pid=$! rc watch_pid=""
  mpirun "${args[@]}" "$@" 2>"$fifo" &
  mpirun_pid=$!
  grow=0
  (($(wc -l <<<"$use_nodes") < node_max)) && grow=1
  watch_nodes "$mpirun_pid" &
  watch_pid=$!
  watch_hang "$mpirun_pid" &
  local hang_pid=$!
  wait_child "$mpirun_pid"
  rc=$?
  mpirun_pid=""
  kill "$hang_pid" 2>/dev/null
  wait "$hang_pid" 2>/dev/null
  [[ -z "$watch_pid" ]] || { kill "$watch_pid" 2>/dev/null; wait "$watch_pid" 2>/dev/null; }
  wait "$filter_pid" || true
  return "$rc"
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
# SIGINT, SIGTERM and SIGUSR1 go to every rank of the step as they are
# (scancel --signal: srun itself would kill the step) and end the restarts.
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
  outcome="$fifo.outcome" died="$fifo.died"
  trap 'rm -f "$fifo" "$outcome" "$died" "$fifo.grow" "$fifo.lost"' EXIT
  set +e # statuses are read and handled below
  srun_pid="" stop=0
  on_stop() { # $1: the signal, passed on (SIGINT: save, exit 0; TERM, USR1: save, exit 5)
    stop=1
    [[ -n "$srun_pid" ]] || return 0
    local step
    step="$(squeue --noheader --steps --jobs="$job" --format='%i %j' 2>/dev/null |
      awk -v name="$step_name" '$2 == name { print $1; exit }')"
    if [[ -n "$step" ]]; then scancel --quiet --signal="$1" "$step"; else kill -TERM "$srun_pid"; fi
  }
  trap 'on_stop INT' INT
  trap 'on_stop TERM' TERM
  trap 'on_stop USR1' USR1
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
  # step_signal SIG: SIG to every rank of the running step (scancel --signal).
  step_signal() {
    local step
    step="$(squeue --noheader --steps --jobs="$job" --format='%i %j' 2>/dev/null |
      awk -v name="$step_name" '$2 == name { print $1; exit }')"
    [[ -z "$step" ]] || scancel --quiet --signal="$1" "$step"
  }
  # One run of an elastic job (elastic above) on $use_nodes: srun's status,
  # $died written when a rank died or a node was lost.
  run_step_elastic() {
    : >"$outcome"
    rm -f "$died"
    launches=$((${launches:-0} + 1)) # a step of a lost node may linger in squeue
    step_name="tessera-launch-$$-$launches"
    filter_srun <"$fifo" >&2 &
    local filter_pid=$! rc how="" code="" watch_pid nodes_pid
    srun -N "$(grep -c . <<<"$use_nodes")" -n "$use_world" --overlap \
      --nodelist="$(awk '{ printf "%s%s", sep, $1; sep = "," }' <<<"$use_nodes")" \
      --mpi="${TESSERA_SRUN_MPI:-pmix}" --kill-on-bad-exit=1 --job-name="$step_name" "$@" 2>"$fifo" &
    srun_pid=$!
    watch_step "$srun_pid" &
    watch_pid=$!
    grow=0
    (($(grep -c . <<<"$use_nodes") < node_max)) && grow=1
    watch_nodes "$srun_pid" &
    nodes_pid=$!
    wait_child "$srun_pid"
    rc=$?
    kill "$watch_pid" "$nodes_pid" 2>/dev/null
    wait "$watch_pid" "$nodes_pid" 2>/dev/null
    srun_pid=""
    wait "$filter_pid"
    read -r how code <"$outcome"
    if [[ "$how" == exit ]]; then rc="$code"; elif [[ "$how" == died ]]; then
      echo died >"$died"
      ((code > 0)) && rc=$((128 + code))
    fi
    [[ ! -s "$fifo.lost" ]] || echo died >"$died"
    return "$rc"
  }
  attempt=0
  [[ -z "$nodes_range" ]] || elastic "$@" # (exits)
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
    /^mpirun: Forwarding signal [0-9]+ to job$/ { next }
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
# SIGINT goes to the ranks as SIGINT (a user's stop: they save and exit 0);
# SIGTERM and SIGUSR1 (a preemption's warning) go to every rank of every
# node as SIGUSR1, which mpirun forwards (they save and exit 5).
on_stop() {
  stop=1
  [[ -n "$mpirun_pid" ]] || return 0
  if [[ "$1" == INT ]]; then
    pkill -INT -P "$mpirun_pid" 2>/dev/null || kill -INT "$mpirun_pid" 2>/dev/null || true
  else
    kill -USR1 "$mpirun_pid" 2>/dev/null || true
  fi
}
trap 'on_stop INT' INT
trap 'on_stop TERM' TERM
trap 'on_stop USR1' USR1

fifo="$(mktemp -u "${TMPDIR:-/tmp}/tessera-launch.XXXXXX")"
mkfifo "$fifo"
died="$fifo.died"
trap 'rm -f "$fifo" "$died" "$fifo.grow" "$fifo.lost" "$fifo.hosts"' EXIT

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
[[ -z "$nodes_range" ]] || elastic "$@" # (exits)
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
