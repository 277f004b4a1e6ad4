#!/usr/bin/env python3
"""make_fixtures.py — the fixtures of tools/prepare_test's Hugging Face
tokenizer cases: a LLaMA-style SentencePiece tokenizer trained here by the
sentencepiece library (no hub), and the token ids transformers gives for a
multilingual sample.

    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install transformers sentencepiece tokenizers protobuf
    /tmp/hfvenv/bin/python tests/hf_tokenizer/make_fixtures.py tests/hf_tokenizer

Writes into OUT:
  llama_sp/tokenizer.model        SentencePiece BPE as LLaMA-2's: byte fallback,
                                  split digits, a dummy prefix, whitespace kept,
                                  <unk> <s> </s> = 0 1 2
  llama_sp/tokenizer_config.json  LlamaTokenizer, add_bos_token true, add_eos_token false
  llama_sp_eos/...                the same model, add_eos_token true
  llama_sp_json/...               the same model with a tokenizer.json as the hub's
                                  LLaMA-2 folders have (a "▁" before every text)
  bpe_json/tokenizer.json         a byte-level BPE as GPT-2's and LLaMA-3's, trained here by
                                  the tokenizers library (ByteLevel pre-tokenizer and
                                  decoder, 600 tokens, <|begin_of_text|> prepended by its
                                  TemplateProcessing post-processor, <|end_of_text|> special)
  wordpiece_json/tokenizer.json   a WordPiece as BERT's (BertNormalizer lowercasing,
                                  BertPreTokenizer, [CLS] $A [SEP]), trained here too
  bert_wordpiece/...               a WordPiece whose [CLS] [SEP] [MASK] come after the
                                  vocabulary (not ids 0-4); samples.json has its ids
                                  without special tokens and the five specials' ids
  */tokenizer_config.json         PreTrainedTokenizerFast for the three above
  samples.parquet                 the samples as a Parquet column "text" (pyarrow), and
  samples.jsonl                   the same as JSON Lines: prepare must give the same shards
  bad_null.parquet, bad_int.parquet  a null text, a column of numbers (refused)
  samples.json                    {"samples": [text...], "llama_sp": [[ids]...],
                                  "llama_sp_eos": [[ids]...], "llama_sp_json": ...}: AutoTokenizer's
                                  input_ids (transformers 5 converts
                                  tokenizer.model into a tokenizers BPE with a
                                  Metaspace pre-tokenizer; the folders have no
                                  tokenizer.json)
CI never runs this: the outputs are committed. The tokenizers library's
WordPiece training is not reproducible from run to run (the order of its
alphabet varies): a rerun changes wordpiece_json/ and bert_wordpiece/ and
their ids together, so commit a run's outputs whole.
"""
import io
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import sentencepiece as spm
import tokenizers
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer

# Training text: English, accented Latin, Greek, CJK, with whitespace runs;
# deterministic. The samples hold characters it lacks (emoji, some CJK),
# which only the byte fallback encodes.
TRAIN = []
words = ["the", "beginning", "word", "light", "darkness", "water", "earth", "heaven",
         "café", "naïve", "Ærø", "façade", "Ελληνικά", "λόγος", "日本語", "中文", "東京"]
for i in range(3000):
    w = [words[(i * 7 + k * 3) % len(words)] for k in range(1 + i % 9)]
    sep = "  " if i % 11 == 0 else " "
    TRAIN.append(sep.join(w) + (" %d" % (i * 37 % 1000) if i % 5 == 0 else ""))

SAMPLES = [
    "In the beginning was the Word.",
    "café naïve façade Ærø — déjà vu",
    "Ελληνικά: ο λόγος",
    "日本語と中文、東京タワー",
    "emoji 🙂🚀 and 👩‍👩‍👧",
    "  leading spaces, double  spaces,\ttabs\tand trailing   ",
    "line one\nline two\n\nafter a blank line\n",
    "digits 1234567 and 3.14159",
    "unknown: ☃ ∮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "",
    "▁ a literal meta symbol",
    " ",
    "▁",
    "   ",
]


