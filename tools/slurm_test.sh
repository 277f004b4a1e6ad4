#!/usr/bin/env bash
# slurm_test.sh — training under a real SLURM (slurmctld, a slurmd per node,
# munged: tools/slurm/testbed.sh on network-namespace nodes made by
# tools/cluster.sh, DESIGN.md "Several nodes") gives the same losses as
# mpirun on one node: llama-tiny with generated token shards, ZeRO-3, 4
# ranks, against `tools/launch.sh -n 4` on this machine:
#  1. the testbed comes up: sinfo shows both nodes idle;
#  2. sbatch --wait tools/slurm/train.sbatch (2 nodes x 2 tasks, srun
#     --mpi=pmix): exit 0, one world of 4 ranks, the same step lines, ranks
#     0-1 on node n1 (its hostname and network namespace), 2-3 on n2;
#  3. `tessera launch -n 4` inside an allocation (salloc) starts the ranks
#     with srun: the same step lines, the same placement;
#  4. faults through launch in an allocation (its steps fence on Slurm's
#     ring, SLURM_PMIX_FENCE=ring): a rank that exits 3 makes
#     launch exit 3 with none of srun's lines; a rank killed (SIGKILL) is
#     one line naming the rank and its host, exit 137; with --max-restarts 1
#     and --save the job restarts from the newest checkpoint and ends with
#     the uninterrupted run's step lines; SIGTERM to launch saves at the
#     next step boundary and exits 5 (preempted);
#  4b. a lost report: every task ends (exit 0) while node 2's link is down
#     (until 3 s after the last task's end), so its slurmstepd may fail to
#     tell srun ("Failed to send MESSAGE_TASK_EXIT"; whether slurmctld
#     tells it later depends on timing): launch ends with exit 0 within the
#     test's 2 minutes either way — when srun was left waiting, by
#     stopping it once slurmctld had ended the step (its one line) and
#     restarting (--max-restarts 1);
#  4c. `launch --nodes 1:2` in an allocation: node 2's link cut -> the job
#     goes on on node 1, and grows back to both when the link returns;
#  5. the issue's done-when, on llama-tiny: sbatch of train.sbatch with
#     TESSERA_MAX_RESTARTS=2, --comm-timeout 5 and --save: node 2's link
#     cut once the step-4 checkpoint is complete and brought back once
#     every rank has ended; the job restarts, resumes, and its final
#     checkpoint is byte-identical to an uninterrupted run's on one node.
#     Which side ends the first run depends on timing: the watchdog (exit
#     4, its lines name the other node's ranks), or Open MPI aborting a
#     rank whose interface is down, whose node then cannot tell srun that
#     its tasks ended (launch stops srun once slurmctld has ended the step);
#  5b. preemption: SIGUSR1 to every task of a train.sbatch job (scancel
#     --signal, as --signal=USR1@90 sends it) saves and exits 5; the script
#     requeues the job, which resumes and ends byte-identical to an
#     uninterrupted run;
#  6. testbed down leaves no daemon running and no folder.
# Needs root, network namespaces and Debian's slurmctld, slurmd,
# slurm-client and munge: without them it prints one SKIP line and exits 0.
# Its cluster has a name and subnet of its own and is taken down on exit.
#   slurm_test.sh TESSERA_BIN LAUNCH_SH TESSERA_TESTING_BIN
set -uo pipefail
here="$(dirname "${BASH_SOURCE[0]}")"
fails=0
source "$here/testing.sh"
bin="$(abs "$1")"
launch="$(abs "$2")"
testing_bin="$(abs "$3")" # tessera with the test seam (its slow rank)
cluster="$(abs "$here/cluster.sh")"
testbed="$(abs "$here/slurm/testbed.sh")"
sbatch_script="$(abs "$here/slurm/train.sbatch")"
export PATH="$PATH:/usr/sbin:/sbin" # ip, slurmd, munged (Bazel's PATH is /bin:/usr/bin:/usr/local/bin)
unset SLURM_JOB_ID SLURM_JOBID      # the one-node reference runs under mpirun

for b in munged mungekey slurmctld slurmd sbatch salloc srun sinfo; do
  command -v "$b" >/dev/null || {
    echo "SKIP: slurm_test: $b is not installed (tools/setup.sh installs slurmctld, slurmd, slurm-client, munge)"
    exit 0
  }
