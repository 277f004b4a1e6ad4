#!/usr/bin/env bash
# checkpoint_test.sh — checkpoints through the command line, on llama-tiny
# with generated token shards:
#  1. train --save --save-every, then --resume from the middle: the resumed
#     run's last checkpoint is byte-identical to the uninterrupted run's
#     (the SHA-256 of every rank file in index.json), on 1 rank and on 2;
#     and the losses it prints are the same;
#  2. a checkpoint of 2 ranks, ZeRO-3, 2 pipeline stages resumes on 1 rank;
#  3. SIGTERM to `launch` saves at the next step boundary and exits 5
#     (preempted: SIGUSR1 to the ranks), SIGINT saves and exits 0;
#  4. launch --max-restarts 1 with rank 1 killed (SIGKILL) after step 5
#     (tessera_testing, whose test seam kills; tessera itself ignores it):
#     one line names the rank and host, the job restarts from the newest
#     checkpoint and ends byte-identical to the uninterrupted run;
#  5. --keep 1 keeps the newest; --resume auto with nothing saved starts
#     afresh;
#  6. export: a Hugging Face folder that --init-from and --model DIR read;
#     README's walkthrough (prepare --tokenizer on JSON Lines, launch -n 2
#     train --init-from, export, generate from the checkpoint and the
#     export); train --sample-every on two ranks;
#  7. bad input: one line each and the exact exit code (the ranks' files
#     swapped on disk too); a resume with another --steps says so in one
#     line and goes on;
#  8. training health: a diverging fp32 run skips non-finite steps, stops
#     with exit 3 after --max-bad-steps and saves nothing after its last
#     good step; nonsense (a negative lr, a flag twice, a micro-batch whose
#     sizes overflow, a plan larger than this machine, a BERT or Mistral
#     config patched to say llama) is refused at once in one line.
#   checkpoint_test.sh TESSERA_BIN LAUNCH_SH TESSERA_TESTING_BIN
# (the last: the same command line with the test seam's kill, section 4).
set -uo pipefail
bin="$1"
launch="$2"
testing_bin="$3"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fails=0
source "$(dirname "${BASH_SOURCE[0]}")/testing.sh"
presets_home

mpi_scratch
make_token_shards "$tmp/data"
base=(--data "$tmp/data" --seq 32 --log-every 1) # train refuses a flag given twice
common=(--model llama-tiny "${base[@]}" --steps 6 --micro-batch 2)

# 1. resume from the middle == uninterrupted, 1 and 2 ranks
for n in 1 2; do
  a="$("$launch" -n "$n" "$bin" train "${common[@]}" --zero 2 --save "$tmp/a$n" --save-every 2 2>&1)"
  check_eq "run a$n exit" 0 $?
  echo '{"earlier": "run"}' >"$tmp/b$n.jsonl"
  b="$("$launch" -n "$n" "$bin" train "${common[@]}" --zero 2 --resume "$tmp/a$n/step-00000002" \
    --save "$tmp/b$n" --metrics "$tmp/b$n.jsonl" 2>&1)"
  check_eq "resumed b$n exit" 0 $?
  check "b$n says so" "resumed from step 2" "$b"
  absent "b$n: the same schedule, no note" "note: resuming" "$b"
  check_eq "b$n keeps its metrics file's lines" '{"earlier": "run"}' "$(head -n 1 "$tmp/b$n.jsonl")"
  check "b$n appends to it from the resume" '{"resume":{"step":2,"checkpoint":' \
    "$(sed -n 2p "$tmp/b$n.jsonl")"
  check_eq "b$n: steps 3-6 print the same" "$(steps "$a" | tail -n 4)" "$(steps "$b")"
  [[ -n "$(shas "$tmp/a$n/step-00000006")" ]] || { echo "FAIL no checksums"; fails=$((fails + 1)); }
  check_eq "b$n: final checkpoint byte-identical" "$(shas "$tmp/a$n/step-00000006")" \
    "$(shas "$tmp/b$n/step-00000006")"
  check_eq "a$n: a file per rank" "$n" "$(ls "$tmp/a$n/step-00000006" | grep -c '^rank-')"
done

# 2. 2 ranks ZeRO-3 with 2 pipeline stages -> 1 rank, ZeRO 0
p="$("$launch" -n 2 "$bin" train "${common[@]}" --zero 3 --pipeline 2 --grad-accum 2 \
  --save "$tmp/p" --save-every 3 2>&1)"
