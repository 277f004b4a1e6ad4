#!/usr/bin/env bash
# bench_prepare.sh — `tessera prepare --tokenizer` against Hugging Face's own
# tokenizer on the King James Bible: the same documents through both, their
# ids compared token for token, and each side's MB/s.
#
#   tools/bench_prepare.sh TESSERA_BIN [VOCAB]
#
# Needs Debian's bible-kjv (`bible`) and a Python with sentencepiece,
# transformers and tokenizers (PYTHON, default python3; e.g.
# python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install transformers
# sentencepiece tokenizers protobuf). In BENCH_TMP (default a fresh folder
# under /tmp, removed at the end):
#  1. kjv.jsonl: the Bible's chapters (`bible -l0`, split at each heading
#     line such as "Genesis 1"), one JSON Lines record each;
#  2. a LLaMA-style SentencePiece tokenizer trained on it by the
#     sentencepiece library (BPE, VOCAB pieces, default 16000; byte fallback,
#     split digits, a dummy prefix) in hf/ with tokenizer_config.json;
#     and a byte-level BPE of the same size trained by the tokenizers
#     library (GPT-2's pre-tokenizer, a BOS by its post-processor) in hfj/
#     as tokenizer.json alone;
#  3. for each: tessera prepare --tokenizer DIR --val-every 2, timed (hfj/
#     through the Python helper, tools/py_helper.h);
#  4. transformers' AutoTokenizer on DIR, the records batch-encoded
#     (tokenizers' parallel batch encoding, its default threads), timed; its
#     ids for records 0, 2, 4, ... concatenated must equal train.bin, those of
#     1, 3, ... val.bin.
# Prints, per tokenizer, one line per side (seconds, MB/s of text) and "ids:
# equal" or the first record that differs; exits 1 when they differ.
set -euo pipefail
BIN="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
VOCAB="${2:-16000}"
PY="${PYTHON:-python3}"
command -v bible >/dev/null || { echo "bench_prepare.sh: needs Debian's bible-kjv (bible)" >&2; exit 2; }
"$PY" -c 'import sentencepiece, transformers, tokenizers' 2>/dev/null ||
  { echo "bench_prepare.sh: $PY needs sentencepiece, transformers and tokenizers" >&2; exit 2; }
own=0
if [[ -z "${BENCH_TMP:-}" ]]; then BENCH_TMP="$(mktemp -d /tmp/bench_prepare.XXXXXX)"; own=1; fi
trap '((own)) && rm -rf "$BENCH_TMP"' EXIT
cd "$BENCH_TMP"
bible -l0 gen1:1-rev22:21 >kjv.txt
"$PY" - "$VOCAB" <<'PY' 2>&1 | grep -v 'PyTorch was not found'
import io, json, os, re, sys
import sentencepiece as spm
text = open("kjv.txt", encoding="utf-8").read()
# a chapter starts at its heading line ("Genesis 1"; the verses are indented)
starts = [m.start() for m in re.finditer(r"^\S.* \d+$", text, flags=re.M)] or [0]
starts[0] = 0
docs = [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]
with open("kjv.jsonl", "w", encoding="utf-8") as f:
    for d in docs:
        f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
model = io.BytesIO()
spm.SentencePieceTrainer.train(
    sentence_iterator=iter(text.splitlines()), model_writer=model, model_type="bpe",
    vocab_size=int(sys.argv[1]), byte_fallback=True, split_digits=True, character_coverage=1.0,
    add_dummy_prefix=True, remove_extra_whitespaces=False, normalization_rule_name="identity",
    allow_whitespace_only_pieces=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=2,
    minloglevel=2)
os.makedirs("hf", exist_ok=True)
open("hf/tokenizer.model", "wb").write(model.getvalue())
json.dump({"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
           "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
          open("hf/tokenizer_config.json", "w"))
# the same size of byte-level BPE (as GPT-2's) by the tokenizers library, as tokenizer.json alone
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
bpe = Tokenizer(models.BPE())
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.train_from_iterator(text.splitlines(), trainers.BpeTrainer(
    vocab_size=int(sys.argv[1]), special_tokens=["<|begin_of_text|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
bpe.post_processor = processors.TemplateProcessing(
    single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)])
os.makedirs("hfj", exist_ok=True)
bpe.save("hfj/tokenizer.json")
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>"},
          open("hfj/tokenizer_config.json", "w"))
print("corpus: %d chapters, %.2f MB; tokenizers: %s pieces (tokenizer.model; tokenizer.json)" % (len(docs), len(text.encode()) / 1e6, sys.argv[1]))
PY
for kind in model json; do
dir=hf; [[ $kind == json ]] && dir=hfj
t0=$(date +%s.%N)
"$BIN" prepare --text kjv.jsonl --tokenizer "$dir" --val-every 2 --out "out-$kind" >"prepare-$kind.log"
t1=$(date +%s.%N)
"$PY" - "$t0" "$t1" "$dir" "out-$kind" <<'PY' 2>&1 | grep -v 'PyTorch was not found'
import json, struct, sys, time
from transformers import AutoTokenizer
docs = [json.loads(l)["text"] for l in open("kjv.jsonl", encoding="utf-8")]
mb = sum(len(d.encode()) for d in docs) / 1e6
folder, out = sys.argv[3], sys.argv[4]
print("%s/%s:" % (folder, "tokenizer.json" if folder == "hfj" else "tokenizer.model"))
tok = AutoTokenizer.from_pretrained(folder)
t = time.perf_counter()
ids = tok(docs)["input_ids"]
hf_s = time.perf_counter() - t
tess_s = float(sys.argv[2]) - float(sys.argv[1])
print("tessera prepare --tokenizer: %.2f s, %.1f MB/s (whole command: read, encode, write shards)" % (tess_s, mb / tess_s))
print("transformers AutoTokenizer:  %.2f s, %.1f MB/s (batch encoding alone)" % (hf_s, mb / hf_s))
def shard(p):
    b = open(p, "rb").read()
    magic, _, n = struct.unpack("<3i", b[:12])
    fmt = "H" if magic == 20240520 else "I"
    return list(struct.unpack("<%d%s" % (n, fmt), b[1024:]))
bad = None
for name, part in (("train", 0), ("val", 1)):
    got, pos = shard("%s/%s.bin" % (out, name)), 0
    for i in range(part, len(docs), 2):
        want = ids[i]
        if got[pos:pos + len(want)] != want:
            bad = bad or (name, i)
            break
        pos += len(want)
    if pos != len(got):
        bad = bad or (name, "length")
if bad:
    print("ids: differ (%s, record %s)" % bad)
    sys.exit(1)
print("ids: equal (%d records, %d tokens)" % (len(docs), sum(map(len, ids))))
PY
done
