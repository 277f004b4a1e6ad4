#!/usr/bin/env bash
# CPU AdamW speed: tessera's optimizer step (ts_k_adamw on the CPU, the
# update an offloaded optimizer runs on the host) beside PyTorch's
# torch.optim.AdamW (foreach and fused) and DeepSpeed's DeepSpeedCPUAdam,
# on one fp32 tensor of N parameters, the same threads, in one script run on
# this machine.
#
#   tools/bench_adamw.sh [N] [ROUNDS]   (default 33554432 = 2^25, 3)
#
# For 1 thread and for nproc threads, ROUNDS interleaved rounds of:
# kernels/bench_adamw N fp32 (the update in place on the fp32 masters, as
# PyTorch's and DeepSpeed's fp32 parameters), kernels/bench_adamw N bf16 (the
# bf16 gradient read and the bf16 compute parameters written beside the
# masters: mixed precision's update), tools/peer/adamw_cpu.py N (PyTorch
# foreach and fused, DeepSpeed). Each figure is parameters per second of the
# median step of a run; a row prints each side's best over the rounds and
# tessera fp32 over the best of the others. Last, how many of 65536
# elements of each differ in their bits from torch.optim.AdamW's default
# after 3 steps (adamw_cpu.py: tessera's element update emulated op by op,
# torch's fused and single-tensor paths, DeepSpeed): the implementations
# round differently, so speed is compared across formulas, not bits. kernels/bench_adamw also says
# which body ran (AVX-512, AVX2 or scalar: ts_cpu_adamw_isa).
#
# PyTorch: PYTHON names an interpreter with torch (DeepSpeed optional: its
# row is left out without it; its C++ op is built on first use, about a
# minute); or TORCH_VENV=DIR uses DIR/bin/python, making the venv and
# installing torch and deepspeed there with pip first when it lacks them
# (network needed; CI never runs this). With neither, only tessera's rows.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
N="${1:-33554432}"
ROUNDS="${2:-3}"
cd "$ROOT"
[[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "bench_adamw: N $N: expected a count >= 1" >&2; exit 2; }
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "bench_adamw: ROUNDS $ROUNDS: expected >= 1" >&2; exit 2; }

PY="${PYTHON:-}"
if [[ -z "$PY" && -n "${TORCH_VENV:-}" ]]; then
  PY="$TORCH_VENV/bin/python"
  if ! "$PY" -c "import torch, deepspeed" 2>/dev/null; then
    echo "bench_adamw: installing torch and deepspeed into $TORCH_VENV" >&2
    python3 -m venv "$TORCH_VENV"
    "$TORCH_VENV/bin/pip" install -q torch ninja >&2
    DS_BUILD_OPS=0 "$TORCH_VENV/bin/pip" install -q deepspeed >&2
  fi
fi
if [[ -n "$PY" ]] && ! "$PY" -c "import torch" 2>/dev/null; then
  echo "bench_adamw: $PY cannot import torch" >&2
  exit 1
fi

bazel build --ui_event_filters=-info,-progress --noshow_progress //kernels:bench_adamw
BENCH="$ROOT/bazel-bin/kernels/bench_adamw"
"$BENCH" --isa
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
for threads in 1 "$(nproc)"; do
  for ((r = 1; r <= ROUNDS; r++)); do
    OMP_NUM_THREADS="$threads" "$BENCH" "$N" fp32 | sed 's/^adamw /tessera-fp32 /' >>"$LOG"
    OMP_NUM_THREADS="$threads" "$BENCH" "$N" bf16 | sed 's/^adamw /tessera-bf16 /' >>"$LOG"
    [[ -z "$PY" ]] || OMP_NUM_THREADS="$threads" "$PY" tools/peer/adamw_cpu.py "$N" "$threads" \
      2>/dev/null >>"$LOG"
  done
done
python3 - "$LOG" "$N" <<'PY'
import collections, sys
best = collections.defaultdict(float)
bits = {}
names = ["tessera-fp32", "tessera-bf16", "torch-foreach", "torch-fused", "deepspeed"]
for line in open(sys.argv[1]):  # (DeepSpeed prints its own notes on stdout: skipped)
    f = line.split()
    if len(f) == 4 and f[0] == "bits":
        bits[f[1]] = "%s of %s" % (f[2], f[3])
    if len(f) != 5 or f[0] not in names:
        continue
    best[(int(f[3]), f[0])] = max(best[(int(f[3]), f[0])], float(f[4]))
print("\nAdamW, %s parameters: million parameters per second (best of the rounds)\n" % sys.argv[2])
print("| threads | " + " | ".join(names) + " | tessera fp32 / best other |")
print("| ---: |" + " ---: |" * (len(names) + 1))
for threads in sorted({t for t, _ in best}):
    cells = ["%.0f" % (best[(threads, k)] / 1e6) if (threads, k) in best else "-" for k in names]
    others = [best[(threads, k)] for k in names[2:] if (threads, k) in best]
    ratio = "%.2f" % (best[(threads, "tessera-fp32")] / max(others)) if others else "-"
    print("| %d | %s | %s |" % (threads, " | ".join(cells), ratio))
if bits:
    print("\nElements whose bits differ from torch.optim.AdamW's default (foreach, = its "
          "single-tensor loop) after 3 steps:")
    for k in ("tessera", "torch-single", "torch-fused", "deepspeed"):
        if k in bits:
            print("  %-13s %s" % (k, bits[k]))
PY
