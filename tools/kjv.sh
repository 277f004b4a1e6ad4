#!/usr/bin/env bash
# kjv.sh — makes the default corpus once: the King James Bible from Debian's
# bible-kjv (`bible -l0 gen1:1-rev22:21`) tokenised by `tessera prepare`
# (SentencePiece BPE, 4096 tokens) into ROOT/data/kjv/{train,val}.bin, or
# with --mlm (a masked-LM tokenizer: [PAD] [UNK] [CLS] [SEP] [MASK]) into
# ROOT/data/kjv-mlm/.
#   tools/kjv.sh TESSERA_BIN [--mlm]   prints nothing when the shards exist
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$1"
MLM="${2:-}"
DATA="$ROOT/data/kjv${MLM:+-mlm}"
if [[ ! -f "$ROOT/data/kjv.txt" ]]; then
  mkdir -p "$ROOT/data"
  echo "extracting the King James Bible (bible -l0 gen1:1-rev22:21)"
  bible -l0 gen1:1-rev22:21 >"$ROOT/data/kjv.txt.tmp"
  mv "$ROOT/data/kjv.txt.tmp" "$ROOT/data/kjv.txt"
fi
if [[ ! -f "$DATA/train.bin" || ! -f "$DATA/val.bin" ]]; then
  "$BIN" prepare --text "$ROOT/data/kjv.txt" --vocab-size 4096 --out "$DATA" $MLM
fi
