#!/usr/bin/env bash
# Recovery time of a training job on 3 nodes (network namespaces,
# tools/cluster.sh; needs root), 1 rank each, ZeRO-3: from the failure to
# the next completed step, and the steps done again, for
#   restart    today's `launch --max-restarts 1`, rank 0 killed (SIGKILL
#              after a step): the same world relaunched from the newest
#              checkpoint (the baseline);
#   cut/old    today's launch with node 3's link cut: the watchdog stops
#              the ranks after --comm-timeout, but mpirun waits for the node
#              (it never recovers while the link is down; waited 120 s);
#   cut        `launch --nodes 2:3` with node 3's link cut: shrinks to 2
#              (TESSERA_NODE_POLL 5 and the default 30);
#   grow       the link back: grows to 3 (from the link's return);
#   preempt    SIGUSR1 to launch: the ranks save at the next step boundary
#              and exit 5; a relaunch (what a requeue runs) to its first
#              step.
# "Completed step" is rank 0's progress.json changing (it is rewritten
# after every step), polled every 50 ms. Beside: the launch of 3 ranks
# that do nothing (`mpirun true`: process start and Open MPI's set-up) and
# the resumed runs' checkpoint read (their summary line).
#
#   tools/bench_elastic.sh [MODEL] [SAVE_EVERY]   (default llama-small, 4)
# TESSERA_BIN as in tools/bench_env.sh, but the test binary (its kill hook).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:-llama-small}"
EVERY="${2:-4}"
cd "$ROOT"
bazel build --ui_event_filters=-info,-progress --noshow_progress //tools:tessera_testing //tools:tessera
BIN="${TESSERA_BIN:-$PWD/bazel-bin/tools/tessera_testing}"
export TESSERA_HOME="$PWD"
tools/kjv.sh bazel-bin/tools/tessera >/dev/null
DATA="$PWD/data/kjv"
TMP="$(mktemp -d)"
export PATH="$PATH:/usr/sbin:/sbin" TS_CLUSTER="bel$$" TS_CLUSTER_NET=202 OMP_NUM_THREADS=1
C="$PWD/tools/cluster.sh"
trap '"$C" down >/dev/null 2>&1; rm -rf "$TMP"' EXIT
"$C" up 3 >/dev/null
n1="$TS_CLUSTER-n1" n2="$TS_CLUSTER-n2" n3="$TS_CLUSTER-n3"
printf '%s slots=1\n' "$n1" "$n2" "$n3" >"$TMP/hosts"
eval "$("$C" mpirun-env)"
train=(train --model "$MODEL" --data "$DATA" --seq 128 --micro-batch 4 --zero 3 --steps 400
  --save-every "$EVERY" --log-every 1 --comm-timeout 30)
now() { date +%s.%N; }
# on_n1 LOG ARGS...: launch ARGS on node 1 in the background ($job)
on_n1() {
  local log="$1"
  shift
  "$C" exec "$n1" tools/launch.sh "$@" >"$log" 2>&1 &
  job=$!
}
wait_file() { for _ in $(seq 2400); do [[ -e "$1" ]] && return 0; sleep 0.05; done; return 1; }
# next_step SAVE SINCE [LIMIT]: seconds from SINCE (epoch) to progress.json's next change
# after it, or "-" past LIMIT seconds (default 300)
next_step() {
  local f="$1/progress.json" t0="$2" limit="${3:-300}" m
  while :; do
    m="$(stat -c %.9Y "$f" 2>/dev/null || echo 0)"
    if python3 -c "import sys; sys.exit(0 if float('$m') > float('$t0') else 1)"; then
      python3 -c "print(f'{float(\"$m\") - float(\"$t0\"):.1f}')"
      return
    fi
    python3 -c "import sys; sys.exit(0 if float('$(now)') - float('$t0') < $limit else 1)" || { echo "-"; return; }
    sleep 0.05
  done
}
step_of() { sed -n 's/^{"step": \([0-9]*\)}$/\1/p' "$1/progress.json"; }
load_s() { grep -o 'checkpoint load: .* in [0-9.]* s' "$1" | tail -n 1 | sed 's/.* in \([0-9.]*\) s/\1/' || true; }
stop_job() { kill -TERM "$job" 2>/dev/null; wait "$job" 2>/dev/null || true; pkill -KILL -f "$TMP/" 2>/dev/null || true; }
rows=()
# the launch alone
t0="$(now)"
"$C" exec "$n1" tools/launch.sh -n 3 --hostfile "$TMP/hosts" /bin/sh -c 'hostname >/dev/null'
launch_s="$(python3 -c "print(f'{float(\"$(now)\") - float(\"$t0\"):.1f}')")"

