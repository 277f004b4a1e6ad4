#!/usr/bin/env python3
"""check_tensorboard.py — reads a `train --tensorboard DIR` event file with
TensorBoard's own reader (EventAccumulator) and checks every scalar against
the same run's `--metrics FILE` (JSON Lines): each step's train/loss,
train/lr, train/grad_norm, train/loss_scale, perf/tokens_per_s, perf/gflops
and each evaluation's val/loss, to float32 precision (the event file stores
simple_value as a float: relative 2^-24, bound 1e-6), and that every
memory/* tag has a value at every step.

    python3 tools/check_tensorboard.py TB_DIR METRICS.jsonl

Needs the `tensorboard` package (PyPI; not a Debian package, so CI does not
run this: engine/tensorboard_test checks the records and their CRCs, and a
developer runs this on a real run: README, "train --tensorboard").
Prints what it compared; exits 1 on the first difference.
"""
import json
import sys

from tensorboard.backend.event_processing import event_accumulator


def main():
    tb_dir, metrics = sys.argv[1], sys.argv[2]
    acc = event_accumulator.EventAccumulator(tb_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    got = {t: {e.step: e.value for e in acc.Scalars(t)} for t in tags}
    steps, evals = [], []
    for line in open(metrics):
        rec = json.loads(line)
        if "val_loss" in rec:
            evals.append(rec)
        elif "loss" in rec and "step" in rec:
            steps.append(rec)
    pairs = {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm",
             "train/loss_scale": "loss_scale", "perf/tokens_per_s": "tokens_per_s",
             "perf/gflops": "gflops"}
    n = 0
    for tag, key in pairs.items():
        for rec in steps:
            want = rec[key]
            if want is None:
                continue
            have = got.get(tag, {}).get(rec["step"])
            if have is None or abs(have - want) > 1e-6 * max(abs(want), 1e-30):
                print(f"{tag} step {rec['step']}: event file {have}, metrics {want}")
                return 1
            n += 1
    for rec in evals:
        have = got.get("val/loss", {}).get(rec["step"])
        if have is None or abs(have - rec["val_loss"]) > 1e-6 * abs(rec["val_loss"]):
            print(f"val/loss step {rec['step']}: event file {have}, metrics {rec['val_loss']}")
            return 1
        n += 1
    mem = [t for t in tags if t.startswith("memory/")]
    want_mem = {f"memory/{c}_MiB" for c in ("params", "grads", "master", "optim", "activations",
                                            "comm", "workspace", "staging", "peak")}
    if set(mem) != want_mem:
        print(f"memory tags {sorted(mem)}, expected {sorted(want_mem)}")
        return 1
    for t in mem:
        if sorted(got[t]) != [r["step"] for r in steps]:
            print(f"{t}: steps {sorted(got[t])}, expected every step")
            return 1
    print(f"tensorboard's EventAccumulator: {len(tags)} tags, {len(steps)} steps, "
          f"{len(evals)} evaluations; {n} values equal the metrics file; memory tags: "
          f"{', '.join(sorted(mem))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
