"""adamw_cpu.py — parameters per second of PyTorch's and DeepSpeed's CPU
AdamW on one fp32 tensor of N parameters, timed like kernels/bench_adamw.c
(one warm-up step, then steps until at least 1 s and 5 steps have passed;
the median step), for tools/bench_adamw.sh.

  python adamw_cpu.py N THREADS

Prints one line per optimizer that this interpreter has:
  `torch-foreach N fp32 THREADS params/s`   torch.optim.AdamW(foreach=True)
  `torch-fused N fp32 THREADS params/s`     torch.optim.AdamW(fused=True)
  `deepspeed N fp32 THREADS params/s`       deepspeed.ops.adam.DeepSpeedCPUAdam
                                            (adamw_mode=True; its C++ op is
                                            built on first use)
The hyperparameters are bench_adamw.c's: lr 1e-3, betas (0.9, 0.95),
eps 1e-8, weight decay 0.1.
"""
import statistics
import sys
import time

import torch


def rate(make, n):
    p = torch.nn.Parameter(torch.linspace(-0.5, 0.5, n))
    p.grad = torch.linspace(-0.04, 0.05, n)
    opt = make([p])
    opt.step()  # warm-up: the moments' first touch
    times = []
    start = time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < 1.0:
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return n / statistics.median(times)


def main():
    n, threads = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(threads)
    kw = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    makers = [
        ("torch-foreach", lambda ps: torch.optim.AdamW(ps, foreach=True, **kw)),
        ("torch-fused", lambda ps: torch.optim.AdamW(ps, fused=True, **kw)),
    ]
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        makers.append(("deepspeed", lambda ps: DeepSpeedCPUAdam(ps, adamw_mode=True, **kw)))
    except ImportError as e:
        print("adamw_cpu: no DeepSpeed (%s): its row is left out" % e, file=sys.stderr)
    for name, make in makers:
        print("%s %d fp32 %d %.4g" % (name, n, threads, rate(make, n)), flush=True)


if __name__ == "__main__":
    main()
