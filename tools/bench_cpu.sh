#!/usr/bin/env bash
# CPU training speed: tessera beside PyTorch, the same config, batch and
# threads, in one script run on this machine.
#
#   tools/bench_cpu.sh [STEPS] [ROUNDS]   (default 8, 2)
#
# First kernels/bench_matmul's table: every linear product of a llama-small
# step through tessera beside oneDNN's own primitive (M = 2048). Then, in
# ROUNDS interleaved rounds, one-rank training of
#   - llama-small, micro-batch 16 x 128: tessera fp32, bf16 on fp32 copies
#     through OpenBLAS (TESSERA_CPU_MATMUL=openblas, the path before oneDNN)
#     and bf16 through oneDNN; PyTorch (tools/peer/torch_cpu.py) fp32 eager
#     and bf16 eager under autocast;
#   - bert-base masked LM, micro-batch 8 x 128 (data/kjv-mlm): tessera fp32
#     and bf16; PyTorch fp32 and bf16 autocast eager;
# and, for information, PyTorch's torch.compile in bf16 once per model
# (round 1; compiled in its warm-up steps). OMP_NUM_THREADS = nproc for
# every run (PyTorch: torch.set_num_threads of the same).
#
# Prints a Markdown table per model: tokens/s per round (tessera: median over
# the steps after the first two; PyTorch: median over STEPS timed steps after
# 2 warm-up steps), each row's best over the rounds, and that best over
# PyTorch eager's best in the same dtype. With each run the path tessera's
# products took (`tessera train` prints it).
#
# PyTorch: PYTHON names an interpreter with torch and transformers; or
# TORCH_VENV=DIR uses DIR/bin/python, making the venv and installing torch
# and transformers there with pip first when it lacks them (network needed;
# CI never runs this). With neither, the PyTorch rows are left out.
# TESSERA_BIN as in tools/bench_env.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STEPS="${1:-8}"
ROUNDS="${2:-2}"
cd "$ROOT"
# shellcheck source=tools/bench_env.sh
source tools/bench_env.sh # BIN, DATA, TMP
tools/kjv.sh "$BIN" --mlm >/dev/null
DATA_MLM="$ROOT/data/kjv-mlm"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"

PY="${PYTHON:-}"
if [[ -z "$PY" && -n "${TORCH_VENV:-}" ]]; then
  PY="$TORCH_VENV/bin/python"
  if ! "$PY" -c "import torch, transformers" 2>/dev/null; then
    echo "bench_cpu: installing torch and transformers into $TORCH_VENV" >&2
    python3 -m venv "$TORCH_VENV"
    "$TORCH_VENV/bin/pip" install -q torch transformers >&2
  fi
fi
if [[ -n "$PY" ]] && ! "$PY" -c "import torch, transformers" 2>/dev/null; then
  echo "bench_cpu: $PY cannot import torch and transformers" >&2
  exit 1
fi

bazel build --ui_event_filters=-info,-progress --noshow_progress //kernels:bench_matmul
bazel-bin/kernels/bench_matmul 2048
echo

# name model dtype impl: impl is tessera, tessera-openblas, torch-eager or torch-compile
RUNS=("llama-small fp32 tessera" "llama-small bf16 tessera-openblas" "llama-small bf16 tessera"
  "bert-base fp32 tessera" "bert-base bf16 tessera")
[[ -z "$PY" ]] || RUNS+=("llama-small fp32 torch-eager" "llama-small bf16 torch-eager"
  "bert-base fp32 torch-eager" "bert-base bf16 torch-eager")
