#!/usr/bin/env bash
# testbed.sh — a real SLURM cluster on the nodes of tools/cluster.sh, for
# tests (DESIGN.md "Several nodes"): one munged, slurmctld on node 1 and a
# slurmd on every node, each daemon inside its node's network namespace with
# its node's hostname, so slurmd finds its NodeName, srun and slurmstepd
# reach each other at the nodes' addresses, and MPI ranks started by srun
# talk over the nodes' eth0.
#
#   tools/slurm/testbed.sh up       start the daemons on the cluster's nodes (made
#                                   first with tools/cluster.sh up); waits until
#                                   sinfo shows every node idle; replaces a testbed
#                                   of the same cluster
#   tools/slurm/testbed.sh down     cancel every job, stop every daemon and step,
#                                   remove the testbed's folder
#   tools/slurm/testbed.sh env      the settings a client command needs, as shell
#                                   exports (eval "$(tools/slurm/testbed.sh env)")
#   tools/slurm/testbed.sh exec CMD [ARG..]
#                                   run CMD on node 1 (the submit host) with them:
#                                   sinfo, sbatch, salloc, srun, squeue, scancel
#
# The cluster is the one tools/cluster.sh names: TS_CLUSTER=P (default tscl),
# TS_CLUSTER_NET=K. Client commands must run on a node (the daemons' addresses,
# 198.18.K.0/24, exist only there): through `exec` above or tools/cluster.sh
# exec with SLURM_CONF set.
#
# Everything lives in one folder, /tmp/tessera-slurm-P (TS_SLURM_DIR, the
# same for up and down: a short path, as munged's socket is in it, and every
# folder above it searchable by all, which munged checks): munge/ (a fresh
# key made by `up`; munged's socket, pid and log), slurm.conf and
# cgroup.conf (SLURM_CONF points at the first; nothing is read from
# /etc/slurm or /etc/munge), ctld/ (slurmctld's state, pid and log) and a
# folder per node (its slurmd's spool, pid, log and TmpFS: %n in
# slurm.conf). munged runs outside the nodes: its socket is a file, which
# every node reaches. SlurmUser and SlurmdUser are root; proctrack/linuxproc
# and task/none, so no cgroups; no accounting. Each node offers this
# machine's CPU count (nproc, at least 2) to jobs: the nodes share its
# cores. After `down` nothing of it runs and nothing is left outside the
# namespaces and that folder, which is gone.
#
# Needs root and Debian's slurmctld, slurmd, slurm-client and munge
# (tools/setup.sh installs them).
set -euo pipefail

P="${TS_CLUSTER-tscl}" # set but empty is refused, as tools/cluster.sh does
K="${TS_CLUSTER_NET-0}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cluster="$here/../cluster.sh"
dir="${TS_SLURM_DIR:-/tmp/tessera-slurm-$P}"
conf="$dir/slurm.conf"

die() {
  echo "tools/slurm/testbed.sh: $*" >&2
  exit 1
}

