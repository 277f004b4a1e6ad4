#!/usr/bin/env bash
# estimate_test.sh — `tessera estimate`: the ZeRO paper's Table 1 from Ψ
# alone, LLaMA-2 70B at N = 1024 within the padding bound of 16Ψ/N, a
# Hugging Face config.json equal to its preset, model states falling with
# the stage, the GPU's plan (--device cuda, no GPU needed), and one-line
# errors (exit 2) for bad input, train's --device cuda without a GPU too;
# pipeline stages, one column each; `tessera simulate`'s bytes equal to
# estimate's and its one-line refusals.
#   estimate_test.sh TESSERA_BIN
set -uo pipefail
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fails=0
# Presets resolve under $TESSERA_HOME/models/configs: the runfiles tree of
# this workspace, which holds //models:configs.
export TESSERA_HOME="${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-tessera}"
if [[ ! -f "$TESSERA_HOME/models/configs/llama-tiny.json" ]]; then
  echo "FAIL setup: no models/configs/llama-tiny.json under $TESSERA_HOME"
  exit 1
fi

# check, check_eq, absent, lines
source "$(dirname "${BASH_SOURCE[0]}")/testing.sh"

# model_states JSON: the stages' model states in GB (1e9 bytes), 3
# significant figures like the paper's Table 1, space-separated.
model_states_gb() {
  python3 -c 'import json, sys
print(" ".join("%g" % float("%.3g" % (s["model_states"] / 1e9)) for s in json.load(sys.stdin)["stages"]))' \
    <<<"$1"
}

# 1. ZeRO paper Table 1 (Rajbhandari et al. 2020): Ψ = 7.5B, K = 12, fp16.
for n in 1 64; do
  json="$("$bin" estimate --params 7.5e9 --dtype fp16 --units GB -n "$n" --json)"
  check_eq "Table 1 N=$n exit code" 0 "$?"
  text="$("$bin" estimate --params 7.5e9 --dtype fp16 --units GB -n "$n")"
  if [[ "$n" == 1 ]]; then
    check_eq "Table 1 N=1 json" "120 120 120 120" "$(model_states_gb "$json")"
    check "Table 1 N=1 text" "| model states | 120 | 120 | 120 | 120 |" "$text"
  else
    check_eq "Table 1 N=64 json" "120 31.4 16.6 1.88" "$(model_states_gb "$json")"
    check "Table 1 N=64 text" "| model states | 120 | 31.4 | 16.6 | 1.88 |" "$text"
  fi
  check "Table 1 N=$n unit" "GB (10^9 bytes)" "$text"
  check "Table 1 N=$n says model states only" "model states only" "$text"
done

# 2. LLaMA-2 70B on 1024 ranks in bf16: stage 3 model states are 16 bytes per
# padded element / N; each of the 82 units (embedding, 80 blocks, head) pads
# by fewer than N * 16 elements.
t0="$(date +%s%N)"
json="$("$bin" estimate --model llama-2-70b -n 1024 --dtype bf16 --json)"
rc=$?
t1="$(date +%s%N)"
echo "llama-2-70b at N = 1024, four stages: $(((t1 - t0) / 1000000)) ms"
check_eq "70B exit code" 0 "$rc"
verdict="$(python3 -c 'import json, sys
j = json.load(sys.stdin)
psi, n, s3 = j["params"], j["world_size"], j["stages"][3]
lo, hi, got = 16 * psi / n, 16 * (psi + 82 * 1024 * 16) / n, s3["model_states"]
print("in bound" if s3["zero_stage"] == 3 and lo <= got <= hi else "%d outside [%d, %d]" % (got, lo, hi))' \
  <<<"$json" 2>&1)"
check_eq "70B stage 3 model states = 16 x padded / N" "in bound" "$verdict"
text="$("$bin" estimate --model llama-2-70b -n 1024 --dtype bf16)"
check "70B header" "llama-2-70b (68.98B parameters), N = 1024 ranks, bf16" "$text"
check "70B peak total row" "| peak total |" "$text"

