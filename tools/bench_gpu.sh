#!/usr/bin/env bash
# GPU speed: tessera against PyTorch on one NVIDIA GPU, every figure from
# the same script run on the same machine.
#
#   tools/bench_gpu.sh [STEPS]      (default 20 steps per run, the first 5 untimed)
#   DIR/run_bench.sh [STEPS]        the same from tools/gpu_bundle.sh's folder
#
# For llama-124m (micro-batch 32 x seq 1024), llama-1.1b (8 x 2048) and
# bert-base's masked LM (256 x 128), bf16, one rank: `tessera train --device
# cuda`, then the PyTorch peer (tools/peer/torch_llama.py: transformers'
# LlamaForCausalLM; tools/peer/torch_bert.py: BertForMaskedLM; autocast
# bf16, fused AdamW) eager and under torch.compile; last the cuBLAS bf16
# GEMM ceiling at 8192^3. A model whose config says "model_type": "bert"
# trains on masked-LM data (DATA_MLM). Prints one Markdown table (model,
# impl, tokens/s, sequences/s, step ms, MFU, peak device memory) and writes its rows as JSON
# Lines ({"bench": "gpu", "model": ..., "impl": ..., "tokens_per_s": ...},
# one per run, failed runs with "ok": false and the error) to
# ${BENCH_JSON:-bench_gpu.json}. A run that fails (out of memory, say) is a
# row saying so; the others still run, and the exit status is 1.
#
# Method: tokens/s and step ms are medians over the steps after the first
# WARMUP (tessera: its metrics' step lines; the peer: CUDA events between
# steps). MFU = tokens/s x flops_per_token / 989e12 (H100 SXM dense bf16;
# PEAK_FLOPS to change), flops_per_token being tessera's count (PaLM's:
# 6N per token plus attention; models/llama.c and models/bert.c, mirrored
# by the peers). Peak
# memory: tessera's device ledger peak (summary device_bytes.ledger_peak;
# what the device holds outside the ledger is printed below the table), the
# peer's torch.cuda.max_memory_allocated(). tessera trains on the KJV token
# folder, the peer on seeded random tokens: speed does not depend on the text.
#
# Environment:
#   TESSERA_BIN     the tessera binary (default: build //tools:tessera with Bazel)
#   TESSERA_HOME    where models/configs/ is (default: this script's repository)
#   DATA            token folder from `tessera prepare` (default ROOT/data/kjv,
#                   made by tools/kjv.sh when absent and Bazel built the binary)
#   DATA_MLM        the same from `tessera prepare --mlm`, for BERT models
#                   (default ROOT/data/kjv-mlm, made by tools/kjv.sh --mlm)
#   MODELS          runs as MODEL:BxT, space-separated
#                   (default "llama-124m:32x1024 llama-1.1b:8x2048 bert-base:256x128")
#   IMPLS           any of tessera, tessera-fp8, torch-eager, torch-compile, gemm
#                   (default tessera, torch-eager, torch-compile, gemm);
#                   tessera-fp8 is tessera with --fp8 $FP8 (llama models)
#   FP8             the scaling of tessera-fp8: tensorwise or rowwise
#                   (default tensorwise)
#   WARMUP          untimed steps per run (default 5)
#   PYTHON          the python3 holding torch and transformers (default python3)
#   TESSERA_FLAGS   extra flags for tessera train (e.g. --activation-checkpointing all)
#   PEAK_FLOPS      the GPU's peak FLOP/s for MFU (default 989e12)
#   BENCH_LOGS      keep every run's log and metrics in this folder (default: a
#                   temporary folder, removed at exit; a failed run's last log
#                   lines print on stderr as it fails)
#
# A 10-minute slot (a lent GPU machine's limit per command) does not hold
# all of them, torch.compile compiling in the warm-up of each run: one
# model per command (MODELS=llama-124m:32x1024, then llama-1.1b:8x2048,
# then bert-base:256x128), or split with IMPLS.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STEPS="${1:-20}"
WARMUP="${WARMUP:-5}"
FP8="${FP8:-tensorwise}"
MODELS="${MODELS:-llama-124m:32x1024 llama-1.1b:8x2048 bert-base:256x128}"
IMPLS="${IMPLS:-tessera torch-eager torch-compile gemm}"
PYTHON="${PYTHON:-python3}"
PEAK_FLOPS="${PEAK_FLOPS:-989e12}"
OUT_JSON="${BENCH_JSON:-bench_gpu.json}"
PEER="$ROOT/tools/peer/torch_llama.py"
PEER_BERT="$ROOT/tools/peer/torch_bert.py"
[[ "$STEPS" =~ ^[0-9]+$ && "$WARMUP" =~ ^[0-9]+$ && "$STEPS" -gt "$WARMUP" ]] || {
  echo "bench_gpu: STEPS ($STEPS) must be an integer above WARMUP ($WARMUP)" >&2
  exit 2
}
for impl in $IMPLS; do
  case "$impl" in
    tessera | tessera-fp8 | torch-eager | torch-compile | gemm) ;;
    *) echo "bench_gpu: IMPLS: unknown '$impl' (tessera, tessera-fp8, torch-eager, torch-compile, gemm)" >&2; exit 2 ;;
  esac