done
# 1. the cluster and SLURM on it
testbed_down() { "$testbed" down; }
cluster_on_exit=testbed_down
cluster_fixture slurm_test sl 150
up="$("$testbed" up 2>&1)"
check_eq "testbed up: exit" 0 $?
check "testbed up: says so" "slurm on cluster $TS_CLUSTER: slurmctld on $n1, slurmd on $n1 $n2" "$up"
check_eq "sinfo: both nodes idle" "$n1 idle
$n2 idle" "$("$testbed" exec sinfo --noheader --Node --format='%N %T' 2>&1)"
((fails == 0)) || {
  echo "$fails failure(s)"
  exit 1
}
# A SLURM client command on node 1; a job that cannot start fails the test
# in 2 minutes instead of waiting forever.
# Each job has Open MPI scratch folders of its own (the ranks' session and
# shared-memory files): a finished job's late clean-up cannot touch the next.
sl() {
  local d
  d="$(mktemp -d "$scratch/job.XXXXXX")"
  TMPDIR="$d" OMPI_MCA_orte_tmpdir_base="$d" OMPI_MCA_btl_vader_backing_directory="$d" \
    timeout "${SL_TIMEOUT:-120}" "$testbed" exec "$@"
}

# Every rank writes its rank, hostname and network namespace to
# $tmp/hosts/rank-R, then becomes tessera.
where_wrapper "$bin" SLURM_PROCID
where() { cat "$tmp"/hosts/rank-* 2>/dev/null; }

make_token_shards "$tmp/data"
common=(--model llama-tiny --data "$tmp/data" --seq 32 --micro-batch 2 --zero 3 --log-every 1)

# The reference: 4 ranks under mpirun on this machine.
ref="$("$launch" -n 4 "$bin" train "${common[@]}" --steps 4 2>&1)"
check_eq "one node: exit" 0 $?
check_eq "one node: 4 step lines" 4 "$(steps "$ref" | wc -l)"
ref6="$("$launch" -n 4 "$bin" train "${common[@]}" --steps 6 2>&1)"
check_eq "one node, 6 steps: exit" 0 $?

# 2. sbatch --wait train.sbatch, 2 nodes x 2 tasks
rm -rf "$tmp/hosts" && mkdir "$tmp/hosts"
out="$(TESSERA_BIN="$tmp/where.sh" TESSERA_DATA="$tmp/data" TESSERA_STEPS=4 TESSERA_SEQ=32 \
  TESSERA_MICRO_BATCH=2 TESSERA_ZERO=3 \
  sl sbatch --wait --quiet --output="$tmp/sbatch.out" "$sbatch_script" --log-every 1 2>&1)"
check_eq "sbatch --wait: exit" 0 $?
check_eq "sbatch: nothing on sbatch's own output" "" "$out"
job="$(cat "$tmp/sbatch.out" 2>/dev/null)"
check "sbatch: one world of 4 ranks" "ZeRO stage 3 on 4 ranks" "$job"
check_eq "sbatch: the same step lines" "$(steps "$ref")" "$(steps "$job")"
check_eq "sbatch: ranks 0-1 on $n1, 2-3 on $n2" "$where_want" "$(where)"

# 3. tessera launch inside an allocation: srun
rm -rf "$tmp/hosts" && mkdir "$tmp/hosts"
out="$(sl salloc --quiet --nodes=2 --ntasks-per-node=2 \
  "$launch" -n 4 "$tmp/where.sh" train "${common[@]}" --steps 4 2>&1)"
check_eq "launch in salloc: exit" 0 $?
check "launch in salloc: one world of 4 ranks" "ZeRO stage 3 on 4 ranks" "$out"
check_eq "launch in salloc: the same step lines" "$(steps "$ref")" "$(steps "$out")"
check_eq "launch in salloc: ranks 0-1 on $n1, 2-3 on $n2" "$where_want" "$(where)"

# 4. faults through launch in an allocation
alloc() { sl salloc --quiet --nodes=2 --ntasks-per-node=2 "$@"; }
# launch's steps fence on Slurm's ring (the mixed default crashed ranks in
# MPI_Init, tools/launch.sh); the steps' environment is what the PMIx
# plugin of each node's slurmstepd reads.
out="$(alloc "$launch" -n 4 sh -c 'echo "fence $SLURM_PMIX_FENCE"' 2>&1)"
check_eq "launch's steps: SLURM_PMIX_FENCE=ring on every rank" "$(printf 'fence ring\n%.0s' 1 2 3 4)" "$out"
out="$(alloc "$launch" -n 4 sh -c '[ "$SLURM_PROCID" = 2 ] && exit 3; exec sleep 30' 2>&1)"
check_eq "rank 2 exits 3: launch exits 3" 3 $?
check_eq "rank 2 exits 3: none of srun's lines" "" "$out"
out="$(alloc "$launch" -n 4 sh -c '[ "$SLURM_PROCID" = 1 ] && kill -KILL $$; exec sleep 30' 2>&1)"
check_eq "rank 1 killed: exit 137" 137 $?
check_eq "rank 1 killed: one line" \
  "tessera launch: rank 1 on host $n1 died: signal 9 (Killed); every rank was stopped" "$out"