# 3. A Hugging Face config.json by path gives the preset's numbers.
mkdir -p "$tmp/hf"
cp "$TESSERA_HOME/models/configs/llama-tiny.json" "$tmp/hf/config.json"
same="$(python3 -c 'import json, subprocess, sys
def run(m):
    j = json.loads(subprocess.check_output([sys.argv[1], "estimate", "--model", m, "-n", "2", "--json"]))
    del j["model"]
    return j
print("same" if run("llama-tiny") == run(sys.argv[2]) else "differ")' "$bin" "$tmp/hf/config.json" 2>&1)"
check_eq "config.json by path = preset" "same" "$same"

# 4. Bad input: exit 2 and one line on stderr that names the problem.
sed '/"hidden_size"/d' "$tmp/hf/config.json" >"$tmp/hf/no_hidden.json"
bad() { # bad NAME EXPECTED-SUBSTRING ARGS...
  local name="$1" want="$2"
  shift 2
  local err rc
  err="$("$bin" estimate "$@" 2>&1 >/dev/null)"
  rc=$?
  check_eq "$name exit code" 2 "$rc"
  check "$name message" "$want" "$err"
  check_eq "$name: one line" 1 "$(lines "$err")"
}
bad "unknown preset" "--model no-such-model: unknown preset" --model no-such-model
bad "missing field" "$tmp/hf/no_hidden.json: missing field \"hidden_size\"" --model "$tmp/hf/no_hidden.json"
bad "-n 0" "-n 0: expected an integer >= 1 (digits, or such as 1e9 or 7.5e9)" --params 1e9 -n 0
bad "--zero 4" "--zero 4: expected a ZeRO stage 0, 1, 2, 3 or all" --params 1e9 --zero 4
bad "--zero x" "--zero x: expected a ZeRO stage 0, 1, 2, 3 or all" --params 1e9 --zero x
bad "neither --model nor --params" "expected exactly one of --model CONFIG and --params PSI"
bad "--params 0" "--params 0: expected a parameter count" --params 0
bad "--units parsecs" "--units parsecs: expected GiB, GB, MiB, MB or bytes" --params 1e9 --units parsecs

# 5. llama-tiny, N = 4, fp32: each stage keeps strictly less model state.
json="$("$bin" estimate --model llama-tiny -n 4 --json)"
falling="$(python3 -c 'import json, sys
m = [s["model_states"] for s in json.load(sys.stdin)["stages"]]
print("falling" if len(m) == 4 and all(a > b for a, b in zip(m, m[1:])) else "not falling: %s" % m)' \
  <<<"$json" 2>&1)"
check_eq "model states fall from stage 0 to 3" "falling" "$falling"

# 6. --device cuda plans the GPU's bytes without a GPU: the same model states
# as the CPU's plan; in fp32 more activation memory (a GPU block keeps the
# T x T probabilities, the CPU's fused attention each row's log-sum-exp),
# in bf16 the same (both keep the log-sum-exp).
runs=()
for dt in fp32 bf16; do
  runs+=("$("$bin" estimate --model llama-tiny --dtype $dt --zero 0 --seq 64 --json)")
  runs+=("$("$bin" estimate --model llama-tiny --dtype $dt --zero 0 --seq 64 --device cuda --json)")
done
verdict="$(python3 -c 'import json, sys
r = [json.loads(a) for a in sys.argv[1:5]]
(c32, g32, c16, g16) = (x["stages"][0] for x in r)
ok = (r[1]["device"] == "cuda" and r[3]["device"] == "cuda"
      and g32["model_states"] == c32["model_states"] and g16["model_states"] == c16["model_states"]
      and g32["peak"]["activations"] > c32["peak"]["activations"]
      and g16["peak"]["activations"] == c16["peak"]["activations"])
print("as expected" if ok else "model states %d/%d %d/%d, activations fp32 %d vs %d, bf16 %d vs %d" % (
    g32["model_states"], c32["model_states"], g16["model_states"], c16["model_states"],
    g32["peak"]["activations"], c32["peak"]["activations"],
    g16["peak"]["activations"], c16["peak"]["activations"]))' "${runs[@]}" 2>&1)"
check_eq "--device cuda: same model states; activations fp32 larger, bf16 equal" "as expected" "$verdict"
bad "--device tpu" "--device tpu: expected cpu, cuda or auto" --params 1e9 --device tpu