check_eq "pipeline run exit" 0 $?
check "1 rank resumed the newest" "resumed from step 6" "$(
  "$bin" train --model llama-tiny "${base[@]}" --micro-batch 2 --steps 7 --grad-accum 2 \
    --resume "$tmp/p" 2>&1)"
one="$("$bin" train "${common[@]}" --grad-accum 2 --resume "$tmp/p/step-00000003" 2>&1)"
check_eq "pipeline checkpoint on 1 rank: exit" 0 $?
check "steps 4-6 go on near the 2-rank losses (another dp order)" "step     6/6 | loss" "$one"

# 2b. the interleaved schedule (2 stages of 2 model chunks) saves, and 1F1B
# and ZB-H1 resume it: steps 4-6 print the same as the interleaved run's
# own (the same micro-batches on the same ranks: bitwise), and the other
# way round
il=(--zero 1 --pipeline 2 --grad-accum 2)
i="$("$launch" -n 2 "$bin" train "${common[@]}" "${il[@]}" --schedule interleaved \
  --virtual-stages 2 --save "$tmp/il" --save-every 3 2>&1)"
check_eq "interleaved run exit" 0 $?
check "interleaved: the summary names the chunks" \
  "interleaved (2 model chunks per stage), 2 micro-batches per step (bubble in theory 20.0%); units per stage: 0..1,3..4 2..2,5..5" \
  "$i"
f="$("$launch" -n 2 "$bin" train "${common[@]}" "${il[@]}" --schedule 1f1b \
  --resume "$tmp/il/step-00000003" 2>&1)"
check_eq "1f1b resumes the interleaved checkpoint: exit" 0 $?
check_eq "1f1b after interleaved: steps 4-6 print the same" "$(steps "$i" | tail -n 3)" \
  "$(steps "$f")"
g="$("$launch" -n 2 "$bin" train "${common[@]}" "${il[@]}" --save "$tmp/f1" --save-every 3 2>&1)"
check_eq "1f1b run exit" 0 $?
check_eq "1f1b and interleaved: steps 1-6 print the same" "$(steps "$g")" "$(steps "$i")"
h="$("$launch" -n 2 "$bin" train "${common[@]}" "${il[@]}" --schedule interleaved \
  --virtual-stages 2 --resume "$tmp/f1/step-00000003" 2>&1)"
check_eq "interleaved resumes the 1f1b checkpoint: exit" 0 $?
check_eq "interleaved after 1f1b: steps 4-6 print the same" "$(steps "$g" | tail -n 3)" \
  "$(steps "$h")"
z="$("$launch" -n 2 "$bin" train "${common[@]}" "${il[@]}" --schedule zb-h1 \
  --resume "$tmp/il/step-00000003" 2>&1)"
check_eq "zb-h1 resumes the interleaved checkpoint: exit" 0 $?
check "zb-h1: the summary's bubble is its formula's, (P-1)/(3m+P-1)" \
  "zb-h1, 2 micro-batches per step (bubble in theory 14.3%)" "$z"
check_eq "zb-h1 after interleaved: steps 4-6 print the same" "$(steps "$g" | tail -n 3)" \
  "$(steps "$z")"
v="$("$launch" -n 2 "$bin" train "${common[@]}" "${il[@]}" --schedule zbv \
  --resume "$tmp/il/step-00000003" 2>&1)"
check_eq "zbv resumes the interleaved checkpoint: exit" 0 $?
check "zbv: its V in the summary" "zbv (2 model chunks per stage), 2 micro-batches per step" "$v"
check_eq "zbv after interleaved: steps 4-6 print the same" "$(steps "$g" | tail -n 3)" \
  "$(steps "$v")"

# 3. SIGTERM: save at the next step boundary, exit 5 (preempted)
"$launch" -n 2 "$bin" train --model llama-tiny "${base[@]}" --micro-batch 2 --steps 100000 \
  --save "$tmp/sig" >"$tmp/sig.log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q '^step' "$tmp/sig.log" && break; sleep 0.2; done
