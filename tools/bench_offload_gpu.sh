#!/usr/bin/env bash
# Optimizer offload on one GPU (train --device cuda --offload optimizer;
# ZeRO-Offload, Ren et al. 2021): a model whose in-memory plan does not fit
# the card trains with its optimizer state in page-locked host memory.
#
#   tools/bench_offload_gpu.sh [STEPS]   (default 5, the first WARMUP=2 untimed)
#   DIR/run_offload.sh [STEPS]           the same from tools/gpu_bundle.sh's folder
#
# MODEL (default llama-2-7b), bf16, one rank, micro-batch MB x SEQ (default
# 2 x 4096) with ACCUM micro-batches a step (default 8: 65536 tokens, so
# that the step's compute outweighs the update's copies and CPU AdamW, as
# ZeRO-Offload's own runs do), no activation checkpointing:
#  1. the plan without offload (estimate --device cuda --json: its device
#     peak) and train's refusal of it: exit 1 before anything is allocated,
#     the card named;
#  2. the plan with --offload optimizer: device peak and host peak (master,
#     optim, staging);
#  3. train with --offload optimizer: tokens/s (median over the steps after
#     WARMUP), the step's seconds, MFU = tokens/s x tessera's FLOPs per
#     token / PEAK_FLOPS (989e12: H100 SXM dense bf16), the device's and the
#     host's ledger peaks beside the plan's (PASS when equal to the byte),
#     the card's own bytes in use (cudaMemGetInfo) and the process's peak
#     resident memory.
#  4. --offload params (ZeRO-3: the parameter shards on the host too):
#     PARAMS_MODEL (default llama-2-7b, the largest preset whose host plan
#     fits 128 GiB: llama-2-13b's is 182 GiB, printed) at 1 x SEQ, 3 steps:
#     tokens/s, device and host ledger peaks beside the plan.
# Last line: "bench_offload_gpu: MFU X% (target >= 30%), device plan = ledger
# PASS|FAIL, host plan = ledger PASS|FAIL, --offload params PASS|FAIL"; exit 1
# when a run failed or a plan differs from its ledger (the MFU target is
# reported, not enforced).
#
# What to expect on an H100 80GB beside 128 GiB of host memory (the figures
# of `tessera estimate` on any machine; measured ones go to
# docs/BENCHMARKS.md): without offload the plan is 136 GiB on the card
# (master 25.1, Adam 50.2), refused; with it 61.1 GiB on the card and 75.3
# GiB on the host (master 25.1, optim 50.2, 16 MiB of update pieces).
#
# Environment: TESSERA_BIN, TESSERA_HOME, DATA as tools/bench_gpu.sh's;
# MODEL, MB, SEQ, ACCUM, WARMUP, PEAK_FLOPS; TESSERA_FLAGS (extra train flags);
# DEVICE=cpu: a dry run of this script on the CPU (a small MODEL: the
# figures mean nothing there, the parsing and the plan = ledger checks run;
# the in-memory run is not expected to be refused).
# In the bundle: DIR/run_offload.sh [STEPS] (tools/gpu_bundle.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STEPS="${1:-5}"
WARMUP="${WARMUP:-2}"
MODEL="${MODEL:-llama-2-7b}"
MB="${MB:-2}"
SEQ="${SEQ:-4096}"
ACCUM="${ACCUM:-8}"
PEAK_FLOPS="${PEAK_FLOPS:-989e12}"
[[ "$STEPS" =~ ^[0-9]+$ && "$WARMUP" =~ ^[0-9]+$ && "$STEPS" -gt "$WARMUP" ]] || {
  echo "bench_offload_gpu: STEPS ($STEPS) must be an integer above WARMUP ($WARMUP)" >&2
  exit 2
}
if [[ -n "${TESSERA_BIN:-}" ]]; then
  BIN="$TESSERA_BIN"