# 6b. Several ranks on a GPU: --comm staged stages through host memory,
# so the plan's host part holds the staging, 4 x N x the chunk (here 4 x 4
# x 64 KiB = 1 MiB), in category comm; auto (one GPU per rank: nccl) and
# nccl hold none on the host and the same device bytes as staged (the
# reduce-scatter's scratch is on the device either way); NCCL on the CPU
# and host MPI on a GPU are refused in one line.
verdict="$(python3 -c 'import json, sys
g, c, a, n = (json.loads(x)["stages"][0] for x in sys.argv[1:5])
ok = (g["host_peak"]["comm"] == 4 * 4 * 65536 and "host_peak" not in c
      and a.get("host_peak", {}).get("comm", 0) == 0 and n.get("host_peak", {}).get("comm", 0) == 0
      and a["peak_total"] == g["peak_total"] == n["peak_total"])
print("as expected" if ok else (g.get("host_peak"), a.get("host_peak"), n.get("host_peak"),
      g["peak_total"], a["peak_total"], n["peak_total"], sorted(c)))' \
  "$("$bin" estimate --model llama-tiny -n 4 --zero 3 --device cuda --comm staged --comm-chunk 65536 --json)" \
  "$("$bin" estimate --model llama-tiny -n 4 --zero 3 --json)" \
  "$("$bin" estimate --model llama-tiny -n 4 --zero 3 --device cuda --comm-chunk 65536 --json)" \
  "$("$bin" estimate --model llama-tiny -n 4 --zero 3 --device cuda --comm nccl --json)" 2>&1)"
check_eq "--device cuda -n 4: host comm staging = 4 N chunk (staged), none (auto, nccl)" \
  "as expected" "$verdict"
bad "--comm nccl on cpu" "--comm nccl moves GPU memory only; on cpu use mpi (or auto)" \
  --model llama-tiny -n 2 --comm nccl
bad "--comm mpi on cuda" "--comm mpi moves host memory only; on cuda use staged (or auto)" \
  --model llama-tiny -n 2 --device cuda --comm mpi
bad "--comm-chunk 8" "--comm-chunk 8: expected an integer >= 64" --model llama-tiny --comm-chunk 8

# 7. train --device cuda on a machine without a GPU: one line, exit 2,
# before anything is read or allocated (skipped where a GPU is present).
if ! "$bin" estimate --model llama-tiny --device auto --json | grep -q '"device": *"cuda"'; then
  err="$("$bin" train --device cuda --model llama-tiny --data "$tmp/nowhere" 2>&1 >/dev/null)"
  check_eq "train --device cuda without a GPU: exit code" 2 "$?"
  check "train --device cuda without a GPU: message" "--device cuda: this process sees no CUDA GPU" "$err"
  check_eq "train --device cuda without a GPU: one line" 1 "$(lines "$err")"
fi

# 8. --pipeline: one column per pipeline stage, whose units cover the model
# in order; 1F1B holds min(P - s, m) micro-batches in flight, GPipe m, so at
# m = 8 and P = 2 stage 0's activations under 1F1B are about a quarter of
# GPipe's (2 of 8 slots, plus the gradient buffers both keep); bad layouts
# are refused in one line.
f1b="$("$bin" estimate --model llama-tiny -n 4 --pipeline 2 --grad-accum 8 --zero 1 --json)"
check_eq "--pipeline exit code" 0 "$?"
gpipe="$("$bin" estimate --model llama-tiny -n 4 --pipeline 2 --grad-accum 8 --zero 1 --schedule gpipe --json)"
verdict="$(python3 -c 'import json, sys
a, g = (json.loads(x) for x in sys.argv[1:3])
s = a["stages"]
units = [u for st in s for u in st["units"]]
ok = (a["pipeline"] == 2 and a["schedule"] == "1f1b" and len(s) == 2
      and [st["pipeline_stage"] for st in s] == [0, 1] and units[0] == 0
      and units[1] == units[2] and units[3] == 6)
