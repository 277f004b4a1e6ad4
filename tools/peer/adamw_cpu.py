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

Then, whether each computes the bits of torch.optim.AdamW's default
(foreach; the same bits as its single-tensor loop): 3 steps on 65536
parameters from the same start, one line each
  `bits NAME DIFFERING 65536`
with tessera's element update (kernels/elementwise.h ts_adamw_element, the
one the CPU and CUDA kernels run: its fp32 operations in its order, each
one tensor op here, so each rounded once) as NAME tessera.
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


def tessera_adamw(params, lr, betas, eps, weight_decay):
    """ts_adamw_element (kernels/elementwise.h), one fp32 tensor op per
    operation in its order: the coefficients from doubles as
    ts_adamw_make_coeffs makes them."""
    b1, b2 = betas
    state = {"t": 0}

    class Opt:
        def step(self):
            state["t"] += 1
            t = state["t"]
            f = lambda x: torch.tensor(x, dtype=torch.float32)
            decay = f(1.0 - lr * weight_decay)
            step_size = f(lr / (1.0 - b1 ** t))
            bc2_sqrt = f((1.0 - b2 ** t) ** 0.5)
            one_b1, one_b2 = f(1.0) - f(b1), f(1.0) - f(b2)
            for p in params:
                st = state.setdefault(id(p), [torch.zeros_like(p), torch.zeros_like(p)])
                m, v = st
                g = p.grad.detach()
                mi = m + one_b1 * (g - m)
                vi = f(b2) * v + (one_b2 * g) * g
                denom = torch.sqrt(vi) / bc2_sqrt + f(eps)
                with torch.no_grad():
                    p.copy_(p * decay - step_size * (mi / denom))
                st[0], st[1] = mi, vi

    return Opt()


def differing(make, reference, n=65536):
    """Elements whose bits differ from reference's after 3 steps."""
    out = []
    for mk in (make, reference):
        p = torch.nn.Parameter(torch.linspace(-0.5, 0.5, n))
        opt = mk([p])
        for s in range(3):
            p.grad = torch.sin(torch.arange(n, dtype=torch.float32) * (0.37 + s)) * 0.05
            opt.step()
        out.append(p.detach().view(torch.int32).clone())
    return int((out[0] != out[1]).sum())


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
    reference = makers[0][1]  # foreach: torch.optim.AdamW's default on the CPU
    single = lambda ps: torch.optim.AdamW(ps, foreach=False, **kw)
    bit_makers = makers[1:] + [("torch-single", single),
                               ("tessera", lambda ps: tessera_adamw(ps, **kw))]
    for name, make in bit_makers:
        print("bits %s %d 65536" % (name, differing(make, reference)), flush=True)


if __name__ == "__main__":
    main()