else
  (cd "$ROOT" && tools/setup.sh &&
    bazel build --ui_event_filters=-info,-progress --noshow_progress //tools:tessera)
  BIN="$ROOT/bazel-bin/tools/tessera"
fi
export TESSERA_HOME="${TESSERA_HOME:-$ROOT}"
DATA="${DATA:-$ROOT/data/kjv}"
[[ -f "$DATA/train.bin" ]] || { echo "bench_offload_gpu: $DATA: no train.bin (tools/kjv.sh writes it)" >&2; exit 1; }
LOGS="${BENCH_LOGS:-$(mktemp -d)}"
mkdir -p "$LOGS"

DEVICE="${DEVICE:-cuda}"
shape=(--device "$DEVICE" --model "$MODEL" --dtype bf16 --micro-batch "$MB" --seq "$SEQ"
  --grad-accum "$ACCUM")
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
echo "host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
echo "$MODEL bf16, 1 rank, micro-batch $MB x $SEQ, $ACCUM micro-batches a step"

"$BIN" estimate "${shape[@]}" --json >"$LOGS/plan-memory.json"
"$BIN" estimate "${shape[@]}" --offload optimizer --json >"$LOGS/plan-offload.json"
"$BIN" estimate "${shape[@]}" --offload optimizer | grep -E '^\| (category|master|optim|peak total|host)'

# 1. in memory: refused before anything is allocated
rc=0
"$BIN" train "${shape[@]}" --data "$DATA" --steps 1 >"$LOGS/memory.log" 2>&1 || rc=$?
echo "in memory: exit $rc: $(tail -n 1 "$LOGS/memory.log")"

# 3. offloaded
rc_off=0
t0=$SECONDS
python3 - "$LOGS/offload.rusage" "$BIN" train "${shape[@]}" --data "$DATA" --steps "$STEPS" \
  --offload optimizer --log-every 1 --eval-batches 1 --lr 3e-4 --metrics "$LOGS/offload.jsonl" \
  ${TESSERA_FLAGS:-} <<'PY' >"$LOGS/offload.log" 2>&1 || rc_off=$?
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))
sys.exit(rc)
PY
echo "offloaded: exit $rc_off after $((SECONDS - t0)) s"
tail -n 4 "$LOGS/offload.log"

# 4. --offload params
PARAMS_MODEL="${PARAMS_MODEL:-llama-2-7b}"
pshape=(--device "$DEVICE" --model "$PARAMS_MODEL" --dtype bf16 --micro-batch 1 --seq "$SEQ" --zero 3)
"$BIN" estimate --device "$DEVICE" --model llama-2-13b --dtype bf16 --micro-batch 1 --seq "$SEQ" \
  --zero 3 --offload params | grep -E '^\| (peak total|host: peak total)' | sed 's/^/llama-2-13b --offload params: /'
"$BIN" estimate "${pshape[@]}" --offload params --json >"$LOGS/plan-params.json"
rc_par=0
t0=$SECONDS
"$BIN" train "${pshape[@]}" --data "$DATA" --steps 3 --offload params --log-every 1 --eval-batches 1 \
  --metrics "$LOGS/params.jsonl" >"$LOGS/params.log" 2>&1 || rc_par=$?
echo "--offload params ($PARAMS_MODEL): exit $rc_par after $((SECONDS - t0)) s"
tail -n 3 "$LOGS/params.log"

python3 - "$LOGS" "$WARMUP" "$PEAK_FLOPS" "$rc" "$rc_off" "$DEVICE" "$rc_par" <<'PY'
import json, os, statistics, sys
logs, warmup, peak, rc_mem, rc_off = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
cpu = sys.argv[6] == "cpu"  # a dry run: one account, nothing refused
rc_par = int(sys.argv[7])
GiB = 2.0 ** 30
plan_mem = json.load(open(os.path.join(logs, "plan-memory.json")))["stages"][0]
plan = json.load(open(os.path.join(logs, "plan-offload.json")))["stages"][0]
ok = True
print(f"plan in memory: device {plan_mem['peak_total'] / GiB:.1f} GiB; "
      f"train without offload: exit {rc_mem} ({'refused' if rc_mem == 1 else 'NOT refused'})")
