#!/usr/bin/env bash
# cluster.sh — a multi-node cluster on one machine, for tests (DESIGN.md
# "Several nodes"): each "node" is a network namespace with its own
# hostname (a UTS namespace per command) and one address on a bridge.
#
#   tools/cluster.sh check                 can namespaces be made here? (0, else 1 and why)
#   tools/cluster.sh up [NODES]            make NODES nodes (default 2); replaces a cluster
#                                          of the same name
#   tools/cluster.sh down                  stop every process in them, delete them
#   tools/cluster.sh exec NODE CMD [ARG..] run CMD on NODE (its network, its hostname)
#   tools/cluster.sh rsh [-opts] NODE CMD  Open MPI's remote launcher (plm_rsh_agent):
#                                          like ssh, CMD's words are joined and run by sh
#   tools/cluster.sh link NODE up|down     bring NODE's only link up or down (a cut cable)
#   tools/cluster.sh shape NODE RATE|off   NODE sends at most RATE (tc's units: 1gbit,
#                                          200mbit) through its link (a token bucket, tc
#                                          tbf, on its eth0); off removes it. Latency
#                                          cannot be added where the kernel lacks netem
#   tools/cluster.sh nodes                 the node names, one per line
#   tools/cluster.sh mpirun-env            Open MPI settings that launch across the nodes
#                                          (eval "$(tools/cluster.sh mpirun-env)")
#
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2, util-linux.
#
# Layout, for TS_CLUSTER=P (default "tscl", at most 8 characters) and
# TS_CLUSTER_NET=K (0-255, default 0): nodes are the namespaces P-n1 ..
# P-nN, whose hostnames are the same names; node i has eth0 with address
# 198.18.K.i/24, a veth whose other end sits on bridge br0 in the namespace
# P-sw (a switch: no address). 198.18.0.0/15 is reserved for network
# benchmarks (RFC 2544): the addresses exist only inside these namespaces,
# and nothing outside them is reachable from a node (no route, no NAT).
# Names resolve through /etc/netns/P-nI/hosts, which `ip netns exec` binds
# over /etc/hosts inside the node. Several clusters (distinct P and K) can
# exist at once, e.g. one per test.
set -euo pipefail

P="${TS_CLUSTER-tscl}" # set but empty is refused, never the default's cluster
K="${TS_CLUSTER_NET-0}"

die() {
  echo "tools/cluster.sh: $*" >&2
  exit 1
}

[[ "$P" =~ ^[a-z][a-z0-9]{0,7}$ ]] ||
  die "TS_CLUSTER=$P: expected 1-8 lowercase letters and digits, starting with a letter"
[[ "$K" =~ ^(0|[1-9][0-9]{0,2})$ ]] && ((K <= 255)) ||
  die "TS_CLUSTER_NET=$K: expected 0-255 (decimal, no leading zeros)"

sw="$P-sw"

# Every namespace's name, one per line. `ip netns list` says "Error: Peer
# netns reference is invalid." for a namespace another cluster is making
# at that moment (its file exists, its mount not yet): not ours, not said.
ns_names() {
  ip netns list 2>/dev/null | awk '{print $1}' || true
}

# Whether namespace $1 exists.
has_ns() {
  grep -qx -- "$1" <<<"$(ns_names)"
}

# The namespaces of this cluster's nodes, in order.
node_list() {
  ns_names | grep -E "^$P-n[0-9]+$" | sort -t n -k 2 -V || true
}

# Dies unless $1 is a node of this cluster.
need_node() {
  [[ "$1" =~ ^$P-n[0-9]+$ ]] && has_ns "$1" && return 0
  local nodes
  nodes="$(node_list | tr '\n' ' ' | sed 's/ $//')"
  die "$1: not a node of cluster $P (${nodes:+nodes: }${nodes:-it has none: tools/cluster.sh up first})"
}

# Why namespaces cannot be made here, or nothing.
why_not() {
  [[ "$(id -u)" == 0 ]] || {
    echo "not root (network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    return
  }
  command -v ip >/dev/null || {
    echo "iproute2's ip is not installed"
    return
  }
  command -v unshare >/dev/null || {
    echo "util-linux's unshare is not installed"
    return
  }
  local probe="$P-probe$$" out
  if ! out="$(ip netns add "$probe" 2>&1)"; then
    echo "ip netns add failed: $out"
    return
  fi
  if ! out="$(ip netns exec "$probe" unshare --uts sh -c 'hostname probe && ip link set lo up' 2>&1)"; then
    ip netns del "$probe" 2>/dev/null || true
    echo "a command cannot enter a namespace: $out"
    return
  fi
  ip netns del "$probe"
}

# Kills every process in namespace $1 (SIGSTOP'd ones too) and deletes it.
ns_delete() {
  local pids
  pids="$(ip netns pids "$1" 2>/dev/null || true)"
  if [[ -n "$pids" ]]; then
    kill -KILL $pids 2>/dev/null || true
    for _ in $(seq 50); do
      [[ -z "$(ip netns pids "$1" 2>/dev/null || true)" ]] && break
      sleep 0.1
    done
  fi
  ip netns del "$1" 2>/dev/null || true
}

cmd_down() {
  local n
  for n in $(node_list); do
    ns_delete "$n"
    rm -rf "/etc/netns/$n"
  done
  if has_ns "$sw"; then ns_delete "$sw"; fi
  rmdir /etc/netns 2>/dev/null || true
}