act = [st["peak"]["activations"] for st in s]
gact = [st["peak"]["activations"] for st in g["stages"]]
ratio = act[0] / gact[0]
ok = ok and 0.25 < ratio < 0.3 and act[1] < act[0] and gact[1] >= gact[0] * 0.5
print("as expected" if ok else "stages %s, activations 1f1b %s gpipe %s" % (s, act, gact))' \
  "$f1b" "$gpipe" 2>&1)"
check_eq "--pipeline 2: columns, units, 1F1B vs GPipe activations" "as expected" "$verdict"
text="$("$bin" estimate --model llama-tiny -n 2 --pipeline 2 --zero 3)"
check "--pipeline table header" "| category | ZeRO 3 s0 (0..3) | ZeRO 3 s1 (4..5) |" "$text"
bad "--pipeline 3 of 4 ranks" "--pipeline 3: expected a number of stages up to 64 dividing -n 4" \
  --model llama-tiny -n 4 --pipeline 3
bad "--pipeline 7 of 6 units" "--pipeline 7: expected 1 to 6 stages" --model llama-tiny -n 7 --pipeline 7
bad "--pipeline-split 1,2" "--pipeline-split 1,2: covers 3 units: expected the model's 6 exactly" \
  --model llama-tiny -n 2 --pipeline 2 --pipeline-split 1,2
bad "--schedule zigzag" "--schedule zigzag: expected gpipe, 1f1b, interleaved, zb-h1 or zbv" --model llama-tiny --schedule zigzag
# The interleaved schedule: each stage lists its chunks' units (virtual
# stage j on stage j mod 2), and holds more activations than 1F1B's one
# chunk (each chunk's micro-batches in flight) but fewer than GPipe's
verdict="$(python3 -c 'import json, sys
i, a, g = (json.loads(x) for x in sys.argv[1:4])
s = i["stages"]
u = [st["units"] for st in s]
act = lambda d, k: d["stages"][k]["peak"]["activations"]
ok = (i["schedule"] == "interleaved" and i["virtual_stages"] == 2 and len(u) == 2
      and len(u[0]) == 4 and u[0][0] == 0 and u[0][1] == u[1][0] and u[1][1] == u[0][2]
      and u[0][3] == u[1][2] and u[1][3] == 6
      and act(a, 0) < act(i, 0) < act(g, 0))
print("as expected" if ok else (u, [act(d, 0) for d in (a, i, g)]))' \
  "$("$bin" estimate --model llama-tiny -n 4 --pipeline 2 --grad-accum 8 --zero 1 \
    --schedule interleaved --virtual-stages 2 --json)" "$f1b" "$gpipe" 2>&1)"
check_eq "--schedule interleaved: chunks' units, activations between 1F1B's and GPipe's" \
  "as expected" "$verdict"
text="$("$bin" estimate --model llama-tiny -n 2 --pipeline 2 --zero 3 --grad-accum 2 \
  --schedule interleaved --virtual-stages 2)"
check "interleaved table header" "| category | ZeRO 3 s0 (0..1,3..4) | ZeRO 3 s1 (2..2,5..5) |" "$text"
bad "--virtual-stages with 1f1b" \
  "--virtual-stages 2 with schedule 1f1b: expected 1 (more model chunks per rank need the \
interleaved schedule)" --model llama-tiny -n 2 --pipeline 2 --virtual-stages 2
bad "interleaved m not a multiple of P" \
  "schedule interleaved: --grad-accum 3 micro-batches on 2 pipeline stages: expected a \
multiple of 2" --model llama-tiny -n 2 --pipeline 2 --grad-accum 3 --schedule interleaved \
  --virtual-stages 2
text="$("$bin" estimate --model llama-tiny -n 2 --pipeline 2 --zero 1 --grad-accum 2 \
  --schedule zbv)"
check "zbv: a V, stage 0 the first and the last pieces" \
  "| category | ZeRO 1 s0 (0..1,5..5) | ZeRO 1 s1 (2..2,3..4) |" "$text"
bad "zbv with three chunks" \
  "schedule zbv with --virtual-stages 3: expected 2 (ZB-V places two model chunks per rank in a V)" \
  --model llama-tiny -n 2 --pipeline 2 --grad-accum 2 --schedule zbv --virtual-stages 3