def write_dir(out, name, add_eos, model_bytes):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.model"), "wb") as f:
        f.write(model_bytes)
    cfg = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True,
           "add_eos_token": add_eos, "bos_token": "<s>", "eos_token": "</s>",
           "unk_token": "<unk>", "legacy": True, "model_max_length": 2048}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    return d


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAIN), model_writer=model, model_type="bpe", vocab_size=480,
        byte_fallback=True, split_digits=True, character_coverage=0.9995,
        add_dummy_prefix=True, remove_extra_whitespaces=False, normalization_rule_name="identity",
        allow_whitespace_only_pieces=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1, minloglevel=2)
    result = {"transformers": transformers.__version__, "sentencepiece": spm.__version__,
              "samples": SAMPLES}
    for name, add_eos in (("llama_sp", False), ("llama_sp_eos", True)):
        d = write_dir(out, name, add_eos, model.getvalue())
        tok = AutoTokenizer.from_pretrained(d)
        result[name] = [tok(s)["input_ids"] for s in SAMPLES]
    # A folder that also has tokenizer.json as LLaMA-2's and TinyLlama's on
    # the hub: a Prepend("▁") + Replace(" ", "▁") normalizer and no
    # pre-tokenizer, so every text gets the "▁" prefix, a leading space too.
    d = write_dir(out, "llama_sp_json", False, model.getvalue())
    backend = AutoTokenizer.from_pretrained(d).backend_tokenizer
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                               normalizers.Replace(" ", "\u2581")])
    backend.pre_tokenizer = None
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    backend.save(os.path.join(d, "tokenizer.json"))
    tok = AutoTokenizer.from_pretrained(d)
    result["llama_sp_json"] = [tok(s)["input_ids"] for s in SAMPLES]
    # tokenizer.json models of the tokenizers library, trained on the same text
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TRAIN, trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    bpe.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)])
    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.normalizer = normalizers.BertNormalizer(lowercase=True)
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.decoder = decoders.WordPiece()
    wp.train_from_iterator(TRAIN, trainers.WordPieceTrainer(
        vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        show_progress=False))
    wp.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    for name, t, cfg in (
            ("bpe_json", bpe, {"tokenizer_class": "PreTrainedTokenizerFast",
                               "bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}),
            ("wordpiece_json", wp, {"tokenizer_class": "PreTrainedTokenizerFast",
                                    "cls_token": "[CLS]", "sep_token": "[SEP]",
                                    "mask_token": "[MASK]", "pad_token": "[PAD]",
                                    "unk_token": "[UNK]"})):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        t.save(os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        tok = AutoTokenizer.from_pretrained(d)
        result[name] = [tok(s)["input_ids"] for s in SAMPLES]
    # BERT-like specials that are not ids 0-4: [PAD] 0 and [UNK] 1 trained in,
    # [CLS] [SEP] [MASK] added after the vocabulary (as a model's own ids sit
    # anywhere: bert-base-uncased's are 0 and 100-103); prepare --mlm reads
    # them and stores the text tokens alone (add_special_tokens=False).
    bw = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    bw.normalizer = normalizers.BertNormalizer(lowercase=True)
    bw.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    bw.decoder = decoders.WordPiece()
    bw.train_from_iterator(TRAIN, trainers.WordPieceTrainer(
        vocab_size=400, special_tokens=["[PAD]", "[UNK]"], show_progress=False))
    bw.add_special_tokens(["[CLS]", "[SEP]", "[MASK]"])
    cls_id, sep_id = bw.token_to_id("[CLS]"), bw.token_to_id("[SEP]")
    bw.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    d = os.path.join(out, "bert_wordpiece")
    os.makedirs(d, exist_ok=True)
    bw.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]",
                   "sep_token": "[SEP]", "mask_token": "[MASK]", "pad_token": "[PAD]",
                   "unk_token": "[UNK]"}, f, indent=2)
        f.write("\n")
    tok = AutoTokenizer.from_pretrained(d)
    result["bert_wordpiece_plain"] = [tok(s_, add_special_tokens=False)["input_ids"]
                                      for s_ in SAMPLES]
    result["bert_wordpiece_special"] = {n: tok.convert_tokens_to_ids(n) for n in
                                        ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")}
    result["tokenizers"] = tokenizers.__version__
    # The samples as Parquet and as JSON Lines, the same records in order
    pq.write_table(pa.table({"text": SAMPLES, "n": list(range(len(SAMPLES)))}),
                   os.path.join(out, "samples.parquet"), compression="zstd")
    # Parquet that prepare refuses in one line: a null text, a column of numbers
    pq.write_table(pa.table({"text": ["fine", None]}), os.path.join(out, "bad_null.parquet"))
    pq.write_table(pa.table({"text": [1, 2]}), os.path.join(out, "bad_int.parquet"))
    with open(os.path.join(out, "samples.jsonl"), "w") as f:
        for s_ in SAMPLES:
            f.write(json.dumps({"text": s_}, ensure_ascii=False) + "\n")
    with open(os.path.join(out, "samples.json"), "w") as f:  # a list a line
        items = ['  %s: %s' % (json.dumps(k), json.dumps(v, ensure_ascii=False) if not
                               isinstance(v, list) else "[\n" + ",\n".join(
                                   "    " + json.dumps(x, ensure_ascii=False) for x in v) + "\n  ]")
                 for k, v in result.items()]
        f.write("{\n" + ",\n".join(items) + "\n}\n")


if __name__ == "__main__":
    main()