# Rank 2 (on n2) is killed once the first checkpoint is complete, in the
# first run only (a watcher beside the rank, which ends with it): launch
# restarts the job, which resumes from the newest checkpoint.
cat >"$tmp/kill2.sh" <<EOF
#!/bin/sh
if [ "\$SLURM_PROCID" = 2 ] && mkdir $(printf %q "$tmp/killed") 2>/dev/null; then
  (
    while kill -0 \$\$ 2>/dev/null && [ ! -e $(printf %q "$tmp/rs/step-00000002/index.json") ]; do sleep 0.05; done
    kill -KILL \$\$ 2>/dev/null
  ) &
fi
exec $(printf %q "$bin") "\$@"
EOF
chmod +x "$tmp/kill2.sh"
out="$(alloc "$launch" -n 4 --max-restarts 1 "$tmp/kill2.sh" train "${common[@]}" --steps 6 \
  --save "$tmp/rs" --save-every 2 2>&1)"
check_eq "restart: exit" 0 $?
check "restart: names the rank" \
  "tessera launch: rank 2 on host $n2 died: signal 9 (Killed); every rank was stopped" "$out"
check "restart: restarts" "restart 1 of 1 from the newest complete checkpoint" "$out"
check "restart: resumes" "resumed from step " "$out"
last="$(steps "$out" | tail -n 1)"
check_eq "restart: ends with the uninterrupted run's last step" "$(steps "$ref6" | tail -n 1)" "$last"

cat >"$tmp/sigterm.sh" <<EOF
#!/bin/bash
$(printf %q "$launch") -n 4 $(printf %q "$bin") train ${common[*]} --steps 100000 \
  --save $(printf %q "$tmp/sig") >$(printf %q "$tmp/sig.log") 2>&1 &
pid=\$!
for _ in \$(seq 1200); do grep -q '^step' $(printf %q "$tmp/sig.log") && break; sleep 0.1; done
kill -TERM \$pid
wait \$pid
EOF
alloc bash "$tmp/sigterm.sh"
check_eq "SIGTERM: exit 5 (preempted)" 5 $?
check "SIGTERM: saved" "on SIGTERM: saved $tmp/sig/step-" "$(cat "$tmp/sig.log")"

# 4b. a lost report: the tasks end while n2's link is down
cat >"$tmp/lost.sh" <<EOF
#!/bin/sh
if mkdir $(printf %q "$tmp")/lost-\$SLURM_PROCID 2>/dev/null; then
  while [ ! -e $(printf %q "$tmp/lost-go") ]; do sleep 0.05; done
  : >$(printf %q "$tmp")/lost-end-\$SLURM_PROCID
fi
exit 0
EOF
chmod +x "$tmp/lost.sh"
alloc "$launch" -n 4 --max-restarts 1 "$tmp/lost.sh" >"$tmp/lost.log" 2>&1 &
job=$!
for _ in $(seq 600); do # the four tasks started: then cut, and end them
  [[ "$(ls -d "$tmp"/lost-? 2>/dev/null | wc -l)" == 4 ]] && break
  sleep 0.05
done
"$cluster" link "$n2" down
touch "$tmp/lost-go"
# The link stays down until every task has ended (each says so last; at
# most 60 s), and 3 s more for n2's slurmstepd to try to report them: the
# tasks end inside the outage however slow a loaded machine makes them.
for _ in $(seq 1200); do
  [[ "$(ls "$tmp"/lost-end-? 2>/dev/null | wc -l)" == 4 ]] && break
  sleep 0.05
done
check_eq "lost report: every task ended while n2's link was down" 4 \
  "$(ls "$tmp"/lost-end-? 2>/dev/null | wc -l)"
sleep 3
"$cluster" link "$n2" up
wait "$job"
check_eq "lost report: launch ends (restarted)" 0 $?
out="$(cat "$tmp/lost.log")"
if [[ -n "$out" ]]; then # srun was left waiting: launch stopped it
  check_eq "lost report: the line, the restart" "tessera launch: the job step ended but srun did \
not hear from every node within 10 s (a node's report was lost); every rank was stopped
tessera launch: a rank died (exit 137); restart 1 of 1 from the newest complete checkpoint" \
    "$(grep -v '^tessera launch: ranks\? [0-9,-]* on host .* died: ' <<<"$out")"