# In each rank, SIGINT and SIGTERM reach one thread only, the one that takes
# them (train_main.c): every other thread blocks them (SigBlk has bits 1,
# 9 and 14: SIGINT, SIGUSR1, SIGTERM), so no signal interrupts a computing
# thread (oneDNN's AVX2 products corrupted the heap when one did).
open=""
for r in $(pgrep -f "^$bin train .*--save $tmp/sig"); do
  n=0
  for st in /proc/"$r"/task/*/status; do
    blk="$(awk '/^SigBlk:/ { print $2 }' "$st" 2>/dev/null)"
    [[ -n "$blk" ]] && ((!((0x$blk & 0x4202) == 0x4202))) && n=$((n + 1))
  done
  open+="$n "
done
check_eq "SIGTERM: one thread of each rank takes the signals" "1 1 " "$open"
kill -TERM "$pid"
wait "$pid"
check_eq "SIGTERM: exit 5" 5 $?
check "SIGTERM: saved" "on SIGUSR1: saved $tmp/sig/step-" "$(cat "$tmp/sig.log")"
check "SIGTERM: says so" "(exit 5: preempted; resume with --resume auto)" "$(cat "$tmp/sig.log")"
check_eq "SIGTERM: the checkpoint is complete" 1 "$(ls "$tmp"/sig/step-*/index.json | wc -l)"

# 4. a rank killed after step 5: one line, a restart from the newest complete
# checkpoint (step 2's, or step 4's if its asynchronous write was committed
# before the kill), byte-identical end
k="$(TESSERA_TEST_KILL="1:5:$tmp/killed" "$launch" -n 2 --max-restarts 1 "$testing_bin" train \
  "${common[@]}" --zero 2 --save "$tmp/k" --save-every 2 2>&1)"
check_eq "killed rank: exit 0 after the restart" 0 $?
check "killed rank: one line names it" "tessera launch: rank 1 on host" "$k"
check "killed rank: the signal" "died: signal 9 (Killed); every rank was stopped" "$k"
absent "killed rank: no mpirun boilerplate" "Primary job" "$k"
absent "killed rank: no mpirun notice" "mpirun noticed" "$k"
check "killed rank: restarted" "restart 1 of 1 from the newest complete checkpoint" "$k"
check_eq "killed rank: resumed from a checkpoint" 1 "$(grep -cE '^resumed from step (2|4)$' <<<"$k")"
check_eq "killed rank: ends byte-identical" "$(shas "$tmp/a2/step-00000006")" \
  "$(shas "$tmp/k/step-00000006")"
start=$SECONDS
k="$(TESSERA_TEST_KILL="0:2:$tmp/killed2" "$launch" -n 2 "$testing_bin" train --model llama-tiny "${base[@]}" \
  --micro-batch 2 --steps 100000 2>&1)"
check_eq "no restarts: the death's status" 137 $?
check_eq "no restarts: every rank stopped within 30 s" 1 "$(((SECONDS - start) < 30))"
check_eq "no restarts: one line after the progress" 1 "$(grep -vc '^step' <<<"$k")"
# The production binary has no such seam: the same variable changes nothing.
TESSERA_TEST_KILL="0:1:$tmp/killed3" "$bin" train --model llama-tiny "${base[@]}" --micro-batch 2 \
  --steps 2 >/dev/null 2>&1
check_eq "tessera ignores TESSERA_TEST_KILL: exit" 0 $?
check_eq "tessera ignores TESSERA_TEST_KILL: no marker" no "$([[ -e "$tmp/killed3" ]] && echo yes || echo no)"

# 5. --keep, --resume auto
mkdir -p "$tmp/keep/step-3" # a folder named by hand, not a checkpoint, older: removed
"$bin" train "${common[@]}" --save "$tmp/keep" --save-every 1 --keep 2 >/dev/null 2>&1
check_eq "--keep 2" "step-00000005 step-00000006" "$(ls "$tmp/keep" | grep -v '^progress.json$' | tr '\n' ' ' | sed 's/ $//')"
check_eq "--keep 2: the last step finished, for a restart's count" '{"step": 6}' "$(cat "$tmp/keep/progress.json")"
fresh="$("$bin" train --model llama-tiny "${base[@]}" --micro-batch 2 --steps 1 --save "$tmp/empty" \
  --resume auto 2>&1)"
check_eq "--resume auto, nothing saved: exit" 0 $?
absent "--resume auto, nothing saved: a fresh start" "resumed" "$fresh"

