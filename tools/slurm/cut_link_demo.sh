#!/usr/bin/env bash
# cut_link_demo.sh — a 2-node job launched by sbatch trains llama-small at
# ZeRO-3, survives a cut link by restarting from its checkpoint, and
# finishes byte-identical to an uninterrupted run (issue "Across nodes for
# real", done-when), on this machine's namespace nodes and test SLURM:
#  1. the uninterrupted run: 4 ranks under mpirun on this machine, 12 steps,
#     a checkpoint every 2;
#  2. tools/cluster.sh up 2 and tools/slurm/testbed.sh up (cluster "dw");
#  3. sbatch tools/slurm/train.sbatch, 2 nodes x 2 tasks through launch
#     (TESSERA_MAX_RESTARTS=1), --comm-timeout 10; once its step-6
#     checkpoint is complete, node 2's link goes down for 15 s;
#  4. the job's watchdog lines, launch's restart line, and whether its
#     final checkpoint and last step lines equal the uninterrupted run's.
# Root; run from the repository root after `bazel build //tools:tessera`;
# DATA is token shards for a 4096-token vocabulary [data/kjv, from
# ./tessera demo]. Takes about 2 minutes on 2 cores. Exit 0 when equal.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export TESSERA_HOME="$PWD" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export TS_CLUSTER=dw TS_CLUSTER_NET=77
data="$(cd "${DATA:-data/kjv}" && pwd)" || exit 1
out="$(mktemp -d /tmp/cut_link_demo.XXXXXX)"
bin="$out/tessera"
cp bazel-bin/tools/tessera "$bin" || exit 1
trap 'tools/slurm/testbed.sh down >/dev/null 2>&1; tools/cluster.sh down >/dev/null 2>&1' EXIT
flags=(--model llama-small --data "$data" --seq 128 --micro-batch 2 --zero 3 --steps 12
  --save-every 2 --log-every 1)

t0=$SECONDS
OMP_NUM_THREADS=1 tools/launch.sh -n 4 "$bin" train "${flags[@]}" --save "$out/whole" \
  >"$out/whole.log" 2>&1
echo "uninterrupted (one node, mpirun): exit $? in $((SECONDS - t0)) s"
tools/cluster.sh up 2 && tools/slurm/testbed.sh up || exit 1
t0=$SECONDS
TESSERA_BIN="$bin" TESSERA_DATA="$data" TESSERA_MODEL=llama-small TESSERA_STEPS=12 \
  TESSERA_SEQ=128 TESSERA_MICRO_BATCH=2 TESSERA_ZERO=3 TESSERA_MAX_RESTARTS=1 \
  tools/slurm/testbed.sh exec sbatch --wait --quiet --output="$out/cut.out" \
  tools/slurm/train.sbatch --log-every 1 --comm-timeout 10 --save "$out/cut" --save-every 2 &
job=$!
until [[ -e "$out/cut/step-00000006/index.json" ]]; do sleep 0.05; done
tools/cluster.sh link dw-n2 down
cut=$SECONDS
echo "cut dw-n2's link $((cut - t0)) s into the job"
sleep 15
tools/cluster.sh link dw-n2 up
echo "link up again $((SECONDS - cut)) s after the cut"
wait "$job"
echo "sbatch --wait: exit $? after $((SECONDS - t0)) s"
grep -E "comm timeout|tessera launch|resumed|^trained" "$out/cut.out"
source tools/testing.sh
a="$(shas "$out/whole/step-00000012")" b="$(shas "$out/cut/step-00000012")"
steps_of() { steps "$(cat "$1")" | tail -n 6; }
if [[ -n "$a" && "$a" == "$b" ]] && [[ "$(steps_of "$out/whole.log")" == "$(steps_of "$out/cut.out")" ]]; then
  echo "final checkpoints byte-identical, last 6 step lines equal ($out)"
  exit 0
fi
echo "DIFFERENT: see $out"
exit 1
