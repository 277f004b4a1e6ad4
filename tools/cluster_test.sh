#!/usr/bin/env bash
# cluster_test.sh — training across two nodes (network namespaces made by
# tools/cluster.sh, DESIGN.md "Several nodes"; Open MPI's remote launch and
# TCP between them) gives the same bits as on one node: llama-tiny with
# generated token shards, 2 nodes x 2 ranks (a hostfile) against 4 ranks on
# this machine, the same flags:
#  1. ZeRO stages 0, 1, 2, 3: the same step lines (losses, learning rates,
#     gradient norms) and a byte-identical final checkpoint (the SHA-256 of
#     every rank file in index.json); every rank ran where the hostfile put
#     it (ranks 0-1 in node n1's network namespace with its hostname, 2-3
#     in n2's), the training's bytes went over n2's cable (its eth0
#     received more than 1 MB: a launch alone moves about 2 KB, these runs
#     2.4 MB with 2 pipeline stages, one a node, 100-330 MB without), and
#     the two-node run printed no line the one-node run did not (numbers
#     aside: no Open MPI warnings);
#  2. 2 pipeline stages (ZeRO-1, --grad-accum 2): the same, bitwise;
#  3. a checkpoint the two nodes saved in the middle (--save-every) resumes
#     on one node (4 ranks, no hostfile) at every stage above: the same step
#     lines from there and a final checkpoint byte-identical to the
#     uninterrupted one-node run's;
#  4. hybrid sharding (--shard-group 2: ZeRO within each node, replicated
#     across the two): ZeRO 0-3 on two nodes give the same step lines and
#     byte-identical final checkpoints, equal to ZeRO-3 hybrid on one node;
#     each run's bytes across nodes per step (rank 0, the metrics) equal
#     `tessera estimate --ranks-per-node 2`'s exactly, plain ZeRO 0-3's
#     too; and hybrid ZeRO-3 sends fewer bytes across nodes than plain
#     ZeRO-3, by the counters and by n2's cable.
# Needs root and network namespaces: without them (tools/cluster.sh check
# fails, e.g. inside a sandbox) it prints one SKIP line and exits 0. Its
# cluster has a name and subnet of its own and is taken down on exit.
#   cluster_test.sh TESSERA_BIN LAUNCH_SH
set -uo pipefail
here="$(dirname "${BASH_SOURCE[0]}")"
fails=0
source "$here/testing.sh"
bin="$(abs "$1")"
launch="$(abs "$2")"
cluster="$(abs "$here/cluster.sh")"
export PATH="$PATH:/usr/sbin:/sbin" # ip (Bazel's PATH is /bin:/usr/bin:/usr/local/bin)
unset SLURM_JOB_ID SLURM_JOBID # Open MPI's mpirun on one node too, never srun (launch.sh)

# cluster.sh refuses nonsense in one line, exit 1, before it touches anything
out="$(TS_CLUSTER= "$cluster" down 2>&1)"
check_eq "cluster.sh: an empty TS_CLUSTER (never the default's cluster)" \
  "1 tools/cluster.sh: TS_CLUSTER=: expected 1-8 lowercase letters and digits, starting with a letter" \
  "$? $out"
out="$(TS_CLUSTER_NET=08 "$cluster" nodes 2>&1)"
check_eq "cluster.sh: TS_CLUSTER_NET=08" \
  "1 tools/cluster.sh: TS_CLUSTER_NET=08: expected 0-255 (decimal, no leading zeros)" "$? $out"

cluster_fixture cluster_test ct 100
((fails == 0)) || {
  echo "$fails failure(s)"
  exit 1
}
# Open MPI's settings for the nodes, for the two-node runs only (this
# machine may have no eth0).
mpienv="$("$cluster" mpirun-env)"
printf '%s slots=2\n%s slots=2\n' "$n1" "$n2" >"$tmp/hostfile"

# Every rank of a two-node run writes its rank, hostname and network
# namespace to $tmp/hosts/rank-R before it becomes tessera.
where_wrapper "$bin" OMPI_COMM_WORLD_RANK

rx() { ip -n "$n2" -s -j link show eth0 | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])'; }

# The lines of a log with numbers and the run's folder taken out, and the
# straggler line (timing: either run may have one) and the bytes by link
# (only runs across nodes have it: section 4 checks it).
shape() {
  grep -v '^straggler: \|^bytes per step per rank by link: ' <<<"$1" |
    sed -E "s#$tmp/[a-z0-9]+#DIR#g; s/[0-9]+([.][0-9]+)?//g"
}

make_token_shards "$tmp/data"
common=(--model llama-tiny --data "$tmp/data" --seq 32 --log-every 1 --micro-batch 2 --steps 4)

# one NAME FLAGS... — 4 ranks on this machine, saving to $tmp/NAME every 2 steps
one() {
  local name="$1"
  shift
  "$launch" -n 4 "$bin" train "${common[@]}" "$@" --save "$tmp/$name" --save-every 2 2>&1
}
# two NAME FLAGS... — 2 ranks on each node (launched from n1), the same
two() {
  local name="$1"
  shift
  rm -rf "$tmp/hosts" && mkdir -p "$tmp/hosts"
  (
    eval "$mpienv"
    "$cluster" exec "$n1" "$launch" -n 4 --hostfile "$tmp/hostfile" "$tmp/where.sh" train \
      "${common[@]}" "$@" --save "$tmp/$name" --save-every 2 --metrics "$tmp/$name.jsonl" 2>&1
  )
}