fi

# 4c. launch --nodes 1:2 in the allocation: node 2's link cut once the
# step-4 checkpoint is complete -> the job goes on on node 1 (srun's steps
# --overlap, beside a step that may linger for the lost node), then grows
# back to both nodes when the link returns; one line each, exit 0 (rank 0
# sleeps 50 ms a micro-step, the test seam: the job outlasts the return).
cat >"$tmp/elastic.sh" <<EOF
#!/bin/sh
export TESSERA_NODE_POLL=1 TESSERA_PROBE_TIMEOUT=5 TESSERA_TEST_SLOW=0:50
exec $(printf %q "$launch") --nodes 1:2 --max-restarts 2 $(printf %q "$testing_bin") train ${common[*]} \
  --steps 200 --save $(printf %q "$tmp/sel") --save-every 2 --comm-timeout 5 \
  >$(printf %q "$tmp/sel.log") 2>&1
EOF
SL_TIMEOUT=240 alloc bash "$tmp/elastic.sh" &
job=$!
for _ in $(seq 2400); do [[ -e "$tmp/sel/step-00000004/index.json" ]] && break; sleep 0.05; done
"$cluster" link "$n2" down
for _ in $(seq 1200); do grep -q "lost (exit" "$tmp/sel.log" 2>/dev/null && break; sleep 0.1; done
from="$(grep "lost (exit" "$tmp/sel.log" | sed -n 's/.*resuming from step \([0-9]*\) .*/\1/p')"
for _ in $(seq 1200); do
  [[ -e "$(printf '%s/sel/step-%08d/index.json' "$tmp" $((${from:-0} + 2)))" ]] && break
  sleep 0.1
done
"$cluster" link "$n2" up
wait "$job"
check_eq "--nodes 1:2 under SLURM: the job finished" 0 $?
log="$(cat "$tmp/sel.log")"
check "--nodes 1:2 under SLURM: the start" "tessera launch: --nodes 1:2: 2 of 2 nodes answer: world 4 ranks on $n1 $n2 (pipeline 1 x dp 4), micro-batch x accumulation 2 x 1" "$log"
check "--nodes 1:2 under SLURM: shrunk to node 1" "world 4 -> 2 ranks on $n1 (pipeline 1 x dp 2), micro-batch x accumulation 2 x 1 -> 2 x 2, resuming from step " "$(grep "node $n2 lost (exit" <<<"$log")"
check "--nodes 1:2 under SLURM: grown back" "tessera launch: node $n2 answers again: world 2 -> 4 ranks on $n1 $n2 (pipeline 1 x dp 4), micro-batch x accumulation 2 x 2 -> 2 x 1, resuming from step " "$log"

# 5. a cut link under sbatch: the restart in the allocation
"$launch" -n 4 "$bin" train "${common[@]}" --steps 12 --save "$tmp/whole" --save-every 2 \
  >/dev/null 2>&1
check_eq "one node, 12 steps saved: exit" 0 $?
TESSERA_LAUNCH="$launch" TESSERA_BIN="$bin" TESSERA_DATA="$tmp/data" TESSERA_STEPS=12 \
  TESSERA_SEQ=32 TESSERA_MICRO_BATCH=2 TESSERA_ZERO=3 TESSERA_MAX_RESTARTS=2 \
  sl sbatch --wait --quiet --output="$tmp/cut.out" "$sbatch_script" --log-every 1 \
  --comm-timeout 5 --save "$tmp/cut" --save-every 2 >/dev/null 2>&1 &
job=$!
for _ in $(seq 2400); do # the step-4 checkpoint complete: then cut
  [[ -e "$tmp/cut/step-00000004/index.json" ]] && break
  sleep 0.05
done
check_eq "cut link under sbatch: the step-4 checkpoint before the cut" 1 \
  "$([[ -e "$tmp/cut/step-00000004/index.json" ]] && echo 1)"
mapfile -t ranks < <(rank_pids "$bin" "$tmp/cut")
check_eq "cut link under sbatch: the job's 4 ranks run at the cut" 4 "${#ranks[@]}"
"$cluster" link "$n2" down
# The link stays down until every rank has ended (their watchdogs, or Open
# MPI; at most 2 minutes): a fixed outage would race the timeout on a
# loaded machine.
for _ in $(seq 1200); do
  (($(alive ${ranks[@]+"${ranks[@]}"}))) || break
  sleep 0.1
done
check_eq "cut link under sbatch: every rank ended while the link was down" 0 \
  "$(alive ${ranks[@]+"${ranks[@]}"})"
"$cluster" link "$n2" up
wait "$job"
check_eq "cut link under sbatch: the job finished" 0 $?
log="$(cat "$tmp/cut.out" 2>/dev/null)"
check "cut link under sbatch: restarted" "; restart 1 of 2 from the newest complete checkpoint" "$log"
if [[ "$log" == *"a peer stopped answering (exit 4); restart"* ]]; then
  check "cut link under sbatch: the watchdog's lines name the other node" "did not arrive:" "$log"
fi
check "cut link under sbatch: resumed" "resumed from step " "$log"
same_checkpoint "cut link under sbatch: final checkpoint byte-identical to the uninterrupted run's" \
  "$tmp/whole/step-00000012" "$tmp/cut/step-00000012"

# 5b. preemption under sbatch: SIGUSR1 to every task (SLURM's
# --signal=USR1@90 ahead of a preemption) once the step-4 checkpoint is
# complete: the ranks save and exit 5, train.sbatch requeues the job, which
# (the same job id) resumes from the newest checkpoint and ends
# byte-identical to the uninterrupted run. Slurm holds a requeued job for
# its credentials' life before it may run again (the test bed's
# cred_expire, 30 s).
# (sbatch --wait is no use here: it may return 1 at the requeue.)
jid="$(TESSERA_LAUNCH="$launch" TESSERA_BIN="$bin" TESSERA_DATA="$tmp/data" TESSERA_STEPS=12 \
  TESSERA_SEQ=32 TESSERA_MICRO_BATCH=2 TESSERA_ZERO=3 \
  sl sbatch --parsable --open-mode=append --output="$tmp/pre.out" --job-name=tessera-pre \
  "$sbatch_script" --log-every 1 --save "$tmp/pre" --save-every 2 2>&1)"
for _ in $(seq 2400); do
  [[ -e "$tmp/pre/step-00000004/index.json" ]] && break
  sleep 0.05
done
t_signal=$SECONDS
"$testbed" exec scancel --signal=USR1 "$jid"
# job_field FIELD: Field=VALUE of the job's record (kept 300 s after its end)
job_field() { "$testbed" exec scontrol show job "$jid" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p"; }
for _ in $(seq 1800); do
  [[ "$(job_field JobState)" =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL)$ ]] && break
  sleep 0.1
done
check_eq "preempted under sbatch: the requeued job (job $jid) completed, exit 0" "COMPLETED 0:0" \
  "$(job_field JobState) $(job_field ExitCode)"
echo "preemption: signal to the requeued job's end $((SECONDS - t_signal)) s"
log="$(cat "$tmp/pre.out" 2>/dev/null)"
check "preempted: saved on SIGUSR1" "on SIGUSR1: saved $tmp/pre/step-" "$log"
check "preempted: requeued" "tessera train.sbatch: preempted after a save: requeueing job $jid" "$log"
check "preempted: resumed" "resumed from step " "$log"
same_checkpoint "preempted: final checkpoint byte-identical to the uninterrupted run's" \
  "$tmp/whole/step-00000012" "$tmp/pre/step-00000012"

# 6. down
munged_pid="$(cat "/tmp/tessera-slurm-$TS_CLUSTER/munge/munged.pid" 2>/dev/null)"
"$testbed" down
check_eq "testbed down: exit" 0 $?
gone() { # gone PID — 1 when process PID has ended (a zombie has), else 0
  local state
  state="$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)"
  [[ -z "$state" || "$state" == Z ]] && echo 1 || echo 0
}
left=""
for n in "$n1" "$n2"; do
  for pid in $(ip netns pids "$n" 2>/dev/null); do
    (($(gone "$pid"))) || left+=" [$(ps -o etimes=,args= -p "$pid" 2>/dev/null | sed 's/^ *//')]"
  done
done
check_eq "testbed down: nothing runs on the nodes" "" "$left"
check_eq "testbed up had written munged's pid" 1 "$([[ "$munged_pid" =~ ^[0-9]+$ ]] && echo 1 || echo 0)"
check_eq "testbed down: munged stopped" 1 "$(gone "${munged_pid:-0}")"
check_eq "testbed down: its folder is gone" 0 "$([[ -e "/tmp/tessera-slurm-$TS_CLUSTER" ]] && echo 1 || echo 0)"

echo "$fails failure(s)"
((fails == 0))
