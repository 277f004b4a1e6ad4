#!/usr/bin/env bash
# generate_test.sh — `tessera generate` from the command line, on
# llama-tiny trained a few steps on generated token shards:
#  1. greedy ids: the key/value cache equals recomputing the prefix
#     (--no-cache), a checkpoint equals its export (--hf);
#  2. sampling: a seed repeats its tokens, another seed gives others;
#  3. text in prepare's own tokenizer (lines, their breaks), and train
#     --sample-every's samples;
#  4. BERT's --fill-mask: the text, then the likeliest tokens per [MASK];
#  5. a model's tokenizer.json: generate, --sample-every, --fill-mask;
#  6. bad input: one line and the exact exit code each.
# (A model's own tokenizer: checkpoint_test.sh's README walkthrough; ids
# against transformers: tests/generate_test.cc.)
#   generate_test.sh TESSERA_BIN
set -uo pipefail
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fails=0
source "$(dirname "${BASH_SOURCE[0]}")/testing.sh"
presets_home
make_token_shards "$tmp/data"
"$bin" train --model llama-tiny --data "$tmp/data" --seq 32 --micro-batch 2 --steps 3 \
  --save "$tmp/ck" >/dev/null 2>&1
check_eq "train exit" 0 $?
"$bin" export "$tmp/ck" --out "$tmp/hf" >/dev/null 2>&1
check_eq "export exit" 0 $?

gen() { "$bin" generate "$@" 2>/dev/null; }
ids=(--prompt-ids 11,22,33,44 --max-new-tokens 12)

# 1. greedy
a="$(gen --checkpoint "$tmp/ck" "${ids[@]}")"
check_eq "greedy exit" 0 $?
check_eq "12 ids" 12 "$(wc -w <<<"$a")"
check_eq "--no-cache gives the same ids" "$a" "$(gen --checkpoint "$tmp/ck" "${ids[@]}" --no-cache)"
check_eq "the export gives the same ids" "$a" "$(gen --hf "$tmp/hf" "${ids[@]}")"
err="$("$bin" generate --checkpoint "$tmp/ck" "${ids[@]}" 2>&1 >/dev/null)"
check "a line of figures" "generate: 4 prompt tokens, 12 new in" "$err"
check "it says the cache" "on cpu, fp32, key/value cache" "$err"

# 2. sampling
s=(--checkpoint "$tmp/ck" "${ids[@]}" --temperature 1 --top-k 50 --top-p 0.95)
a5="$(gen "${s[@]}" --seed 5)"
check_eq "seed 5 exit" 0 $?
check_eq "seed 5 repeats" "$a5" "$(gen "${s[@]}" --seed 5)"
check_eq "seed 5 repeats without the cache" "$a5" "$(gen "${s[@]}" --seed 5 --no-cache)"
[[ "$a5" != "$(gen "${s[@]}" --seed 6)" ]] || { echo "FAIL seed 6 gave seed 5's tokens"; fails=$((fails + 1)); }

# 3. text in prepare's own tokenizer: lines and their breaks, from the
# checkpoint's data folder; train --sample-every prints samples
python3 - "$tmp/own.txt" <<'PY'
import random, sys
r = random.Random(1)
w = "the of and to in he that for his unto shall lord god said".split()
out = []
for c in range(60):
    out.append("Chapter %d" % c)
    out += [" ".join(r.choice(w) for _ in range(12)) for _ in range(8)]
    out.append("")
open(sys.argv[1], "w").write("\n".join(out))
PY
"$bin" prepare --text "$tmp/own.txt" --vocab-size 300 --out "$tmp/own" --val-every 10 >/dev/null 2>&1
check_eq "prepare exit" 0 $?
out="$("$bin" train --model llama-tiny --data "$tmp/own" --seq 32 --micro-batch 2 --steps 4 \
  --save "$tmp/ckown" --sample-every 2 --sample-tokens 5 2>&1)"
