#!/usr/bin/env bash
# check_unchanged.sh — shows that a change left training bitwise unchanged:
# the same fixed set of runs with the tessera of an earlier revision (the
# "before") and with the working tree (the "after"), on this machine, in one
# script run, and every loss, gradient norm, learning rate, loss scale,
# skipped step, communication byte count, validation loss and ledger figure
# compared exactly.
#
#   tools/check_unchanged.sh BASE_REV [AFTER_BIN]
#
# BASE_REV is built once in a git worktree by tools/build_rev.sh (cached by
# commit); AFTER_BIN defaults to the working tree's
# //tools:tessera, built here. Three suites of runs, 10 steps each
# (micro-batch 4, seq 64, an evaluation every 5 steps) on generated corpora
# (no SentencePiece, no download), before and after interleaved run by run:
#   llama     llama-tiny on 1 and 2 ranks, ZeRO stages 0-3, fp32/bf16/fp16,
#             activation checkpointing none/all, gradient accumulation 2
#             (48 runs; CHECK_MODEL, a preset or config.json path, and
#             CHECK_ACCUM replace llama-tiny and 2);
#   bert      bert-tiny's masked LM on a corpus with prepare --mlm's special
#             ids, 1 and 2 ranks, ZeRO 0 and 3, fp32/bf16, checkpointing
#             none/all, accumulation 2 (16 runs);
#   pipeline  llama-tiny on 2 pipeline stages (2 ranks: P 2; 4 ranks: P 2 x
#             dp 2), 1F1B and GPipe, ZeRO 0 and 3, fp32/bf16, 4 micro-batches
#             per step (16 runs).
# CHECK_SUITES picks some (default "llama bert pipeline"). Timings (and
# what is derived from them: MFU, the straggler report) and peak RSS are
# not compared (they are not deterministic); a figure only the
# "after" reports is listed, not failed. Prints one line per run
# ("identical" or what differs), one per suite ("N of N runs identical")
# and exits 1 if any run differs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE_REV="${1:?usage: tools/check_unchanged.sh BASE_REV [AFTER_BIN]}"
AFTER_BIN="${2:-}"
cd "$ROOT"
tools/setup.sh

base_sha="$(git rev-parse --verify "$BASE_REV^{commit}")"
read -r BASE_BIN BASE_TREE < <(tools/build_rev.sh "$BASE_REV")
if [[ -z "$AFTER_BIN" ]]; then
  bazel build --ui_event_filters=-info,-progress --noshow_progress //tools:tessera
  AFTER_BIN="$ROOT/bazel-bin/tools/tessera"
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# Copies of the "after" binary and of the launcher, so that building or
# editing the tree while the runs go on changes nothing they use.
cp "$AFTER_BIN" "$TMP/after-tessera"
AFTER_BIN="$TMP/after-tessera"
cp tools/launch.sh "$TMP/launch.sh"
MODEL="${CHECK_MODEL:-llama-tiny}"
ACCUM="${CHECK_ACCUM:-2}"
SUITES="${CHECK_SUITES:-llama bert pipeline}"
for suite in $SUITES; do
  case "$suite" in
    llama | bert | pipeline) ;;
    *) echo "check_unchanged: CHECK_SUITES: unknown '$suite' (llama, bert, pipeline)" >&2; exit 2 ;;
  esac
done

# Corpora of a 4096-token vocabulary in llm.c's shard layout: runs of
# consecutive ids with a pseudo-random restart every 17 tokens; the masked
# LM's avoids ids 0-4 (prepare --mlm's [PAD] [UNK] [CLS] [SEP] [MASK]) and
# carries the meta.json that says so.
python3 - "$TMP/data" "$TMP/data-mlm" <<'PY'
import json, os, struct, sys
V = 4096
for out, low in ((sys.argv[1], 0), (sys.argv[2], 5)):
    os.makedirs(out, exist_ok=True)
    s = 7
    def tokens(n):
        global s
        t = []
        for i in range(n):
            s = (s * 1103515245 + 12345) % 2**32
            t.append(low + (s >> 16) % (V - low) if i % 17 == 0 else low + (t[-1] + 1 - low) % (V - low))
        return t
    for name, n in (("train.bin", 40000), ("val.bin", 6000)):
        t = tokens(n)
        header = [20240520, 1, n] + [0] * 253
        with open(os.path.join(out, name), "wb") as f:
            f.write(struct.pack("<256i", *header))
            f.write(struct.pack("<%dH" % n, *t))
    if low:
        meta = {"version": 1, "vocab_size": V, "token_dtype": "uint16", "mlm": True,
                "special_ids": {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}}
        with open(os.path.join(out, "meta.json"), "w") as f:
            json.dump(meta, f)
PY