bad "interleaved with too few units" \
  "--pipeline 2 x --virtual-stages 4 = 8 virtual stages: expected at most 6" \
  --model llama-tiny -n 2 --pipeline 2 --grad-accum 2 --schedule interleaved --virtual-stages 4

# --save-async: the staging of an asynchronous save is one rank file: at
# fp32 on one rank the parameters and both Adam moments, 3 x the params
# category (no padding on one rank); without it, nothing
verdict="$(python3 -c '
import json, sys
a = json.loads(sys.argv[1])["stages"][0]["peak"]
b = json.loads(sys.argv[2])["stages"][0]["peak"]
print("as expected" if a["staging"] == 3 * a["params"] > 0 and b["staging"] == 0
      and a["params"] == b["params"] else (a, b))' \
  "$("$bin" estimate --model llama-tiny --zero 0 --save-async --json)" \
  "$("$bin" estimate --model llama-tiny --zero 0 --json)" 2>&1)"
check_eq "--save-async: staging = one rank file" "as expected" "$verdict"
bad "--save-async with --params" "--save-async applies to --model only" --params 7e9 --save-async

# 7. `tessera simulate` (engine/simulate.h): its bytes are the plan's (one
# step, rank 0), so estimate's for every stage and hybrid; its schedule
# replays the units (ops); one-line refusals; --offload-dir's disk waited
# for by its rates.
verdict="$(python3 -c 'import json, sys
e, s = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ok = [a["comm_bytes_per_step"] == b["comm_bytes_per_step"] and
      a["comm_bytes_across_nodes_per_step"] == b["comm_bytes_across_nodes_per_step"] and
      b["step_s"] > 0 and b["step_s"] >= b["compute_s"] and b["ops"] > 0
      for a, b in zip(e["stages"], s["stages"])]
print("same" if len(ok) == 4 and all(ok) else (e["stages"], s["stages"]))' \
  "$("$bin" estimate --model llama-tiny -n 8 --shard-group 4 --ranks-per-node 4 --json)" \
  "$("$bin" simulate --model llama-tiny -n 8 --shard-group 4 --ranks-per-node 4 --json \
    --dtype fp32 --micro-batch 8 --seq 128)" 2>&1)"
check_eq "simulate: the bytes of estimate, hybrid on 2 nodes, stages 0-3" "same" "$verdict"
# a pipeline of 2 stages x 4 ranks on 2 nodes (a stage per node), GPipe:
# simulate's bytes are its largest stage's, estimate's per stage
verdict="$(python3 -c 'import json, sys
e, s = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ok = []
for b in s["stages"]:
    mine = [a for a in e["stages"] if a["zero_stage"] == b["zero_stage"]]
    ok.append(len(mine) == 2 and b["comm_bytes_per_step"] == max(a["comm_bytes_per_step"] for a in mine)
              and b["comm_bytes_across_nodes_per_step"] ==
              max(a["comm_bytes_across_nodes_per_step"] for a in mine) and b["pipeline_wait_s"] > 0
              and abs(b["step_s"] - b["compute_s"] - b["exposed_comm_s"] - b["pipeline_wait_s"])
              <= 1e-9 * b["step_s"])
print("same" if len(ok) == 4 and all(ok) and s["pipeline_stages"] == 2 else (e["stages"], s))' \
  "$("$bin" estimate --model llama-tiny -n 8 --pipeline 2 --schedule gpipe --grad-accum 4 \
    --ranks-per-node 4 --json)" \
  "$("$bin" simulate --model llama-tiny -n 8 --pipeline 2 --schedule gpipe --grad-accum 4 \
    --ranks-per-node 4 --json --dtype fp32 --micro-batch 8 --seq 128)" 2>&1)"
check_eq "simulate: the bytes of estimate, 2 pipeline stages on 2 nodes, stages 0-3" "same" \
  "$verdict"
