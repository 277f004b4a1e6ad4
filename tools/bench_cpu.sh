#!/usr/bin/env bash
# CPU training speed: tessera beside PyTorch, the same config, batch and
# threads, in one script run on this machine.
#
#   tools/bench_cpu.sh [STEPS] [ROUNDS]   (default 8, 2)
#   ISA=avx2|avx512|amx tools/bench_cpu.sh ...   the same under an instruction-set cap
#
# ISA caps both sides of the comparison in the same way, so one machine
# gives the table of every tier it has: oneDNN (ONEDNN_MAX_CPU_ISA, for
# tessera's products and PyTorch's bf16 ones), OpenBLAS (OPENBLAS_CORETYPE),
# PyTorch's own kernels (ATEN_CPU_CAPABILITY) and MKL, PyTorch's fp32 GEMM
# (MKL_ENABLE_INSTRUCTIONS); tessera's AdamW follows oneDNN's cap.
#   avx2    AVX2 / Haswell / avx2 / AVX2 (no native bf16 products)
#   avx512  AVX512_CORE_BF16 / SkylakeX / avx512 / AVX512 (AVX-512, with
#           its bf16 instructions where the CPU has them; no AMX)
#   amx     AVX512_CORE_AMX / SapphireRapids / avx512 / AVX512_E4, only on
#           a CPU with AMX (else the script says so and exits 0)
#   unset   no cap: what each library picks
#
# First kernels/bench_matmul's table: every linear product of a llama-small
# step through tessera beside oneDNN's own primitive (M = 2048). Then, in
# ROUNDS interleaved rounds, one-rank training of
#   - llama-small, micro-batch 16 x 128: tessera fp32, bf16 on fp32 copies
#     through OpenBLAS (TESSERA_CPU_MATMUL=openblas, the path before oneDNN)
#     and bf16 on its own path (oneDNN with native bf16; without it, as
#     under the AVX2 cap, tessera's own product, kernels/cpu/gemm_half.c); PyTorch
#     (tools/peer/torch_cpu.py) fp32 eager
#     and bf16 eager under autocast;
#   - bert-base masked LM, micro-batch 8 x 128 (data/kjv-mlm): tessera fp32
#     and bf16; PyTorch fp32 and bf16 autocast eager;
# and, for information, PyTorch's torch.compile in bf16 once per model
# (round 1; compiled in its warm-up steps). OMP_NUM_THREADS = nproc for
# every run (PyTorch: torch.set_num_threads of the same).
#
# Then where each step's time goes, from round 1's runs: tessera's op
# times (TESSERA_OP_TIMES=1: wall time of its ops by kind, steps 2 on;
# kernels/kernels.h ts_k_op_times) beside PyTorch's profile of 2 more steps
# (tools/peer/torch_cpu.py --breakdown: self time of its ops by the same
# kinds), as seconds per step: products, attention, elementwise (tessera's
# copies included), optimizer, and the rest of the step outside the ops
# (the host's own work and threads waiting for each other).
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
ISA="${ISA:-}"
case "$ISA" in
  "") ;;
  avx2) export ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell \
    ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ;;
  avx512) export ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 DNNL_MAX_CPU_ISA=AVX512_CORE_BF16 \
    OPENBLAS_CORETYPE=SkylakeX ATEN_CPU_CAPABILITY=avx512 MKL_ENABLE_INSTRUCTIONS=AVX512 ;;
  amx)
    if ! grep -qw amx_bf16 /proc/cpuinfo; then
      echo "bench_cpu: ISA=amx: this CPU has no AMX (no amx_bf16 in /proc/cpuinfo)"
      exit 0
    fi
    export ONEDNN_MAX_CPU_ISA=AVX512_CORE_AMX DNNL_MAX_CPU_ISA=AVX512_CORE_AMX \
      OPENBLAS_CORETYPE=SapphireRapids ATEN_CPU_CAPABILITY=avx512 MKL_ENABLE_INSTRUCTIONS=AVX512_E4 ;;
  *) echo "bench_cpu: ISA=$ISA: expected avx2, avx512 or amx" >&2; exit 2 ;;