done
wants() { [[ " $IMPLS " == *" $1 "* ]]; }
for spec in $MODELS; do
  [[ "$spec" =~ ^[^:]+:[0-9]+x[0-9]+$ ]] || {
    echo "bench_gpu: MODELS: '$spec': expected MODEL:BxT (llama-124m:32x1024)" >&2
    exit 2
  }
done

if [[ -n "${TESSERA_BIN:-}" ]]; then
  BIN="$TESSERA_BIN"
  export TESSERA_HOME="${TESSERA_HOME:-$ROOT}"
elif wants tessera; then
  (cd "$ROOT" && tools/setup.sh &&
    bazel build --ui_event_filters=-info,-progress --noshow_progress //tools:tessera)
  BIN="$ROOT/bazel-bin/tools/tessera"
  export TESSERA_HOME="$ROOT"
else
  BIN=""
  export TESSERA_HOME="${TESSERA_HOME:-$ROOT}"
fi
DATA="${DATA:-$ROOT/data/kjv}"
DATA_MLM="${DATA_MLM:-$ROOT/data/kjv-mlm}"

# The model's config.json: a preset name or a path.
config_of() {
  if [[ -f "$1" ]]; then echo "$1"; else echo "$TESSERA_HOME/models/configs/$1.json"; fi
}
is_bert() { grep -Eq '"model_type"[[:space:]]*:[[:space:]]*"bert"' "$(config_of "$1")" 2>/dev/null; }

# The token folder a model trains on, prepared by tools/kjv.sh when it is
# the default one and Bazel built the binary.
need_data() { # need_data DIR [--mlm]
  [[ -f "$1/train.bin" && -f "$1/val.bin" ]] && return 0
  if [[ -z "${TESSERA_BIN:-}" && ("$1" == "$ROOT/data/kjv" || "$1" == "$ROOT/data/kjv-mlm") ]]; then
    "$ROOT/tools/kjv.sh" "$BIN" ${2:+"$2"} >/dev/null
  else
    echo "bench_gpu: $1: no train.bin/val.bin (tessera prepare${2:+ $2}, or tools/kjv.sh${2:+ $2}, writes them)" >&2
    exit 1
  fi
}
if wants tessera; then
  for spec in $MODELS; do
    if is_bert "${spec%%:*}"; then need_data "$DATA_MLM" --mlm; else need_data "$DATA"; fi
  done
fi

if [[ -n "${BENCH_LOGS:-}" ]]; then
  LOGS="$BENCH_LOGS"
  mkdir -p "$LOGS"
else
  LOGS="$(mktemp -d)"
  trap 'rm -rf "$LOGS"' EXIT
fi
: >"$LOGS/runs.txt" # one line per run: impl model B T status file log

# Runs one configuration; its record goes to runs.txt whatever the outcome.
#   run IMPL MODEL B T RESULT_FILE LOG_FILE -- COMMAND...
run() {
  local impl="$1" model="$2" b="$3" t="$4" result="$5" log="$6"
  shift 7
  if [[ "$model" == - ]]; then
    echo "bench_gpu: $impl ..." >&2
  else
    echo "bench_gpu: $impl $model ${b}x$t ..." >&2
  fi
  local t0=$SECONDS rc=0
  "$@" >"$log.out" 2>"$log" || rc=$?
  echo "bench_gpu:   exit $rc after $((SECONDS - t0)) s" >&2
  if ((rc != 0)); then
    tail -n 5 "$log" | sed 's/^/bench_gpu:   | /' >&2
  fi
  echo "$impl $model $b $t $rc $result $log" >>"$LOGS/runs.txt"
}

for spec in $MODELS; do
  model="${spec%%:*}"
  shape="${spec#*:}"
  b="${shape%x*}"
  t="${shape#*x}"
  name="$(basename "$model" .json)"
  config="$(config_of "$model")"
  peer=("$PYTHON" "$PEER") data="$DATA"
  if is_bert "$model"; then peer=("$PYTHON" "$PEER_BERT" --device cuda) data="$DATA_MLM"; fi
  for impl in tessera tessera-fp8; do
    wants "$impl" || continue
    fp8=()
    [[ "$impl" == tessera-fp8 ]] && fp8=(--fp8 "$FP8")
    m="$LOGS/$impl-$name.jsonl"
    # shellcheck disable=SC2086 # TESSERA_FLAGS is a list of flags
    run "$impl" "$model" "$b" "$t" "$m" "$LOGS/$impl-$name.log" -- \
      "$BIN" train --device cuda --model "$model" --dtype bf16 --micro-batch "$b" --seq "$t" \
      --global-batch "$b" --steps "$STEPS" --data "$data" --metrics "$m" --log-every 1 \
      --lr 3e-4 --eval-batches 1 "${fp8[@]}" ${TESSERA_FLAGS:-}
  done
  for mode in eager compile; do
    wants "torch-$mode" || continue
    r="$LOGS/torch-$mode-$name"
    run "torch-$mode" "$model" "$b" "$t" "$r.log.out" "$r.log" -- \
      "${peer[@]}" --mode "$mode" --config "$config" --name "$name" \
      --batch "$b" --seq "$t" --steps "$STEPS" --warmup "$WARMUP" --peak-flops "$PEAK_FLOPS"
  done
done
if wants gemm; then
  run gemm - - - "$LOGS/gemm.log.out" "$LOGS/gemm.log" -- \
    "$PYTHON" "$PEER" --mode gemm --peak-flops "$PEAK_FLOPS"
fi

"$PYTHON" - "$LOGS/runs.txt" "$WARMUP" "$PEAK_FLOPS" "$OUT_JSON" "$PEER" "$TESSERA_HOME" <<'PY'
import json, os, statistics, sys
runs, warmup, peak, out, peer, home = sys.argv[1:7]
warmup, peak = int(warmup), float(peak)
sys.path.insert(0, os.path.dirname(peer))
import torch_bert, torch_llama  # no torch needed: the mirrors of models/bert.c and llama.c
GiB = 2.0 ** 30

def last_line(path):
    try:
        lines = [l.strip() for l in open(path) if l.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "no output"

def tessera_row(model, b, t, metrics, log):
    recs = [json.loads(l) for l in open(metrics) if l.strip()]
    steps = [r for r in recs if "tokens_per_s" in r]
    summary = next((r["summary"] for r in recs if "summary" in r), None)
    if summary is None:
        raise ValueError(f"{metrics}: no summary line")
    timed = [r for r in steps if r["step"] > warmup]
    if not timed:
        raise ValueError(f"{metrics}: no step after the first {warmup}")
    tok = statistics.median(r["tokens_per_s"] for r in timed)
    step_s = statistics.median(r["step_seconds"] for r in timed)
    fpt = timed[0]["gflops"] * 1e9 / timed[0]["tokens_per_s"]  # tessera's own count
    cfg = os.path.join(home, "models", "configs", model + ".json")
    cfg = json.load(open(model if os.path.isfile(model) else cfg))
    peer_mod = torch_bert if cfg.get("model_type") == "bert" else torch_llama
    mirror = peer_mod.flops_per_token(cfg, t)
    if abs(mirror - fpt) > 1e-6 * fpt:
        print(f"bench_gpu: flops_per_token of {model}: tessera {fpt:.6g}, "
              f"tools/peer/{peer_mod.__name__}.py {mirror:.6g}: the mirror is out of date",
              file=sys.stderr)
    dev = summary.get("device_bytes")
    row = {"tokens_per_s": tok, "step_ms": step_s * 1e3, "flops_per_token": fpt,
           "mfu": tok * fpt / peak, "timed_steps": len(timed),
           "device": summary.get("device"), "gpu_name": summary.get("gpu_name"),
           "params": summary["params"]["unpadded"], "loss_last": steps[-1]["loss"]}
    if dev:
        row["peak_bytes"] = dev["ledger_peak"]
        row["overhead_bytes"] = dev["overhead"]
    else:  # a binary without device_bytes: rank 0's ledger peak
        row["peak_bytes"] = summary["mem_by_rank"][0]["total"]
        row["peak_note"] = "no device_bytes in the summary: mem_by_rank[0].total"
    if row["device"] not in (None, "cuda"):
        raise ValueError(f"tessera trained on {row['device']}, not cuda")
    return row

rows, failed = [], 0
for line in open(runs):
    impl, model, b, t, rc, result, log = line.split()
    row = {"bench": "gpu", "impl": impl, "model": None if model == "-" else model}
    if impl != "gemm":
        row.update(batch=int(b), seq=int(t))
    try:
        if rc != "0":
            raise RuntimeError(f"exit {rc}: {last_line(log)}")
        if impl.startswith("tessera"):
            row.update(tessera_row(model, int(b), int(t), result, log))
        else:
            got = json.loads(open(result).read().strip().splitlines()[-1])
            got.pop("model", None)
            got["impl"] = impl if impl != "gemm" else got["impl"]
            row.update(got)
        row["ok"] = True
    except Exception as e:  # noqa: BLE001 — any failure becomes the row's error
        row.update(ok=False, error=str(e))
        failed += 1
    rows.append(row)

with open(out, "w") as f:
    for row in rows:
        f.write(json.dumps(row) + "\n")

gpus = sorted({r["gpu_name"] for r in rows if r.get("gpu_name")})
print(f"GPU: {', '.join(gpus) or 'unknown'}; bf16, one rank; medians over steps after "
      f"the first {warmup}; MFU against {peak / 1e12:g} TFLOP/s")
print()
print("| model | impl | tokens/s | sequences/s | step ms | MFU | peak device memory GiB |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for r in rows:
    shape = f" ({r['batch']} x {r['seq']})" if "batch" in r else ""
    name = (r["model"] or "—") + shape
    gemm = r["impl"] in ("gemm", "cublas-gemm")
    impl = f"cuBLAS bf16 GEMM {r.get('m', 8192)}³" if gemm else r["impl"]
    if not r["ok"]:
        print(f"| {name} | {impl} | failed: {r['error'][:120]} | | | | |")
    elif "tflops" in r:
        print(f"| {name} | {impl} | — | — | {r['ms_median']:.2f} | "
              f"{r['fraction_of_peak']:.1%} ({r['tflops']:.0f} TFLOP/s) | — |")
    else:
        print(f"| {name} | {impl} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / r['seq']:,.1f} | "
              f"{r['step_ms']:.1f} | {r['mfu']:.1%} | {r['peak_bytes'] / GiB:.2f} |")
print()
for r in rows:
    if r["ok"] and r["impl"].startswith("tessera") and "overhead_bytes" in r:
        print(f"tessera {r['model']}: {r['overhead_bytes'] / GiB:.2f} GiB of device memory "
              f"outside the ledger (device_bytes.overhead: CUDA context, library workspaces)")
    elif r["ok"] and r["impl"].startswith("tessera"):
        print(f"tessera {r['model']}: {r['peak_note']}")
print(f"{len(rows)} run{'' if len(rows) == 1 else 's'}, {failed} failed; rows in {out}")
sys.exit(1 if failed else 0)
PY