# 6. export, --init-from, --model DIR
out="$("$bin" export "$tmp/a1" --out "$tmp/hf" 2>&1)"
check_eq "export exit" 0 $?
check "export names the newest" "exported $tmp/a1/step-00000006 (fp32)" "$out"
check_eq "export files" "config.json model.safetensors" "$(ls "$tmp/hf" | tr '\n' ' ' | sed 's/ $//')"
ft="$("$bin" train --init-from "$tmp/hf" --data "$tmp/data" --steps 1 --micro-batch 2 --seq 32 2>&1)"
check_eq "--init-from exit" 0 $?
first_a="$(steps "$a" | sed -n 6p | sed 's/.*loss \([0-9.]*\).*/\1/')"
first_ft="$(steps "$ft" | head -n 1 | sed 's/.*loss \([0-9.]*\).*/\1/')"
python3 -c "import sys; sys.exit(0 if float('$first_ft') < float('$first_a') + 1.0 else 1)" &&
  echo "ok   --init-from starts from the trained weights" ||
  { echo "FAIL --init-from loss $first_ft vs trained $first_a"; fails=$((fails + 1)); }
# README's walkthrough up to the export: the Hugging Face folder with a
# tokenizer of its own (tests/hf_tokenizer's LLaMA-style tokenizer.model),
# your JSON Lines tokenized with it, two ranks going on from its weights,
# the result exported again.
cp "$TESSERA_HOME/tests/hf_tokenizer/llama_sp/tokenizer.model" \
  "$TESSERA_HOME/tests/hf_tokenizer/llama_sp/tokenizer_config.json" "$tmp/hf/"
for i in $(seq 300); do printf '{"text": "In the beginning %d was the word, and the word %d."}\n' "$i" "$((i * 7))"; done \
  >"$tmp/mine.jsonl"
out="$("$bin" prepare --text "$tmp/mine.jsonl" --text-field text --tokenizer "$tmp/hf" \
  --out "$tmp/mine" 2>&1)"
check_eq "walkthrough: prepare --tokenizer exit" 0 $?
check "walkthrough: prepare says the tokenizer" "$tmp/hf/tokenizer.model (sentencepiece), vocab 480" "$out"
out="$("$launch" -n 2 "$bin" train --init-from "$tmp/hf" --data "$tmp/mine" --steps 2 --micro-batch 2 \
  --seq 32 --save "$tmp/mine-ck" 2>&1)"
check_eq "walkthrough: launch -n 2 train --init-from exit" 0 $?
check "walkthrough: two ranks" "on 2 ranks" "$out"
"$bin" export "$tmp/mine-ck" --out "$tmp/mine-hf" >/dev/null 2>&1
check_eq "walkthrough: export exit" 0 $?
check_eq "walkthrough: the exported folder" "config.json model.safetensors" \
  "$(ls "$tmp/mine-hf" | tr '\n' ' ' | sed 's/ $//')"
# ... then generate: from the checkpoint (the data's tokenizer) and from the
# export given the model's tokenizer, the same greedy text after the prompt
# (two steps in, the text may be a run of spaces or end at once: --ignore-eos)
gen=(--prompt "In the beginning" --max-new-tokens 12 --ignore-eos)
g1="$("$bin" generate --checkpoint "$tmp/mine-ck" "${gen[@]}" 2>"$tmp/g1.err")"
check_eq "walkthrough: generate --checkpoint exit" 0 $?
check_eq "walkthrough: the prompt first" "In the beginning" "${g1:0:16}"
check "walkthrough: 12 tokens after it" "generate: 6 prompt tokens, 12 new in" "$(cat "$tmp/g1.err")"
cp "$tmp/hf/tokenizer.model" "$tmp/hf/tokenizer_config.json" "$tmp/mine-hf/"
check_eq "walkthrough: generate --hf gives the same text" "$g1" \
  "$("$bin" generate --hf "$tmp/mine-hf" "${gen[@]}" 2>/dev/null)"
# train --sample-every on two ranks at ZeRO-3: rank 0 prints a sample at
# step 2 and, after the summary, the last step's
out="$("$launch" -n 2 "$bin" train --init-from "$tmp/hf" --data "$tmp/mine" --steps 4 --micro-batch 2 \
  --seq 32 --zero 3 --sample-every 2 --prompt "In the beginning" --sample-tokens 6 2>&1)"