ok &= rc_mem == 1 or cpu
if cpu:  # the device's account is the host's
    plan["host_peak"], plan["host_peak_total"] = plan["peak"], plan["peak_total"]
print(f"plan offloaded: device {plan['peak_total'] / GiB:.1f} GiB, host {plan['host_peak_total'] / GiB:.1f} GiB "
      f"(master {plan['host_peak']['master'] / GiB:.2f}, optim {plan['host_peak']['optim'] / GiB:.2f}, "
      f"staging {plan['host_peak']['staging'] / 2**20:.1f} MiB)")
if rc_off != 0:
    print("bench_offload_gpu: the offloaded run failed (its log above)")
    sys.exit(1)
recs = [json.loads(l) for l in open(os.path.join(logs, "offload.jsonl")) if l.strip()]
steps = [r for r in recs if "tokens_per_s" in r][warmup:]
summary = next(r["summary"] for r in recs if "summary" in r)
tok = statistics.median(r["tokens_per_s"] for r in steps)
fpt = steps[0]["gflops"] * 1e9 / steps[0]["tokens_per_s"]
mfu = tok * fpt / peak
step_s = statistics.median(r.get("step_seconds", 0) or 0 for r in steps)
if cpu:
    total = summary["mem_by_rank"][0]["total"]
    dev = host = {"ledger_peak": total, "used_now": 0}
else:
    dev, host = summary["device_bytes"], summary["host_bytes"]
rss = int(open(os.path.join(logs, "offload.rusage")).read())
dev_ok = dev["ledger_peak"] == plan["peak_total"]
host_ok = host["ledger_peak"] == plan["host_peak_total"]
print("| run | tokens/s | step s | MFU | device ledger peak (plan) | card in use | host ledger peak (plan) | peak RSS |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
print(f"| --offload optimizer | {tok:.0f} | {step_s:.2f} | {mfu:.1%} | "
      f"{dev['ledger_peak'] / GiB:.2f} GiB ({plan['peak_total'] / GiB:.2f}) | {dev['used_now'] / GiB:.2f} GiB | "
      f"{host['ledger_peak'] / GiB:.2f} GiB ({plan['host_peak_total'] / GiB:.2f}) | {rss / GiB:.2f} GiB |")
# 4. --offload params: its peaks beside its plan
par_ok = rc_par == 0
if par_ok:
    pplan = json.load(open(os.path.join(logs, "plan-params.json")))["stages"][0]
    precs = [json.loads(l) for l in open(os.path.join(logs, "params.jsonl")) if l.strip()]
    psum = next(r["summary"] for r in precs if "summary" in r)
    ptok = statistics.median(r["tokens_per_s"] for r in precs if "tokens_per_s" in r)
    if cpu:
        pdev = phost = psum["mem_by_rank"][0]["total"]
        pplan["host_peak_total"] = pplan["peak_total"]
    else:
        pdev, phost = psum["device_bytes"]["ledger_peak"], psum["host_bytes"]["ledger_peak"]
    par_ok = pdev == pplan["peak_total"] and phost == pplan["host_peak_total"]
    print(f"| --offload params (ZeRO-3, 1 x seq) | {ptok:.0f} | | | {pdev / GiB:.2f} GiB "
          f"({pplan['peak_total'] / GiB:.2f}) | | {phost / GiB:.2f} GiB ({pplan['host_peak_total'] / GiB:.2f}) | |")
print(f"bench_offload_gpu: MFU {mfu:.1%} (target >= 30%), device plan = ledger {'PASS' if dev_ok else 'FAIL'}, "
      f"host plan = ledger {'PASS' if host_ok else 'FAIL'}, --offload params {'PASS' if par_ok else 'FAIL'}")
sys.exit(0 if ok and dev_ok and host_ok and par_ok else 1)
PY
