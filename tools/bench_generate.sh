#!/usr/bin/env bash
# bench_generate.sh — `tessera generate` against transformers' generate on
# the CPU: the same LLaMA model (a preset config, random weights from
# torch, saved with save_pretrained in fp32), the same prompt ids, greedy,
# the same thread count, and their tokens compared.
#
#   tools/bench_generate.sh TESSERA_BIN [PRESET] [NEW] [THREADS]
#
# PRESET default llama-124m, NEW tokens default 128 after a 16-id prompt,
# THREADS default the cores (OMP_NUM_THREADS for tessera,
# torch.set_num_threads for PyTorch). Needs a Python with torch and
# transformers (PYTHON, default python3). Each side's time covers the
# prompt's forward and every new token (not loading); tessera's is the
# figure `generate` prints. Prints one line per side (seconds, tokens/s)
# and "tokens: equal" or the first position that differs (exit 1).
set -euo pipefail
BIN="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
PRESET="${2:-llama-124m}"
NEW="${3:-128}"
THREADS="${4:-$(nproc)}"
PY="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$PY" -c 'import torch, transformers' 2>/dev/null ||
  { echo "bench_generate.sh: $PY needs torch and transformers" >&2; exit 2; }
T="${BENCH_TMP:-$(mktemp -d /tmp/bench_generate.XXXXXX)}"
[[ -n "${BENCH_TMP:-}" ]] || trap 'rm -rf "$T"' EXIT
PROMPT="$(seq -s, 101 16 356)" # 16 ids
"$PY" - "$ROOT/models/configs/$PRESET.json" "$T/hf" "$PROMPT" "$NEW" "$THREADS" >"$T/torch.txt" <<'PY'
import json, sys, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM
cfg_path, out, prompt, new, threads = sys.argv[1:6]
torch.manual_seed(0)
torch.set_num_threads(int(threads))
cfg = json.load(open(cfg_path))
model = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
model.save_pretrained(out, safe_serialization=True)
ids = torch.tensor([[int(x) for x in prompt.split(",")]])
with torch.no_grad():
    model.generate(ids, do_sample=False, max_new_tokens=4, eos_token_id=None, pad_token_id=0)
    t0 = time.perf_counter()
    seq = model.generate(ids, do_sample=False, max_new_tokens=int(new), eos_token_id=None,
                         pad_token_id=0)
    dt = time.perf_counter() - t0
print(" ".join(str(t) for t in seq[0, ids.shape[1]:].tolist()))
print(f"{dt:.3f} {int(new) / dt:.1f} {torch.__version__}")
PY
OMP_NUM_THREADS="$THREADS" "$BIN" generate --hf "$T/hf" --prompt-ids "$PROMPT" \
  --max-new-tokens "$NEW" >"$T/tessera.txt" 2>"$T/tessera.err"
read -r tsec ttps tver < <(sed -n 2p "$T/torch.txt")
line="$(cat "$T/tessera.err")"
secs="$(sed -n 's/.* new in \([0-9.]*\) s (\([0-9.]*\) tokens.*/\1 \2/p' <<<"$line")"
echo "model $PRESET (random weights, fp32), prompt 16 ids, $NEW new tokens, greedy, $THREADS threads"
echo "tessera generate (key/value cache):    ${secs% *} s, ${secs#* } tokens/s"
echo "transformers generate (torch $tver): $tsec s, $ttps tokens/s"
a="$(sed -n 1p "$T/torch.txt")"
b="$(cat "$T/tessera.txt")"
if [[ "$a" == "$b" ]]; then
  echo "tokens: equal"
else
  python3 - "$a" "$b" <<'PY'
import sys
a, b = sys.argv[1].split(), sys.argv[2].split()
i = next(i for i in range(min(len(a), len(b)) + 1) if i == min(len(a), len(b)) or a[i] != b[i])
print(f"tokens: differ first at new token {i} (transformers {a[i:i+1]}, tessera {b[i:i+1]})")
PY
  exit 1
fi
