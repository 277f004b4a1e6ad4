#!/usr/bin/env bash
# bert_test.sh — BERT's masked LM through the command line, on a generated
# corpus and a small BERT config:
#  1. prepare --mlm: a tokenizer whose ids 0-4 are [PAD] [UNK] [CLS] [SEP]
#     [MASK], and meta.json saying so;
#  2. train on 2 ranks at ZeRO-3 (and through 2 pipeline stages): exit 0,
#     the masked-token loss and accuracy beside the unigram baselines, the
#     metrics' val_accuracy;
#  3. resume from the middle gives a final checkpoint byte-identical to the
#     uninterrupted run's; export writes a BertForMaskedLM folder that
#     --init-from reads;
#  4. estimate takes bert-base;
#  5. bad input, one line each with its exit code: data prepared without
#     --mlm, a config missing a field, position_embedding_type
#     "relative_key", a nonzero dropout, a [PAD] id that is not the data's;
#  6. prepare --mlm with a model's WordPiece tokenizer.json (specials at
#     361-363): its ids kept, a BERT with that [SEP] trains, another refused.
#   bert_test.sh TESSERA_BIN LAUNCH_SH
set -uo pipefail
bin="$1"
launch="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fails=0
source "$(dirname "${BASH_SOURCE[0]}")/testing.sh"
presets_home
mpi_scratch

# A corpus of 120 paragraphs of seeded words (vocabulary ~40 words).
make_mlm_corpus "$tmp/text.txt"

# 1. prepare --mlm (and without, for the refusal below)
out="$("$bin" prepare --text "$tmp/text.txt" --vocab-size 400 --val-every 6 --out "$tmp/mlm" --mlm 2>&1)"
check_eq "prepare --mlm exit" 0 $?
check "prepare --mlm says so" "[PAD] [UNK] [CLS] [SEP] [MASK] = 0-4" "$out"
meta="$(tr -d ' \t\n' <"$tmp/mlm/meta.json")"
check "meta: mlm" '"mlm":true' "$meta"
check "meta: ids" '"special_ids":{"pad":0,"unk":1,"cls":2,"sep":3,"mask":4,"newline":5}' "$meta"
"$bin" prepare --text "$tmp/text.txt" --vocab-size 400 --val-every 6 --out "$tmp/causal" >/dev/null 2>&1
check_eq "prepare (causal) exit" 0 $?

cfg() { # cfg FILE [EXTRA-JSON-FIELDS] — a small BERT for this corpus
  cat >"$1" <<JSON
{"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 32,
 "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 400,
 "max_position_embeddings": 64, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
 "hidden_act": "gelu_new", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
 "pad_token_id": 0, "sep_token_id": 3${2:-}}
JSON
}
cfg "$tmp/bert.json"
common=(--model "$tmp/bert.json" --data "$tmp/mlm" --seq 32 --micro-batch 2 --steps 6
  --log-every 1 --eval-batches 2)

# 2. 2 ranks, ZeRO-3; 2 pipeline stages
a="$("$launch" -n 2 "$bin" train "${common[@]}" --zero 3 --save "$tmp/a" --save-every 3 \
  --metrics "$tmp/a.jsonl" 2>&1)"
check_eq "ZeRO-3 on 2 ranks: exit" 0 $?
check "masked-token loss beside the unigram baseline" "masked-token validation loss" "$a"
check "unigram baseline" "(unigram baseline" "$a"
check "masked-token accuracy beside its unigram baseline" "(unigram baseline " \
  "$(grep '^masked-token accuracy' <<<"$a")"
check "metrics: val_accuracy" '"val_accuracy":' "$(grep val_loss "$tmp/a.jsonl" | tail -n 1)"
p="$("$launch" -n 2 "$bin" train "${common[@]}" --zero 1 --pipeline 2 --grad-accum 2 2>&1)"
check_eq "2 pipeline stages: exit" 0 $?
check "2 pipeline stages: accuracy" "masked-token accuracy" "$p"

# 3. resume, export, --init-from
b="$("$launch" -n 2 "$bin" train "${common[@]}" --zero 3 --resume "$tmp/a/step-00000003" \
  --save "$tmp/b" 2>&1)"
check_eq "resume: exit" 0 $?
check_eq "resume: steps 4-6 print the same" "$(steps "$a" | tail -n 3)" "$(steps "$b")"
check_eq "resume: final checkpoint byte-identical" "$(shas "$tmp/a/step-00000006")" \
  "$(shas "$tmp/b/step-00000006")"