check_eq "train --sample-every exit" 0 $?
check_eq "two samples, one each" 2 "$(grep -c '^sample at step [24]: In the beginning' <<<"$out")"
check_eq "the last sample ends the output" "sample at step 4: In the beginning" \
  "$(tail -n 1 <<<"$out" | cut -c 1-34)"
"$bin" export "$tmp/p" --out "$tmp/hf-bf16" --dtype bf16 --max-shard-size 2000000 >/dev/null 2>&1
check_eq "sharded export" 1 "$(ls "$tmp/hf-bf16" | grep -c 'model.safetensors.index.json')"
check "bf16 config" '"torch_dtype":	"bfloat16"' "$(cat "$tmp/hf-bf16/config.json")"
"$bin" train --model "$tmp/hf-bf16" --init-from "$tmp/hf-bf16" --data "$tmp/data" --steps 1 \
  --micro-batch 2 --seq 32 >/dev/null 2>&1
check_eq "--model DIR with sharded bf16 weights" 0 $?

# 7. bad input: one line, exact exit codes
bad() { # bad NAME CODE EXPECTED-SUBSTRING CMD...
  local name="$1" code="$2" want="$3"
  shift 3
  local o
  o="$("$@" 2>&1)"
  check_eq "$name: exit" "$code" $?
  check "$name: message" "$want" "$o"
  check_eq "$name: one line" 1 "$(lines "$o")"
}
bad "--save-every without --save" 2 "--save-every needs --save DIR" \
  "$bin" train "${common[@]}" --save-every 2
bad "--resume auto without --save" 2 "--resume auto needs --save DIR" \
  "$bin" train "${common[@]}" --resume auto
bad "--resume nowhere" 1 "--resume $tmp/none: no complete checkpoint there" \
  "$bin" train "${common[@]}" --resume "$tmp/none"
bad "--resume at the last step" 1 "is at step 6 already; expected more steps" \
  "$bin" train "${common[@]}" --resume "$tmp/a1"
bad "--resume another global batch" 1 "the checkpoint $tmp/a1/step-00000002 was trained with 2" \
  "$bin" train --model llama-tiny "${base[@]}" --steps 6 --micro-batch 4 --resume "$tmp/a1/step-00000002"
bad "--resume another model" 1 "has shape" \
  "$bin" train --model llama-small "${base[@]}" --steps 6 --resume "$tmp/a1"
bad "--resume 2 ranks, another model" 1 "has shape" \
  "$launch" -n 2 "$bin" train --model llama-small "${base[@]}" --steps 6 --resume "$tmp/a1"
cp -r "$tmp/a1/step-00000006" "$tmp/flip"
printf '\x55' | dd of="$tmp/flip/rank-00000.bin" bs=1 seek=4096 conv=notrunc status=none
bad "--resume a corrupt file" 1 "rank-00000.bin: sha256" \
  "$bin" train --model llama-tiny "${base[@]}" --micro-batch 2 --steps 7 --resume "$tmp/flip"
o="$("$bin" train --model llama-tiny "${base[@]}" --micro-batch 2 --steps 8 \
  --resume "$tmp/a1/step-00000002" 2>&1)"
check_eq "--resume with another --steps: exit 0" 0 $?
check "--resume with another --steps: said" "note: resuming with another learning-rate schedule \
than the checkpoint's (--steps 8, --lr 0.003, --warmup 0, min_lr_ratio 0.1 here; 6, 0.003, 0, 0.1 \
there): step 3's rate is " "$o"
cp -r "$tmp/a2/step-00000002" "$tmp/swap"
mv "$tmp/swap/rank-00000.bin" "$tmp/swap/x" && mv "$tmp/swap/rank-00001.bin" "$tmp/swap/rank-00000.bin"
mv "$tmp/swap/x" "$tmp/swap/rank-00001.bin"
bad "--resume with the ranks' files swapped" 1 "rank-00000.bin: sha256 " \
  "$launch" -n 2 "$bin" train "${common[@]}" --zero 2 --resume "$tmp/swap"
bad "export without --out" 2 "--out DIR is required" "$bin" export "$tmp/a1"
bad "export of nothing" 1 "$tmp/none: no complete checkpoint there" \
  "$bin" export "$tmp/none" --out "$tmp/x"
bad "--init-from another model" 1 "has shape [4096, 192] (2 dims), the model llama-small" \
  "$bin" train --model llama-small --init-from "$tmp/hf" --data "$tmp/data" --steps 1
