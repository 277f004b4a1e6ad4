#!/usr/bin/env bash
# step_overhead.sh — the seconds of a step outside its traced compute spans,
# for `simulate --step-overhead`: the median step_seconds of a `train
# --metrics` file (steps FROM.., default 4: past the warm-up) less the sum of
# the medians of rank 0's forward, backward, recompute and optimizer_step
# spans per unit in the same run's `--trace` file (0 if negative).
#   tools/step_overhead.sh TRACE METRICS [FROM]
#   tools/step_overhead.sh --median-step METRICS [FROM]   (the median step alone)
set -euo pipefail
if [[ "${1:-}" == --median-step ]]; then
  trace="" metrics="$2" from="${3:-4}"
else
  trace="$1" metrics="$2" from="${3:-4}"
fi
python3 - "$trace" "$metrics" "$from" <<'PY'
import json, statistics, sys
trace, metrics, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(metrics)]
steps = [r["step_seconds"] for r in rows if "step_seconds" in r and r.get("step", 0) >= first]
if not steps:
    sys.exit("step_overhead: %s: no step_seconds of steps %d.." % (metrics, first))
step = statistics.median(steps)
if not trace:
    print(step)
    sys.exit()
by = {}
for e in json.load(open(trace))["traceEvents"]:
    if e.get("ph") == "X" and e.get("pid") == 0 and e.get("name") in (
            "forward", "backward", "recompute", "optimizer_step"):
        by.setdefault((e["name"], e.get("args", {}).get("unit", -1)), []).append(e["dur"] * 1e-6)
print(max(0.0, step - sum(statistics.median(v) for v in by.values())))
PY