sbad() { # sbad NAME EXPECTED-LINE ARGS... — simulate refuses: exit 2, exactly that line
  local name="$1" want="$2" err rc
  shift 2
  err="$("$bin" simulate "$@" 2>&1 >/dev/null)"
  rc=$?
  check_eq "simulate $name: exit code" 2 "$rc"
  check_eq "simulate $name: the line" "$want" "$err"
}
sbad "--intra fast" "tessera simulate: --intra fast: expected nvlink4, ib-ndr, 100gbe or GB/s,us \
(bandwidth > 0, latency >= 0; e.g. 25,2)" --model llama-tiny --intra fast
sbad "--inter 0,1" "tessera simulate: --inter 0,1: expected nvlink4, ib-ndr, 100gbe or GB/s,us \
(bandwidth > 0, latency >= 0; e.g. 25,2)" --model llama-tiny --inter 0,1
sbad "--shard-group 3" "tessera simulate: --shard-group 3: expected a divisor of the 4 \
data-parallel ranks" --model llama-tiny -n 4 --shard-group 3
sbad "--pipeline 3" "tessera simulate: --pipeline 3: expected a number of stages up to 64 \
dividing -n 4" --model llama-tiny -n 4 --pipeline 3
sbad "--pipeline-split 4,1" "tessera simulate: --pipeline-split 4,1: covers 5 units: expected \
the model's 6 exactly" --model llama-tiny -n 2 --pipeline 2 --pipeline-split 4,1 --seq 128
sbad "--profile missing" "tessera simulate: $tmp/none.json: cannot open: No such file or directory" \
  --model llama-tiny --profile "$tmp/none.json"
sbad "--disk-read 0" "tessera simulate: --disk-read 0, --disk-write 5: expected both > 0 GB/s" \
  --model llama-tiny --offload-dir "$tmp" --disk-read 0
# --offload-dir: the disk's own column; a faster disk waits less, an
# infinitely fast one not at all
disk_s() { "$bin" simulate --model llama-tiny -n 1 --zero 0 --seq 128 --offload-dir "$tmp" --json "$@" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["stages"][0]["exposed_disk_s"])'; }
slow="$(disk_s --disk-read 0.001 --disk-write 0.001)"
fast="$(disk_s --disk-read 1e12 --disk-write 1e12)"
check_eq "simulate --offload-dir: a slow disk is waited for" 1 \
  "$(python3 -c "print(int($slow > 0.01 and $fast < 1e-6))")"
check "simulate --offload-dir: its column" "exposed disk s" \
  "$("$bin" simulate --model llama-tiny -n 1 --zero 0 --seq 128 --offload-dir "$tmp")"
# --profile: one rank's compute is the trace's medians, summed (forward and
# backward of every unit, the optimizer step), as computed here from the file
make_token_shards "$tmp/data"
"$bin" train --model llama-tiny --data "$tmp/data" --seq 64 --micro-batch 2 --steps 4 \
  --trace "$tmp/trace.json" >/dev/null 2>&1
check_eq "--profile: train --trace exit code" 0 "$?"
verdict="$(python3 -c 'import json, statistics, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
by = {}
for e in ev:
    if e.get("ph") == "X" and e.get("pid") == 0 and e["name"] in ("forward", "backward", "optimizer_step"):
        by.setdefault((e["name"], e.get("args", {}).get("unit", -1)), []).append(e["dur"] * 1e-6)
want = sum(statistics.median(v) for v in by.values())
got = json.loads(sys.argv[2])["stages"][0]["compute_s"]
print("equal" if abs(got - want) <= 1e-9 * want else "%r != %r" % (got, want))' "$tmp/trace.json" \
  "$("$bin" simulate --model llama-tiny -n 1 --seq 64 --micro-batch 2 --dtype fp32 --zero 0 \
    --profile "$tmp/trace.json" --json)" 2>&1)"
check_eq "--profile: compute = the trace's medians" "equal" "$verdict"
# --profile of a twin (llama-tiny's config with 2 blocks for its 4): each of
# the model's blocks costs the median of the twin's block spans, pooled;
# embedding and head their own; AdamW by the memory model (made negligible
# here with --mem-bandwidth 1e12 GB/s, so that the sum is the spans')
python3 -c 'import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 2
json.dump(c, open(sys.argv[2], "w"))' models/configs/llama-tiny.json "$tmp/twin.json"
"$bin" train --model "$tmp/twin.json" --data "$tmp/data" --seq 64 --micro-batch 2 --steps 4 \
  --trace "$tmp/twin-trace.json" >/dev/null 2>&1