# Node $1's cable: a veth pair made here under names of this cluster's
# own, its ends moved into node $1 (as eth0) and the switch (as n$2).
# Naming both namespaces in one `ip link add` fails now and then ("Peer
# netns reference is invalid") while other clusters are being made or
# deleted; a failed try is undone and retried, and its message kept back
# (said only if every try fails).
cable() {
  local a="${P}a$2" b="${P}b$2" try err=""
  for try in 1 2 3 4 5; do
    ip link del "$a" 2>/dev/null || true
    if err="$({ ip link add "$a" type veth peer name "$b" && ip link set "$a" netns "$1" &&
      ip link set "$b" netns "$sw" && ip -n "$1" link set "$a" name eth0 &&
      ip -n "$sw" link set "$b" name "n$2"; } 2>&1)"; then
      return 0
    fi
    ip -n "$1" link del "$a" 2>/dev/null || ip link del "$a" 2>/dev/null || true
    sleep 0.2
  done
  die "up: cannot cable node $1 to the switch (try $try): $(tr '\n' ' ' <<<"$err")"
}

cmd_up() {
  local nodes="${1:-2}"
  [[ "$nodes" =~ ^[0-9]+$ ]] && ((nodes >= 1 && nodes <= 250)) || die "up $nodes: expected 1-250 nodes"
  local why
  why="$(why_not)"
  [[ -z "$why" ]] || die "cannot make a cluster here: $why"
  cmd_down
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  local hosts="127.0.0.1 localhost"$'\n' i
  for ((i = 1; i <= nodes; i++)); do
    hosts+="198.18.$K.$i $P-n$i"$'\n'
  done
  for ((i = 1; i <= nodes; i++)); do
    local n="$P-n$i"
    ip netns add "$n"
    mkdir -p "/etc/netns/$n"
    printf '%s' "$hosts" >"/etc/netns/$n/hosts"
    echo "$n" >"/etc/netns/$n/hostname"
    cable "$n" "$i"
    ip -n "$sw" link set "n$i" master br0 up
    ip -n "$n" link set lo up
    ip -n "$n" addr add "198.18.$K.$i/24" dev eth0
    ip -n "$n" link set eth0 up
  done
  # Every node reaches every other before we return.
  for ((i = 2; i <= nodes; i++)); do
    local ok=0
    for _ in $(seq 50); do
      # A TCP connect to a closed port: "refused" proves the path works.
      local out
      out="$(ip netns exec "$P-n1" timeout 2 bash -c "exec 3<>/dev/tcp/198.18.$K.$i/9" 2>&1 || true)"
      if [[ "$out" == *refused* ]]; then
        ok=1
        break
      fi
      sleep 0.1
    done
    ((ok)) || die "up: $P-n1 cannot reach $P-n$i (198.18.$K.$i)"
  done
  echo "cluster $P: $nodes nodes ($(node_list | tr '\n' ' ' | sed 's/ $//')) on 198.18.$K.0/24"
}

# Runs "$@" on node $1 with its hostname, in a UTS namespace of its own.
cmd_exec() {
  (($# >= 2)) || die "usage: cluster.sh exec NODE CMD [ARGS...]"
  local node="$1"
  shift
  need_node "$node"
  exec ip netns exec "$node" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$node" "$@"
}

# Open MPI's plm_rsh_agent: [options] HOST WORDS...; WORDS joined and run
# by sh on HOST, as ssh runs them by the remote shell.
cmd_rsh() {
  while (($#)) && [[ "$1" == -* ]]; do shift; done
  (($# >= 2)) || die "usage: cluster.sh rsh NODE CMD..."
  local node="$1"
  shift
  cmd_exec "$node" sh -c "$*"
}

cmd_link() {
  (($# == 2)) && [[ "$2" == up || "$2" == down ]] || die "usage: cluster.sh link NODE up|down"
  need_node "$1"
  ip -n "$1" link set eth0 "$2"
}

cmd_shape() {
  (($# == 2)) && [[ "$2" == off || "$2" =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]] ||
    die "usage: cluster.sh shape NODE RATE|off (RATE as tc writes it: 1gbit, 200mbit, 50mbps)"
  need_node "$1"
  ip netns exec "$1" tc qdisc del dev eth0 root 2>/dev/null || true
  [[ "$2" == off ]] && return 0
  # a bucket of 256 KB (a few TSO bursts), up to 400 ms of queue
  ip netns exec "$1" tc qdisc add dev eth0 root tbf rate "$2" burst 256kb latency 400ms ||
    die "tc could not shape $1's eth0 to $2"
}

case "${1:-}" in
  check)
    why="$(why_not)"
    if [[ -n "$why" ]]; then
      echo "network namespaces cannot be made here: $why"
      exit 1
    fi
    echo "network namespaces can be made here"
    ;;
  up)
    shift
    cmd_up "$@"
    ;;
  down) cmd_down ;;
  exec)
    shift
    cmd_exec "$@"
    ;;
  rsh)
    shift
    cmd_rsh "$@"
    ;;
  link)
    shift
    cmd_link "$@"
    ;;
  shape)
    shift
    cmd_shape "$@"
    ;;
  nodes) node_list ;;
  mpirun-env)
    # Open MPI's settings that launch across the nodes, as shell exports: the
    # remote launcher is this script; TCP only between nodes, on eth0.
    printf 'export OMPI_MCA_plm_rsh_agent=%q\n' "$(readlink -f "$0") rsh"
    echo "export OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0"
    ;;
  *)
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