esac
echo "bench_cpu: ISA cap ${ISA:-none}: $(env | grep -E '^(ONEDNN_MAX_CPU_ISA|OPENBLAS_CORETYPE|ATEN_CPU_CAPABILITY|MKL_ENABLE_INSTRUCTIONS)=' | sort | tr '\n' ' ')"

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
# PyTorch's bf16 autocast needs native bf16 products (mkldnn_bf16): under
# ISA=avx2 its matmuls fall to reference kernels (llama-small: 53 s a step
# here, against 1.7 s in fp32), so those rows are left out there; tessera's
# bf16 target on such a CPU is its own fp32.
torch_bf16=1
if [[ -n "$PY" ]] && ! "$PY" -c "import sys, torch; sys.exit(0 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else 1)" 2>/dev/null; then
  torch_bf16=0
  echo "bench_cpu: PyTorch has no native bf16 products under this cap: its bf16 rows are left out" >&2
fi
[[ -z "$PY" ]] || RUNS+=("llama-small fp32 torch-eager" "bert-base fp32 torch-eager")
[[ -z "$PY" || "$torch_bf16" == 0 ]] || RUNS+=("llama-small bf16 torch-eager" "bert-base bf16 torch-eager")
[[ -z "$PY" || "$torch_bf16" == 0 ]] || ONCE=("llama-small bf16 torch-compile" "bert-base bf16 torch-compile")
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
        ((r > 1)) || pre+=(TESSERA_OP_TIMES=1)
        "${pre[@]}" "$BIN" train --model "$model" --data "$data" --dtype "$dtype" \
          --steps $((STEPS + 2)) --micro-batch "$b" --seq 128 --lr 1e-4 --warmup 2 \
          --eval-batches 1 --log-every 1 --metrics "$TMP/$name.jsonl" >"$TMP/$name.log" 2>&1
        ;;
      torch-*)
        "$PY" tools/peer/torch_cpu.py --config "$model" --batch "$b" --seq 128 \
          --threads "$OMP_NUM_THREADS" --dtype "$dtype" --mode "${impl#torch-}" --steps "$STEPS" \
          --warmup 2 --breakdown $((r == 1 ? 2 : 0)) >"$TMP/$name.json" 2>"$TMP/$name.log"
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

# Where the time goes: seconds per step by kind, round 1.
KINDS = ("products", "attention", "elementwise", "optimizer")
def breakdown(model, dtype, impl):
    name = f"{model}-{dtype}-{impl}-1"
    if impl.startswith("torch"):
        b = json.load(open(os.path.join(tmp, name + ".json"))).get("breakdown")
        if not b:
            return None
        n = 2  # torch_cpu.py --breakdown 2
        per = {k: b[k] / n for k in KINDS}
        per["outside"] = max(b["wall_s"] / n - sum(per.values()), 0.0)
        return per, b["wall_s"] / n
    log = open(os.path.join(tmp, name + ".log")).read()
    m = re.search(r"op times, steps 2-(\d+), rank 0's process: (.*) outside the ops ([0-9.]+) s "
                  r"\([0-9]+%\) of ([0-9.]+) s", log)
    if not m:
        return None
    n = int(m.group(1)) - 1
    got = dict((k, float(v)) for k, v in re.findall(r"(\w+) ([0-9.]+) s \(", m.group(2)))
    per = {k: got.get(k, 0.0) / n for k in KINDS}
    per["elementwise"] += got.get("copies", 0.0) / n
    per["outside"] = float(m.group(3)) / n
    return per, float(m.group(4)) / n

for model in ("llama-small", "bert-base"):
    rows = [(d, i, breakdown(m, d, i)) for m, d, i in runs if m == model and i != "tessera-openblas"]
    rows = [(d, i, b) for d, i, b in rows if b]
    if not rows:
        continue
    print(f"\n{model}: where a step's time goes (seconds per step, round 1)")
    print("| run | dtype | step | " + " | ".join(KINDS) + " | outside the ops |")
    print("| :--- | :--- | ---: | " + " | ".join("---:" for _ in KINDS) + " | ---: |")
    for dtype, impl, (per, step) in rows:
        label = "tessera" if impl == "tessera" else "PyTorch eager"
        print(f"| {label} | {dtype} | {step:.3f} | " +
              " | ".join(f"{per[k]:.3f}" for k in KINDS) + f" | {per['outside']:.3f} |")
PY
if [[ -n "$PY" ]]; then
  "$PY" -c "import torch, transformers; print(f'PyTorch {torch.__version__}, transformers {transformers.__version__}')"
fi