check_eq "--profile twin: train --trace exit code" 0 "$?"
twin_json="$("$bin" simulate --model llama-tiny -n 1 --seq 64 --micro-batch 2 --dtype fp32 \
  --zero 0 --profile "$tmp/twin-trace.json" --mem-bandwidth 1e12 --json)"
check_eq "--profile twin: simulate exit code" 0 "$?"
verdict="$(python3 -c 'import json, statistics, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
by = {}
for e in ev:
    u = e.get("args", {}).get("unit", -1)
    if e.get("ph") == "X" and e.get("pid") == 0 and e["name"] in ("forward", "backward"):
        by.setdefault((e["name"], "block" if 0 < u < 3 else u), []).append(e["dur"] * 1e-6)
want = sum(statistics.median(v) * (4 if k[1] == "block" else 1) for k, v in by.items())
out = json.loads(sys.argv[2])
got = out["stages"][0]["compute_s"]
print("equal" if abs(got - want) <= 1e-6 * want and out["profile_units"] == 4
      else "%r != %r (units %r)" % (got, want, out["profile_units"]))' "$tmp/twin-trace.json" \
  "$twin_json" 2>&1)"
check_eq "--profile twin: compute = embedding + 4 x the blocks' median + head" "equal" "$verdict"
out="$("$bin" simulate --model llama-tiny -n 1 --seq 64 --micro-batch 2 --dtype fp32 --zero 0 \
  --profile "$tmp/twin-trace.json")"
check "--profile twin: said" "profile of a twin of 4 units: each of the 4 blocks costs the median \
of its 2 blocks' spans; AdamW by the memory model" "$out"
# a trace whose rank 0 ran part of the model (a pipeline stage's), and a
# twin without a block: refused, naming the file
python3 -c 'import json, sys
ev = lambda pid, u, n: {"name": n, "ph": "X", "pid": pid, "dur": 10, "args": {"unit": u}}
pipe = [ev(0, u, n) for u in (0, 1, 2) for n in ("forward", "backward")]
pipe += [ev(1, u, n) for u in (3, 4, 5) for n in ("forward", "backward")]
json.dump({"traceEvents": pipe}, open(sys.argv[1], "w"))
json.dump({"traceEvents": [ev(0, u, n) for u in (0, 1) for n in ("forward", "backward")]},
          open(sys.argv[2], "w"))
gap = [ev(0, u, n) for u in range(6) for n in ("forward", "backward") if (u, n) != (2, "backward")]
json.dump({"traceEvents": gap}, open(sys.argv[3], "w"))' "$tmp/pipe-trace.json" \
  "$tmp/short-trace.json" "$tmp/gap-trace.json"
sbad "--profile without a span" "tessera simulate: $tmp/gap-trace.json: no forward or backward \
span of unit 2 on rank 0: expected a trace of this model" --model llama-tiny \
  --profile "$tmp/gap-trace.json"
sbad "--profile of a pipeline stage" "tessera simulate: $tmp/pipe-trace.json: rank 0 ran units \
0..2 of the trace's 6 (a pipeline stage): expected a trace of one rank running every unit" \
  --model llama-tiny --profile "$tmp/pipe-trace.json"
sbad "--profile of 2 units" "tessera simulate: $tmp/short-trace.json: spans of 2 units for a \
model of 6: expected this model's trace, or a twin's (embedding, one block or more, head) for a \
model of embedding, blocks and head" --model llama-tiny --profile "$tmp/short-trace.json"
echo '{"traceEvents": 3}' >"$tmp/bad-trace.json"
sbad "--profile not a trace" "tessera simulate: $tmp/bad-trace.json: field traceEvents: expected \
a train --trace file" --model llama-tiny --profile "$tmp/bad-trace.json"
sbad "--efficiency 2" "tessera simulate: --peak-tflops 989, --efficiency 2, --mem-bandwidth \
3350, --slowdown 1, --step-overhead 0: expected > 0, in (0, 1], > 0, >= 1, >= 0" \
  --model llama-tiny --efficiency 2

out="$("$bin" estimate --help)"
check_eq "--help exit code" 0 "$?"
check "--help usage" "usage: tessera estimate" "$out"

if ((fails)); then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all estimate checks passed"