"$bin" export "$tmp/a" --out "$tmp/hf" >/dev/null 2>&1
check_eq "export exit" 0 $?
check "export: a BertForMaskedLM folder" '"BertForMaskedLM"' "$(cat "$tmp/hf/config.json")"
"$bin" train --init-from "$tmp/hf" --model "$tmp/hf" --data "$tmp/mlm" --seq 32 --micro-batch 2 \
  --steps 1 >/dev/null 2>&1
check_eq "--init-from the export: exit" 0 $?

# 4. estimate takes the presets
e="$("$bin" estimate --model bert-base -n 4 --micro-batch 8 --seq 128 2>&1)"
check_eq "estimate bert-base: exit" 0 $?
check "estimate bert-base: its parameters" "109.51" "$e"
absent "estimate bert-base: one header, the model's" "Ψ given" "$e"

# 5. bad input: one line each
bad() { # bad NAME EXIT EXPECTED-SUBSTRING CMD...
  local name="$1" code="$2" want="$3"
  shift 3
  local o
  o="$("$@" 2>&1)"
  check_eq "$name: exit" "$code" $?
  check "$name: message" "$want" "$o"
  check_eq "$name: one line" 1 "$(lines "$o")"
}
one=(--data "$tmp/mlm" --seq 32 --micro-batch 2 --steps 1)
bad "data without --mlm" 1 "meta.json: field \"mlm\" missing: expected true" \
  "$bin" train --model "$tmp/bert.json" --data "$tmp/causal" --seq 32 --micro-batch 2 --steps 1
python3 - "$tmp/bert.json" "$tmp" <<'PY'
import json, sys
base = json.load(open(sys.argv[1]))
def write(name, **changes):
    c = dict(base)
    for k, v in changes.items():
        if v is None: c.pop(k)
        else: c[k] = v
    json.dump(c, open(f"{sys.argv[2]}/{name}.json", "w"))
write("missing", layer_norm_eps=None)
write("relative", position_embedding_type="relative_key")
write("dropout", hidden_dropout_prob=0.1)
write("pad", pad_token_id=1)
PY
bad "missing field" 1 "missing.json: missing field \"layer_norm_eps\"" \
  "$bin" train --model "$tmp/missing.json" "${one[@]}"
bad "relative positions" 1 "relative.json: field \"position_embedding_type\" = \"relative_key\"" \
  "$bin" train --model "$tmp/relative.json" "${one[@]}"
bad "dropout" 1 "dropout.json: field \"hidden_dropout_prob\" = 0.1: expected 0.0" \
  "$bin" train --model "$tmp/dropout.json" "${one[@]}"
bad "[PAD] not the data's" 1 "pad_token_id 1, sep_token_id 3: expected those of" \
  "$bin" train --model "$tmp/pad.json" "${one[@]}"
bad "2 ranks: data without --mlm" 1 "meta.json: field \"mlm\" missing" \
  "$launch" -n 2 "$bin" train --model "$tmp/bert.json" --data "$tmp/causal" --seq 32 \
  --micro-batch 2 --steps 1

# 6. a model's own WordPiece (tests/hf_tokenizer/bert_wordpiece: [CLS] [SEP]
# [MASK] at 361-363): prepare --mlm --tokenizer keeps its ids, a BERT whose
# sep_token_id is the tokenizer's trains on it, one whose is not is refused
wp="$TESSERA_HOME/tests/hf_tokenizer/bert_wordpiece"
"$bin" prepare --text "$tmp/text.txt" --tokenizer "$wp" --mlm --val-every 6 --out "$tmp/wp" \
  >/dev/null 2>&1
check_eq "prepare --mlm --tokenizer exit" 0 $?
check "its own ids" '"special_ids":{"pad":0,"unk":1,"cls":361,"sep":362,"mask":363}' \
  "$(tr -d ' \t\n' <"$tmp/wp/meta.json")"
cfg "$tmp/bert_wp.json"
sed -i 's/"sep_token_id": 3/"sep_token_id": 362/' "$tmp/bert_wp.json"
out="$("$bin" train --model "$tmp/bert_wp.json" --data "$tmp/wp" --seq 32 --micro-batch 2 \
  --steps 2 --eval-batches 1 2>&1)"
check_eq "train on a model's own ids: exit" 0 $?
check "masked-token loss" "masked-token validation loss" "$out"
exact "[SEP] not the data's" 1 \
  "tessera train: $tmp/bert.json: pad_token_id 0, sep_token_id 3: expected those of $tmp/wp/meta.json ([PAD] 0, [SEP] 362)" \
  "$bin" train --model "$tmp/bert.json" --data "$tmp/wp" --seq 32 --micro-batch 2 --steps 1

echo "$fails failure(s)"
((fails == 0))
