#!/usr/bin/env bash
# Pipeline stages side by side: one model on N ranks as (P = 1, dp = N),
# (P = 2, dp = N/2), ... (P = N, dp = 1), each schedule of SCHEDULES
# (default "gpipe 1f1b interleaved zb-h1 zbv"; interleaved with VIRTUAL_STAGES
# chunks per stage, default 2, where m is a multiple of P and the model
# has the units), at several micro-batch counts m, on the KJV corpus, in
# one script run. P = 1 (data parallelism alone) is the baseline of every
# row, and 1F1B at the same P and m the baseline of the other schedules.
#
#   tools/bench_pipeline.sh [STEPS] [RANKS] [MODEL] [MS] [PS]
#     (default 4, 4, llama-small, "4 8 16", every P dividing RANKS)
#
# TESSERA_BIN (with TESSERA_HOME for its presets) runs that binary instead
# of building the working tree's; BENCH_JSON=FILE appends one JSON line per
# run ({"bench": "pipeline", "P": ..., "schedule": ..., "m": ..., ...}).
# BENCH_PNG=FILE draws the timeline of step STEPS of the last P > 1 1F1B run
# at the largest m (tessera timeline).
#
# Per run: tokens/s (mean over steps 2..) and its ratio to P = 1 and to
# 1F1B at the same m, the bubble measured from the run's trace (tessera
# timeline, step STEPS: the busiest rank's idle fraction of the step's
# window, i.e. the slowest stage's fill and drain, and the mean over ranks,
# which adds the stages' imbalance) beside the schedule's theory for equal
# stages (ts_schedule_bubble_theory: (P-1)/(m+P-1), interleaved
# (P-1)/(vm+P-1), ZB-H1 (P-1)/(3m+P-1), ZB-V (P-1)/(6m+P-1)), the busiest rank's difference in
# percentage points, and per stage the peak bytes of rank (stage x dp):
# total beside `estimate`'s plan of that stage, and activations. And per P > 1 and
# m: 1F1B's stage-0 activation peak over GPipe's beside P/m. Micro-batch 1
# x seq 64 per rank, ZeRO stage 1, fp32, OMP_NUM_THREADS = 1 per rank. Each
# rank is a process: with more ranks than cores they share cores, which
# shortens the warm-up and cool-down (fewer ranks busy, each faster) and so
# lowers the measured bubble below the theory's equal-speed stages.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STEPS="${1:-4}"
N="${2:-4}"
MODEL="${3:-llama-small}"
MS="${4:-4 8 16}"
PS="${5:-}"
cd "$ROOT"
# shellcheck source=tools/bench_env.sh
source tools/bench_env.sh # BIN, DATA, TMP
export OMP_NUM_THREADS=1
if [[ -z "$PS" ]]; then
  for ((p = 1; p <= N; p++)); do ((N % p == 0)) && PS="$PS $p"; done
fi

SCHEDULES="${SCHEDULES:-gpipe 1f1b interleaved zb-h1 zbv}"
V="${VIRTUAL_STAGES:-2}"
runs=()
for m in $MS; do
  for p in $PS; do
    schedules="$SCHEDULES"
    ((p == 1)) && schedules="1f1b"
    for s in $schedules; do
      more=()
      if [[ "$s" == interleaved ]]; then
        ((m % p == 0)) || continue
        more=(--virtual-stages "$V")
      fi
      name="p${p}_${s}_m${m}"
      tools/launch.sh -n "$N" "$BIN" train --model "$MODEL" --data "$DATA" --zero 1 \
        --pipeline "$p" --schedule "$s" "${more[@]}" --steps "$STEPS" --micro-batch 1 \
        --grad-accum "$m" --seq 64 --lr 1e-3 --warmup 1 --eval-batches 1 --log-every "$STEPS" \
        --metrics "$TMP/$name.jsonl" --trace "$TMP/$name.trace.json" >"$TMP/$name.log"
      "$BIN" timeline "$TMP/$name.trace.json" --step "$STEPS" --json >"$TMP/$name.timeline.json"
      "$BIN" estimate --model "$MODEL" -n "$N" --zero 1 --pipeline "$p" --schedule "$s" \
        "${more[@]}" --grad-accum "$m" --micro-batch 1 --seq 64 --json >"$TMP/$name.plan.json"
      runs+=("$name")
    done
  done