[[ "$P" =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "TS_CLUSTER=$P: expected what tools/cluster.sh accepts"
[[ "$K" =~ ^(0|[1-9][0-9]{0,2})$ ]] && ((K <= 255)) ||
  die "TS_CLUSTER_NET=$K: expected 0-255 (decimal, no leading zeros)"

nodes() { TS_CLUSTER="$P" TS_CLUSTER_NET="$K" "$cluster" nodes; }

# Runs "$@" on node $1 (its network, its hostname) with SLURM_CONF set.
on() {
  local node="$1"
  shift
  TS_CLUSTER="$P" TS_CLUSTER_NET="$K" "$cluster" exec "$node" env SLURM_CONF="$conf" "$@"
}

# Why the testbed cannot start here, or nothing.
why_not() {
  local b
  for b in munged mungekey slurmctld slurmd sinfo sbatch srun; do
    command -v "$b" >/dev/null || {
      echo "$b is not installed (tools/setup.sh installs munge, slurmctld, slurmd, slurm-client)"
      return
    }
  done
  [[ -n "$(nodes)" ]] || echo "cluster $P has no nodes (tools/cluster.sh up first)"
}

# Sends SIGTERM to the process in pid file $1 and waits up to 10 s for it to
# end, then sends SIGKILL.
stop_pidfile() {
  local pid
  [[ -r "$1" ]] || return 0
  pid="$(cat "$1" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do
    alive "$pid" || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# Whether process $1 runs (a zombie does not: the daemons' parent is
# whatever adopted them, which may reap them late).
alive() {
  local state
  state="$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" || return 1
  [[ -n "$state" && "$state" != Z ]]
}

cmd_down() {
  [[ -d "$dir" ]] || return 0
  local n pid
  if [[ -r "$dir/ctld/slurmctld.pid" ]] && alive "$(cat "$dir/ctld/slurmctld.pid")"; then
    on "$P-n1" scancel --quiet --full --user=root 2>/dev/null || true
  fi
  stop_pidfile "$dir/ctld/slurmctld.pid"
  for n in $(nodes); do
    stop_pidfile "$dir/$n/slurmd.pid"
    # Steps (slurmstepd and its tasks) outlive slurmd: end those on the node.
    for pid in $(ip netns pids "$n" 2>/dev/null || true); do
      [[ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" == slurmstepd ]] && kill -KILL "$pid" 2>/dev/null || true
    done
  done
  stop_pidfile "$dir/munge/munged.pid"
  rm -rf "$dir"
}

cmd_up() {
  local why
  why="$(why_not)"
  [[ -z "$why" ]] || die "cannot start a SLURM testbed: $why"
  cmd_down
  local list=() n
  mapfile -t list < <(nodes)
  # munged wants its socket's folders searchable by all (the key stays 600).
  mkdir -m 755 "$dir" # fails if something else made it meanwhile
  mkdir -m 755 "$dir/munge"
  mkdir -m 700 "$dir/ctld"
  for n in "${list[@]}"; do mkdir -m 700 "$dir/$n"; done

  # munge: a fresh key; the socket is a file, so every namespace reaches it.
  mungekey --create --keyfile="$dir/munge/munge.key" --bits=1024 >/dev/null
  munged --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
    --seed-file="$dir/munge/munged.seed" ||
    die "munged did not start: $(tail -n 3 "$dir/munge/munged.log" 2>/dev/null)"

  local last="${#list[@]}" cpus
  cpus="$(unset OMP_NUM_THREADS OMP_THREAD_LIMIT; nproc)" # (nproc counts those)
  ((cpus >= 2)) || cpus=2 # 2 tasks per node fit on a 1-core machine too
  cat >"$conf" <<EOF
# Written by tools/slurm/testbed.sh up; removed by down.
ClusterName=$P
SlurmctldHost=$P-n1(198.18.$K.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a job step credential's life (default 120 s), also how long a
# requeued job waits before it may run again (slurm_test's preemption).
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=30
StateSaveLocation=$dir/ctld
SlurmctldPidFile=$dir/ctld/slurmctld.pid
SlurmctldLogFile=$dir/ctld/slurmctld.log
SlurmdSpoolDir=$dir/%n
SlurmdPidFile=$dir/%n/slurmd.pid
SlurmdLogFile=$dir/%n/slurmd.log
SlurmdParameters=config_overrides
# The nodes share /tmp: per-node TmpFS keeps srun --mpi=pmix's client folders
# (TmpFS/spmix_appdir_UID_JOB.STEP) apart.
TmpFS=$dir/%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=5
SlurmctldDebug=info
SlurmdDebug=info
NodeName=$P-n[1-$last] NodeAddr=198.18.$K.[1-$last] CPUs=$cpus State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  # slurmd loads a cgroup plugin even when no other plugin uses it; its
  # autodetection fails in a node, whose /sys (ip netns exec) mounts no
  # cgroup file system. cgroup/v1 named outright loads, and is never used.
  echo "CgroupPlugin=cgroup/v1" >"$dir/cgroup.conf"

  on "$P-n1" slurmctld ||
    die "slurmctld did not start on $P-n1: $(tail -n 3 "$dir/ctld/slurmctld.log" 2>/dev/null)"
  for n in "${list[@]}"; do
    on "$n" slurmd || die "slurmd did not start on $n: $(tail -n 3 "$dir/$n/slurmd.log" 2>/dev/null)"
  done

  # Every node idle before we return (at most 2 minutes).
  local states=""
  for _ in $(seq 1200); do
    states="$(on "$P-n1" sinfo --noheader --Node --format='%N %T' 2>/dev/null || true)"
    if (($(grep -c ' idle$' <<<"$states") == last)); then
      echo "slurm on cluster $P: slurmctld on $P-n1, slurmd on ${list[*]}; SLURM_CONF=$conf"
      return 0
    fi
    sleep 0.1
  done
  die "the nodes are not idle after 30 s: $(tr '\n' ' ' <<<"$states") (logs in $dir)"
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  env) printf 'export SLURM_CONF=%q\n' "$conf" ;;
  exec)
    shift
    (($# >= 1)) || die "usage: testbed.sh exec CMD [ARGS...]"
    [[ -r "$conf" ]] || die "no testbed on cluster $P (testbed.sh up first)"
    # exec all the way down: a signal to this process reaches CMD.
    TS_CLUSTER="$P" TS_CLUSTER_NET="$K" exec "$cluster" exec "$P-n1" env SLURM_CONF="$conf" "$@"
    ;;
  *)
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