[[ -z "$PY" ]] || ONCE=("llama-small bf16 torch-compile" "bert-base bf16 torch-compile")
for ((r = 1; r <= ROUNDS; r++)); do
  runs=("${RUNS[@]}")
  ((r > 1)) || runs+=(${ONCE[@]+"${ONCE[@]}"})
  for run in "${runs[@]}"; do
    read -r model dtype impl <<<"$run"
    name="$model-$dtype-$impl-$r"
    if [[ "$model" == llama-small ]]; then b=16 data="$DATA"; else b=8 data="$DATA_MLM"; fi
    case "$impl" in
      tessera*)
        pre=(env)
        [[ "$impl" == tessera-openblas ]] && pre+=(TESSERA_CPU_MATMUL=openblas)
        "${pre[@]}" "$BIN" train --model "$model" --data "$data" --dtype "$dtype" \
          --steps $((STEPS + 2)) --micro-batch "$b" --seq 128 --lr 1e-4 --warmup 2 \
          --eval-batches 1 --log-every 1 --metrics "$TMP/$name.jsonl" >"$TMP/$name.log" 2>&1
        ;;
      torch-*)
        "$PY" tools/peer/torch_cpu.py --config "$model" --batch "$b" --seq 128 \
          --threads "$OMP_NUM_THREADS" --dtype "$dtype" --mode "${impl#torch-}" --steps "$STEPS" \
          --warmup 2 >"$TMP/$name.json" 2>"$TMP/$name.log"
        ;;
    esac
    echo "bench_cpu: $name done" >&2
  done
done

python3 - "$TMP" "$STEPS" "$ROUNDS" "$OMP_NUM_THREADS" "${RUNS[@]}" -- ${ONCE[@]+"${ONCE[@]}"} <<'PY'
import json, os, re, statistics, sys
tmp, steps, rounds, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rest = sys.argv[5:]
cut = rest.index("--")
runs, once = [r.split() for r in rest[:cut]], [r.split() for r in rest[cut + 1:]]

def rate(model, dtype, impl, r):
    name = f"{model}-{dtype}-{impl}-{r}"
    if impl.startswith("torch"):
        return json.load(open(os.path.join(tmp, name + ".json")))["tokens_per_s"], "PyTorch"
    recs = [json.loads(l) for l in open(os.path.join(tmp, name + ".jsonl"))]
    tps = [x["tokens_per_s"] for x in recs if "tokens_per_s" in x][2:]
    m = re.search(r"matrix products: (.*)", open(os.path.join(tmp, name + ".log")).read())
    return statistics.median(tps), (m.group(1).strip() if m else "?")

torch_version = "?"
for model, batch in (("llama-small", "16 x 128"), ("bert-base", "8 x 128 (masked LM)")):
    rows = []
    for m, dtype, impl in runs + once:
        if m != model:
            continue
        rs = [1] if [m, dtype, impl] in once else range(1, rounds + 1)
        got = [rate(m, dtype, impl, r) for r in rs]
        rows.append((dtype, impl, [g[0] for g in got], got[0][1]))
    peer = {d: max(x) for d, i, x, _ in rows if i == "torch-eager"}
    print(f"\n{model}, micro-batch {batch}, one rank, {threads} threads, {steps} timed steps, "
          f"{rounds} rounds")
    print("| run | dtype | products | " + " | ".join(f"tokens/s round {r}" for r in range(1, rounds + 1))
          + " | best | best / PyTorch eager |")
    print("| :--- | :--- | :--- | " + " | ".join("---:" for _ in range(rounds)) + " | ---: | ---: |")
    for dtype, impl, rates, how in rows:
        cells = [f"{x:.0f}" for x in rates] + ["-"] * (rounds - len(rates))
        ratio = f"{max(rates) / peer[dtype]:.2f}" if dtype in peer else "-"
        label = {"tessera": "tessera", "tessera-openblas": "tessera (fp32 copies)",
                 "torch-eager": "PyTorch eager", "torch-compile": "PyTorch torch.compile"}[impl]
        print(f"| {label} | {dtype} | {how} | " + " | ".join(cells) + f" | {max(rates):.0f} | {ratio} |")
PY
if [[ -n "$PY" ]]; then
  "$PY" -c "import torch, transformers; print(f'PyTorch {torch.__version__}, transformers {transformers.__version__}')"
fi