bad "--init-from a checkpoint" 1 "no model.safetensors or model.safetensors.index.json" \
  "$bin" train --init-from "$tmp/a1/step-00000006" --data "$tmp/data" --steps 1
bad "--max-restarts x" 2 "--max-restarts x: expected a number of restarts >= 0" \
  "$launch" --max-restarts x -n 2 "$bin" train

# 8. training health: a diverging run stops (exit 3) and saves nothing after
# its last good step; nonsense is refused before any work
h="$("$bin" train --model llama-tiny "${base[@]}" --steps 10 --micro-batch 2 --lr 1e30 --warmup 0 \
  --save "$tmp/div" --save-every 1 2>&1)"
check_eq "diverging: exit 3" 3 $?
check "diverging: skipped, named" "skipped: non-finite values in model." "$h"
check "diverging: stopped" "3 steps in a row with a non-finite loss or gradient (--max-bad-steps 3)" "$h"
check_eq "diverging: only the good step saved" "step-00000001" "$(ls "$tmp/div" | grep -v '^progress.json$' | tr '\n' ' ' | sed 's/ $//')"
h="$("$bin" train --model llama-tiny "${base[@]}" --steps 10 --micro-batch 2 --lr 1e30 --warmup 0 \
  --max-bad-steps 1 2>&1)"
check_eq "--max-bad-steps 1: exit 3" 3 $?
check "--max-bad-steps 1: at step 2" "step 2: 1 steps in a row" "$h"
bad "--lr -1" 2 "--lr -1: expected a learning rate >= 0" "$bin" train "${common[@]}" --lr -1
bad "--lr inf" 2 "--lr inf: expected a finite number" "$bin" train "${common[@]}" --lr inf
bad "a flag twice" 2 "--seq given twice: expected it once" "$bin" train "${common[@]}" --seq 16
bad "a flag twice on 2 ranks: once" 2 "--seq given twice: expected it once" \
  "$launch" -n 2 "$bin" train "${common[@]}" --seq 16
bad "estimate --micro-batch 1e9" 2 "tokens per micro-batch, --grad-accum 1: expected at most 2^31 - 1 each" \
  "$bin" estimate --model llama-tiny --micro-batch 1000000000
bad "train --micro-batch 1e9" 1 "expected at least 1 ranks x --micro-batch 1000000000" \
  "$bin" train --model llama-tiny "${base[@]}" --micro-batch 1000000000
tiny="$TESSERA_HOME/models/configs/llama-tiny.json"
sed 's/"intermediate_size": 512/"intermediate_size": 20000000/' "$tiny" >"$tmp/huge.json"
start="$(date +%s%N)"
bad "a plan larger than this machine" 1 "GiB of memory: expected a smaller --micro-batch" \
  "$bin" train --model "$tmp/huge.json" "${base[@]}" --steps 1
took_ms=$((($(date +%s%N) - start) / 1000000)) # nothing allocated: the plan alone
check_eq "refused at once (under 5 s; took $took_ms ms)" 1 "$((took_ms < 5000))"
bad "a plan larger than this machine, 2 ranks" 1 "GiB of memory: expected a smaller --micro-batch" \
  "$launch" -n 2 "$bin" train --model "$tmp/huge.json" "${base[@]}" --steps 1
sed 's/"LlamaForCausalLM"/"BertForMaskedLM"/' "$tiny" >"$tmp/bert.json"
bad "a BERT config patched to llama" 1 'field "architectures" = ["BertForMaskedLM"]' \
  "$bin" train --model "$tmp/bert.json" "${base[@]}" --steps 1
sed 's/"hidden_act"/"sliding_window": 4096, "hidden_act"/' "$tiny" >"$tmp/mistral.json"
bad "a Mistral config patched to llama" 1 'field "sliding_window" = 4096: expected it absent' \
  "$bin" train --model "$tmp/mistral.json" "${base[@]}" --steps 1
sed 's/"hidden_act"/"type_vocab_size": 2, "hidden_act"/' "$tiny" >"$tmp/bert2.json"
bad "a BERT field (estimate: bad usage)" 2 'field "type_vocab_size" = 2' \
  "$bin" estimate --model "$tmp/bert2.json"

echo "$fails failure(s)"
((fails == 0))