# restart: today's --max-restarts, rank 0 (on node 1: the test hook's variable reaches it) killed after step 2*EVERY+2
kill_at=$((2 * EVERY + 2))
TESSERA_TEST_KILL="0:$kill_at:$TMP/killed" on_n1 "$TMP/r.log" -n 3 --hostfile "$TMP/hosts" --max-restarts 1 \
  "$BIN" "${train[@]}" --save "$TMP/r"
wait_file "$TMP/killed"
t0="$(stat -c %.9Y "$TMP/killed")"
r="$(next_step "$TMP/r" "$t0")"
sleep 1
rows+=("restart (today, --max-restarts 1)|rank 0 killed|$r|$((kill_at - 2 * EVERY))|")
stop_job

# cut/old: today's launch, node 3's link cut
on_n1 "$TMP/o.log" -n 3 --hostfile "$TMP/hosts" --max-restarts 1 "$BIN" "${train[@]}" --save "$TMP/o"
wait_file "$TMP/o/step-$(printf %08d "$EVERY")/index.json"
"$C" link "$n3" down
t0="$(now)"
r="$(next_step "$TMP/o" "$(python3 -c "print(float('$t0') + 35)")" 85)"
rows+=("cut link (today, --comm-timeout 30)|node 3 cut|${r/-/none in 120 s}|-")
"$C" link "$n3" up
stop_job

for poll in 5 30; do
  TESSERA_NODE_POLL=$poll on_n1 "$TMP/e$poll.log" --nodes 2:3 --hostfile "$TMP/hosts" --max-restarts 2 \
    "$BIN" "${train[@]}" --save "$TMP/e$poll"
  wait_file "$TMP/e$poll/step-$(printf %08d "$EVERY")/index.json"
  sleep 2
  "$C" link "$n3" down
  t0="$(now)"
  for _ in $(seq 2400); do grep -q "lost" "$TMP/e$poll.log" && break; sleep 0.05; done
  r="$(next_step "$TMP/e$poll" "$t0")"
  redone="$(sed -n 's/.*lost.*(\([0-9]*\) steps redone)/\1/p' "$TMP/e$poll.log")"
  sleep 1
  rows+=("shrink (--nodes 2:3, poll $poll s)|node 3 cut|$r|$redone")
  sleep 5
  "$C" link "$n3" up
  t0="$(now)"
  for _ in $(seq 2400); do grep -q "answers again" "$TMP/e$poll.log" && break; sleep 0.05; done
  r="$(next_step "$TMP/e$poll" "$t0")"
  rows+=("grow (--nodes 2:3, poll $poll s)|node 3 back|$r|0")
  stop_job
done

# preempt: SIGUSR1 to launch, then a relaunch
on_n1 "$TMP/p.log" -n 3 --hostfile "$TMP/hosts" "$BIN" "${train[@]}" --save "$TMP/p"
wait_file "$TMP/p/step-$(printf %08d "$EVERY")/index.json"
t0="$(now)"
"$C" exec "$n1" pkill -USR1 -f "tools/launch.sh -n 3 --hostfile $TMP/hosts"
wait "$job" || true
stopped="$(python3 -c "print(f'{float(\"$(now)\") - float(\"$t0\"):.1f}')")"
t1="$(now)"
on_n1 "$TMP/p2.log" -n 3 --hostfile "$TMP/hosts" "$BIN" "${train[@]}" --save "$TMP/p" --resume auto
r="$(next_step "$TMP/p" "$t1")"
sleep 1
rows+=("preempt (SIGUSR1, then relaunch)|signal|$stopped to exit 5, $r to the next step|0")
stop_job

# the checkpoint read alone: a resume that trains one step (its summary)
ck="$(ls -d "$TMP"/r/step-* | tail -n 1)"
n="$((10#${ck##*step-}))"
"$C" exec "$n1" tools/launch.sh -n 3 --hostfile "$TMP/hosts" "$BIN" "${train[@]/400/$((n + 1))}" \
  --resume "$ck" --save "$TMP/read" >"$TMP/read.log" 2>&1 || true
read_s="$(load_s "$TMP/read.log")"

echo "$MODEL, 3 nodes x 1 rank, ZeRO-3, --save-every $EVERY; launch of 3 ranks doing nothing:" \
  "$launch_s s; a resume's checkpoint read (checksums and slices): ${read_s:-?} s"
printf '| %s | %s | %s | %s |\n' "run" "failure" "to the next step (s)" "steps redone"
printf '|---|---|---|---|\n'
for row in "${rows[@]}"; do
  IFS='|' read -r a b c d <<<"$row"
  printf '| %s | %s | %s | %s |\n' "$a" "$b" "$c" "$d"
done
