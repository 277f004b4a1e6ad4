#!/usr/bin/env bash
# kjv.sh — makes the default corpus once: the King James Bible from Debian's
# bible-kjv (`bible -l0 gen1:1-rev22:21`) tokenised by `tessera prepare`
# (SentencePiece BPE, 4096 tokens) into ROOT/data/kjv/{train,val}.bin.
#   tools/kjv.sh TESSERA_BIN      prints nothing when the shards exist
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$1"
DATA="$ROOT/data/kjv"
if [[ ! -f "$DATA/train.bin" || ! -f "$DATA/val.bin" ]]; then
  mkdir -p "$ROOT/data"
  echo "extracting the King James Bible (bible -l0 gen1:1-rev22:21)"
  bible -l0 gen1:1-rev22:21 >"$ROOT/data/kjv.txt.tmp"
  mv "$ROOT/data/kjv.txt.tmp" "$ROOT/data/kjv.txt"
  "$BIN" prepare --text "$ROOT/data/kjv.txt" --vocab-size 4096 --out "$DATA"
fi