done
if [[ -n "${BENCH_PNG:-}" ]]; then
  last=""
  for r in "${runs[@]}"; do [[ "$r" == *_1f1b_m${MS##* } && "$r" != p1_* ]] && last="$r"; done
  [[ -n "$last" ]] && "$BIN" timeline "$TMP/$last.trace.json" --step "$STEPS" --png "$BENCH_PNG" \
    >/dev/null && echo "timeline of $last, step $STEPS: $BENCH_PNG"
fi

python3 - "$TMP" "$N" "$MODEL" "$(nproc --all)" "${BENCH_JSON:-}" "$V" "${runs[@]}" <<'PY'
import json, os, sys
tmp, n, model, cores, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
v = int(sys.argv[6])
names = sys.argv[7:]
mib = 1024.0 ** 2
rows = {}
def theory(p, s, m):  # engine/schedule.h ts_schedule_bubble_theory
    if p == 1: return 0.0
    if s == "interleaved": return (p - 1) / (v * m + p - 1)
    if s == "zb-h1": return (p - 1) / (3 * m + p - 1)
    if s == "zbv": return (p - 1) / (6 * m + p - 1)
    return (p - 1) / (m + p - 1)
for name in names:
    p, s, m = name.split("_")
    p, m = int(p[1:]), int(m[1:])
    plan = json.load(open(os.path.join(tmp, name + ".plan.json")))
    plan_peak = [st["peak_total"] for st in plan["stages"]]
    recs = [json.loads(l) for l in open(os.path.join(tmp, name + ".jsonl"))]
    steps = [r for r in recs if "tokens_per_s" in r]
    summary = next(r["summary"] for r in recs if "summary" in r)
    tl = json.load(open(os.path.join(tmp, name + ".timeline.json")))
    tok = sum(r["tokens_per_s"] for r in steps[1:]) / max(1, len(steps) - 1)
    dp = n // p
    stages = [summary["mem_by_rank"][st * dp] for st in range(p)]
    rows[(p, s, m)] = dict(tok=tok, bubble=tl["bubble_busiest"], mean=tl["bubble"],
                           theory=theory(p, s, m), plan=plan_peak,
                           total=[r["total"] for r in stages],
                           act=[r["activations"] for r in stages],
                           loss=steps[-1]["loss"])
print(f"{model}, {n} ranks on {cores} cores (OMP_NUM_THREADS=1 each), fp32, ZeRO-1, "
      f"micro-batch 1 x seq 64 per rank")
print()
print("| P x dp | schedule | m | tokens/s | vs P=1 | vs 1F1B | bubble, busiest rank | theory "
      "| diff (pp) | mean idle | peak MiB per stage (plan) | activations MiB per stage |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
for (p, s, m), r in rows.items():
    base = rows.get((1, "1f1b", m))
    ratio = r["tok"] / base["tok"] if base else float("nan")
    f1b = rows.get((p, "1f1b", m))
    vs = r["tok"] / f1b["tok"] if f1b else float("nan")
    name = s + (f" v={v}" if s == "interleaved" else "")
    peaks = " / ".join("%.1f (%.1f)" % (t / mib, q / mib) for t, q in zip(r["total"], r["plan"]))
    print(f"| {p} x {n // p} | {name} | {m} | {r['tok']:.0f} | {ratio:.2f} | {vs:.2f} | "
          f"{100 * r['bubble']:.1f}% | {100 * r['theory']:.1f}% | "
          f"{100 * (r['bubble'] - r['theory']):+.1f} | {100 * r['mean']:.1f}% | "
          f"{peaks} | {' / '.join('%.1f' % (a / mib) for a in r['act'])} |")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"bench": "pipeline", "model": model, "ranks": n, "P": p,
                                "schedule": s, "m": m, "tokens_per_s": r["tok"],
                                "bubble_busiest": r["bubble"], "bubble_mean": r["mean"],
                                "bubble_theory": r["theory"], "plan_peak_bytes_per_stage": r["plan"],
                                "peak_bytes_per_stage": r["total"],
                                "activation_bytes_per_stage": r["act"]}) + "\n")
print()
print("| P | m | stage-0 activations 1F1B / GPipe | P/m |")
print("| ---: | ---: | ---: | ---: |")
for (p, s, m), r in rows.items():
    if s == "1f1b" and p > 1 and (p, "gpipe", m) in rows:
        g = rows[(p, "gpipe", m)]
        print(f"| {p} | {m} | {r['act'][0] / g['act'][0]:.3f} | {p / m:.3f} |")
PY