# same CASE ONE_LOG TWO_LOG ONE TWO RX — the checks of sections 1 and 2
same() {
  local c="$1" o="$2" t="$3"
  check_eq "$c: 4 step lines on one node" 4 "$(steps "$o" | wc -l)"
  check_eq "$c: the same step lines on two nodes" "$(steps "$o")" "$(steps "$t")"
  same_checkpoint "$c: final checkpoint byte-identical" "$tmp/$4/step-00000004" \
    "$tmp/$5/step-00000004"
  check_eq "$c: ranks 0-1 on $n1, 2-3 on $n2" "$where_want" "$(cat "$tmp"/hosts/rank-* 2>/dev/null)"
  check_eq "$c: over $n2's eth0 (more than 1 MB)" 1 "$(($6 > 1000000))"
  check_eq "$c: no other lines on two nodes" "$(shape "$o")" "$(shape "$t")"
}

# resumed CASE FLAGS... — section 3: two-node run "two-CASE"'s step 2 on one node
resumed() {
  local c="$1" r
  shift
  r="$("$launch" -n 4 "$bin" train "${common[@]}" "$@" --resume "$tmp/two-$c/step-00000002" \
    --save "$tmp/res-$c" 2>&1)"
  check_eq "$c: resumed on one node: exit" 0 $?
  check "$c: resumed on one node: says so" "resumed from step 2" "$r"
  check_eq "$c: resumed: steps 3-4 as uninterrupted" "$(steps "$(cat "$tmp/one-$c.log")" | tail -n 2)" \
    "$(steps "$r")"
  check_eq "$c: resumed: final checkpoint byte-identical" "$(shas "$tmp/one-$c/step-00000004")" \
    "$(shas "$tmp/res-$c/step-00000004")"
}

# 1-2. ZeRO 0-3 and 2 pipeline stages, one node and two
cases=(zero0 zero1 zero2 zero3 pipe)
declare -A flags=([zero0]="--zero 0" [zero1]="--zero 1" [zero2]="--zero 2" [zero3]="--zero 3"
  [pipe]="--zero 1 --pipeline 2 --grad-accum 2")
for c in "${cases[@]}"; do
  read -ra f <<<"${flags[$c]}"
  o="$(one "one-$c" "${f[@]}")"
  check_eq "$c: one node: exit" 0 $?
  printf '%s\n' "$o" >"$tmp/one-$c.log"
  before="$(rx)"
  t="$(two "two-$c" "${f[@]}")"
  check_eq "$c: two nodes: exit" 0 $?
  rx_now=$(($(rx) - before))
  [[ "$c" == zero3 ]] && rx_z3=$rx_now
  same "$c" "$o" "$t" "one-$c" "two-$c" $rx_now
done

# 3. the two nodes' step-2 checkpoints on one node
for c in "${cases[@]}"; do
  read -ra f <<<"${flags[$c]}"
  resumed "$c" "${f[@]}"
done

# 4. hybrid sharding across the two nodes
# across RUN — rank 0's bytes to the other node in the last step (metrics)
across() { python3 -c 'import json,sys; print(int(json.loads(open(sys.argv[1]).readlines()[-1])["summary"]["comm_bytes_across_nodes_per_step"]))' "$tmp/$1.jsonl" 2>/dev/null; }
# planned FLAGS... — estimate's bytes across nodes per step, 2 ranks per node
planned() {
  "$bin" estimate --model llama-tiny -n 4 --seq 32 --micro-batch 2 --ranks-per-node 2 --json "$@" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["stages"][0]["comm_bytes_across_nodes_per_step"])'
}
for z in 0 1 2 3; do
  check_eq "zero$z: bytes across nodes = estimate's" "$(planned --zero $z)" "$(across "two-zero$z")"
done
o="$(one one-hy3 --zero 3 --shard-group 2)"
check_eq "hybrid zero3: one node: exit" 0 $?
rx_hy=0
for z in 0 1 2 3; do
  before="$(rx)"
  t="$(two "two-hy$z" --zero $z --shard-group 2)"
  check_eq "hybrid zero$z: two nodes: exit" 0 $?
  ((z == 3)) && rx_hy=$(($(rx) - before))
  check "hybrid zero$z: says so" "hybrid sharding: ZeRO within 2 groups of 2 consecutive ranks" "$t"
  check_eq "hybrid zero$z: the step lines of hybrid zero3 on one node" "$(steps "$o")" "$(steps "$t")"
  same_checkpoint "hybrid zero$z: final checkpoint byte-identical to one node's" \
    "$tmp/one-hy3/step-00000004" "$tmp/two-hy$z/step-00000004"
  check_eq "hybrid zero$z: bytes across nodes = estimate's" \
    "$(planned --zero $z --shard-group 2)" "$(across "two-hy$z")"
done
a_hy="$(across two-hy3)" a_z3="$(across two-zero3)"
check_eq "hybrid zero3 sends fewer bytes across nodes than zero3 ($a_hy < $a_z3)" 1 \
  "$((${a_hy:-0} > 0 && ${a_hy:-0} < ${a_z3:-0}))"
check_eq "hybrid zero3: fewer bytes on n2's cable than zero3 ($rx_hy < $rx_z3)" 1 \
  "$((rx_hy > 0 && rx_hy < rx_z3))"

echo "$fails failure(s)"
((fails == 0))