# One run: "SUITE NP NAME FLAGS...", its flags beside the common ones.
runs=()
for suite in $SUITES; do
  case "$suite" in
    llama)
      for np in 1 2; do for dtype in fp32 bf16 fp16; do for ac in none all; do for zero in 0 1 2 3; do
        runs+=("llama $np np${np}-${dtype}-${ac}-zero${zero} --model $MODEL --data $TMP/data
          --grad-accum $ACCUM --dtype $dtype --activation-checkpointing $ac --zero $zero")
      done; done; done; done ;;
    bert)
      for np in 1 2; do for dtype in fp32 bf16; do for ac in none all; do for zero in 0 3; do
        runs+=("bert $np bert-np${np}-${dtype}-${ac}-zero${zero} --model bert-tiny
          --data $TMP/data-mlm --grad-accum 2 --dtype $dtype --activation-checkpointing $ac
          --zero $zero")
      done; done; done; done ;;
    pipeline)
      for np in 2 4; do for sched in 1f1b gpipe; do for dtype in fp32 bf16; do for zero in 0 3; do
        runs+=("pipeline $np pp2-np${np}-${sched}-${dtype}-zero${zero} --model llama-tiny
          --data $TMP/data --pipeline 2 --schedule $sched --grad-accum 4 --dtype $dtype
          --zero $zero")
      done; done; done; done ;;
  esac
done

# run WHICH BIN HOME SUITE NP NAME FLAGS...: one training run's metrics into
# $TMP/WHICH-NAME.jsonl (its output into .log).
run() {
  local which="$1" bin="$2" home="$3" np="$5" name="$6"
  shift 6
  # shellcheck disable=SC2068 # the run's flags, split on purpose
  TESSERA_HOME="$home" OMP_NUM_THREADS=1 "$TMP/launch.sh" -n "$np" "$bin" train \
    --steps 10 --micro-batch 4 --seq 64 --lr 3e-3 --warmup 2 --eval-every 5 --eval-batches 2 \
    --metrics "$TMP/$which-$name.jsonl" --log-every 10 $@ >"$TMP/$which-$name.log" 2>&1 ||
    { echo "$which $name failed:"; tail -5 "$TMP/$which-$name.log"; exit 1; }
}

echo "before: $BASE_REV ($base_sha), after: $AFTER_BIN; ${#runs[@]} runs each" \
  "(suites: $SUITES; llama: $MODEL, accumulation $ACCUM)"
for r in "${runs[@]}"; do
  # shellcheck disable=SC2086
  run before "$BASE_BIN" "$BASE_TREE" $r
  # shellcheck disable=SC2086
  run after "$AFTER_BIN" "$ROOT" $r
done

python3 - "$TMP" "${runs[@]}" <<'PY'
import json, os, sys
tmp, runs = sys.argv[1], sys.argv[2:]
# Not deterministic: wall-clock rates and times (every "*_seconds", the
# ranks' time medians and the straggler they name, MFU from the rate) and
# the resident set size.
VOLATILE = {"tokens_per_s", "gflops", "mfu", "peak_rss", "time_by_rank", "straggler"}

def volatile(k):
    return k in VOLATILE or k.endswith("_seconds")

def records(path):
    return [json.loads(l) for l in open(path)]

def diff(a, b, where, out, extra):
    """Every value of a (the before) must be in b with the same bits."""
    if isinstance(a, dict):
        if not isinstance(b, dict):
            out.append(f"{where}: {a!r} vs {b!r}")
            return
        for k in a:
            if volatile(k):
                continue
            if k not in b:
                out.append(f"{where}.{k}: missing after")
            else:
                diff(a[k], b[k], f"{where}.{k}", out, extra)
        extra.update(f"{where}.{k}" for k in b if k not in a and not volatile(k))
    elif isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            out.append(f"{where}: lengths {len(a)} vs {len(b) if isinstance(b, list) else b!r}")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{where}[{i}]", out, extra)
    elif a != b or type(a) != type(b):
        out.append(f"{where}: {a!r} before, {b!r} after")

bad = 0
per_suite = {}
for r in runs:
    suite, _, name = r.split()[:3]
    n_runs, n_bad = per_suite.get(suite, (0, 0))
    a = records(os.path.join(tmp, f"before-{name}.jsonl"))
    b = records(os.path.join(tmp, f"after-{name}.jsonl"))
    out, extra = [], set()
    diff(a, b, "metrics", out, extra)
    steps = sum(1 for x in a if "loss" in x)
    note = f" (after adds {', '.join(sorted(k.split('.', 1)[1] for k in extra))})" if extra else ""
    if out:
        bad += 1
        n_bad += 1
        print(f"{name}: DIFFERS ({len(out)}): " + "; ".join(out[:4]))
    else:
        print(f"{name}: identical ({steps} steps, {len(a)} records){note}")
    per_suite[suite] = (n_runs + 1, n_bad)
for suite, (n_runs, n_bad) in per_suite.items():
    print(f"{suite}: {n_runs - n_bad} of {n_runs} runs identical")
print(f"{len(runs) - bad} of {len(runs)} runs identical")
sys.exit(1 if bad else 0)
PY