check_eq "train --sample-every exit" 0 $?
check_eq "a sample at step 2 and one at the end" 2 "$(grep -c '^sample at step [24]: ' <<<"$out")"
t="$(gen --checkpoint "$tmp/ckown" --prompt $'the lord\nsaid' --max-new-tokens 6 --ignore-eos)"
check_eq "own tokenizer: exit" 0 $?
check_eq "own tokenizer: the prompt's two lines first" $'the lord\nsaid' "${t:0:13}"

# 4. BERT: --fill-mask on prepare --mlm's tokenizer, a line per [MASK]
"$bin" prepare --text "$tmp/own.txt" --vocab-size 300 --out "$tmp/mlm" --val-every 10 --mlm \
  >/dev/null 2>&1
check_eq "prepare --mlm exit" 0 $?
"$bin" train --model bert-tiny --data "$tmp/mlm" --seq 32 --micro-batch 2 --steps 2 \
  --save "$tmp/ckb" >/dev/null 2>&1
check_eq "train bert-tiny exit" 0 $?
f="$(gen --checkpoint "$tmp/ckb" --fill-mask "the lord [MASK] unto [MASK]")"
check_eq "--fill-mask exit" 0 $?
check_eq "the text, then a line per mask" 3 "$(lines "$f")"
check_eq "the text first" "the lord [MASK] unto [MASK]" "$(sed -n 1p <<<"$f")"
check_eq "5 candidates for the first" 5 "$(sed -n 2p <<<"$f" | grep -o '" 0\.[0-9]*' | wc -l)"
check_eq "--top-k 3 for the second" 3 \
  "$(gen --checkpoint "$tmp/ckb" --fill-mask "the lord [MASK] unto [MASK]" --top-k 3 |
    sed -n 3p | grep -o '" 0\.[0-9]*' | wc -l)"

# 5. a model's tokenizer.json (tests/hf_tokenizer: a byte-level BPE, and a
# BERT WordPiece whose specials sit after its vocabulary), through the
# tokenizers library: text after the prompt from a checkpoint and from its
# export; --fill-mask on BERT data prepared with it
hft="$TESSERA_HOME/tests/hf_tokenizer"
python3 - "$tmp/m2.jsonl" <<'PY'
import json, random, sys
r = random.Random(3)
w = "the beginning word light darkness water earth heaven".split()
with open(sys.argv[1], "w") as f:
    for i in range(300):
        f.write(json.dumps({"text": " ".join(r.choice(w) for _ in range(12))}) + "\n")
PY
"$bin" prepare --text "$tmp/m2.jsonl" --tokenizer "$hft/bpe_json" --out "$tmp/bpe" >/dev/null 2>&1
check_eq "prepare --tokenizer bpe_json exit" 0 $?
"$bin" train --model llama-tiny --data "$tmp/bpe" --seq 32 --micro-batch 2 --steps 2 \
  --save "$tmp/ckbpe" --sample-every 1 --prompt "the word" --sample-tokens 4 >"$tmp/bpe.log" 2>&1
check_eq "train --sample-every on tokenizer.json data: exit" 0 $?
check_eq "two samples" 2 "$(grep -c '^sample at step [12]: the word' "$tmp/bpe.log")"
t1="$(gen --checkpoint "$tmp/ckbpe" --prompt "the word" --max-new-tokens 6 --ignore-eos)"
check_eq "tokenizer.json: generate exit" 0 $?
check_eq "tokenizer.json: the prompt first" "the word" "${t1:0:8}"
"$bin" export "$tmp/ckbpe" --out "$tmp/hfbpe" >/dev/null 2>&1 && cp "$hft/bpe_json/"* "$tmp/hfbpe/"
check_eq "tokenizer.json: --hf gives the same text" "$t1" \
  "$(gen --hf "$tmp/hfbpe" --prompt "the word" --max-new-tokens 6 --ignore-eos)"
"$bin" prepare --text "$tmp/m2.jsonl" --tokenizer "$hft/bert_wordpiece" --mlm --out "$tmp/wp" \
  >/dev/null 2>&1
check_eq "prepare --mlm --tokenizer bert_wordpiece exit" 0 $?
sed -e 's/"vocab_size": 4096/"vocab_size": 364/' -e 's/"sep_token_id": 3/"sep_token_id": 362/' \
  "$TESSERA_HOME/models/configs/bert-tiny.json" >"$tmp/bert_wp.json"
"$bin" train --model "$tmp/bert_wp.json" --data "$tmp/wp" --seq 32 --micro-batch 2 --steps 2 \
  --save "$tmp/ckwp" >/dev/null 2>&1
check_eq "train BERT on its WordPiece data: exit" 0 $?
f="$(gen --checkpoint "$tmp/ckwp" --fill-mask "the word [MASK] light")"
check_eq "WordPiece --fill-mask exit" 0 $?
check_eq "WordPiece: a line per mask, 5 candidates" 5 \
  "$(sed -n 2p <<<"$f" | grep -o '" 0\.[0-9]*' | wc -l)"

# 6. bad input
exact "no model" 2 \
  "tessera generate: give one of --checkpoint DIR and --hf DIR (--help lists the flags)" \
  "$bin" generate --prompt-ids 1
exact "no prompt" 2 \
  "tessera generate: give one of --prompt TEXT, --prompt-ids IDS and --fill-mask TEXT (--help lists the flags)" \
  "$bin" generate --hf "$tmp/hf"
exact "--top-p 0" 2 "tessera generate: --top-p 0: expected in (0, 1]" \
  "$bin" generate --hf "$tmp/hf" --prompt-ids 1 --top-p 0
exact "--prompt-ids 1,x" 1 \
  "tessera generate: --prompt-ids 1,x: expected token ids separated by commas (\"1,2,3\")" \
  "$bin" generate --hf "$tmp/hf" --prompt-ids 1,x
exact "an id past the vocabulary" 1 \
  "tessera generate: prompt token 4096: expected 0..4095 of $tmp/hf/config.json" \
  "$bin" generate --hf "$tmp/hf" --prompt-ids 1,4096
max="$(sed -n 's/.*"max_position_embeddings":[[:space:]]*\([0-9]*\).*/\1/p' "$tmp/hf/config.json")"
exact "past max_position_embeddings" 1 \
  "tessera generate: a prompt of 2 tokens and $max new ones: $((max + 2)) positions, expected at most max_position_embeddings = $max of $tmp/hf/config.json" \
  "$bin" generate --hf "$tmp/hf" --prompt-ids 1,2 --max-new-tokens "$max"
exact "text without a tokenizer" 1 \
  "tessera generate: --prompt needs the model's tokenizer: $tmp/data (the checkpoint's training data) has no tokenizer.model nor tokenizer.json; give --tokenizer DIR (or --prompt-ids)" \
  "$bin" generate --checkpoint "$tmp/ck" --prompt "hello"
exact "--fill-mask on LLaMA" 1 \
  "tessera generate: --fill-mask needs a masked LM (BERT): $tmp/hf/config.json is a causal LM, expected --prompt" \
  "$bin" generate --hf "$tmp/hf" --fill-mask "a [MASK]"
exact "--prompt on BERT" 1 \
  "tessera generate: $tmp/ckb/step-00000002/config.json is a masked LM (BERT): it fills masks, expected --fill-mask \"... [MASK] ...\"" \
  "$bin" generate --checkpoint "$tmp/ckb" --prompt "a"
exact "--fill-mask without [MASK]" 1 \
  "tessera generate: --fill-mask \"no mask\": no [MASK], expected text with one or more [MASK]" \
  "$bin" generate --checkpoint "$tmp/ckb" --fill-mask "no mask"
exact "no checkpoint" 1 \
  "tessera generate: --checkpoint $tmp/none: no complete checkpoint there (a folder with index.json, or step-N folders holding one)" \
  "$bin" generate --checkpoint "$tmp/none" --prompt-ids 1

echo "$fails failure(s)"
((fails == 0))
