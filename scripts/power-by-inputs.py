#!/usr/bin/env python3
"""Does a kernel's speed on this GPU depend on what its inputs hold? Times cuBLAS's matmul and
PyTorch's attention backends on plain N(0, 1) inputs and on flashtune's input mixture (the
distribution its own kernels are timed on: src/gpu/trial/mixture.rs), f16 and bf16, the way
baselines/torch_sdpa.py times them (CUDA-graph replays), with a second of warm-up a row so that the
board's power management has settled, while nvidia-smi samples the SM clock, the power draw and
the power-cap throttle (asked for every 20 ms, it delivers far fewer: a short row may hold none).
Prints one table row a case.

  python3 scripts/power-by-inputs.py [--fa4] [--burst]    (FLASHTUNE_FA4_SITE as for the baselines)

--burst times as the baselines of a run do (policies.toml's [measure]: 20 ms of warm-up, 30 replays of
at least 500 µs), not at the settled clock.
"""
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
# The baselines' own adapter: its mixture, its FA4 loader, its alignments.
sys.path.insert(0, os.path.join(here, "..", "baselines"))
import torch_sdpa as sdpa  # noqa: E402

import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

REQUEST = {"warmup_ms": 1000, "samples": 30, "min_sample_us": 5000}
SHAPES = [dict(name="large-64", b=8, h=32, sq=2048, sk=2048, d=64, causal=False),
          dict(name="large-128-causal", b=2, h=16, sq=8192, sk=8192, d=128, causal=True),
          dict(name="hd256", b=2, h=16, sq=2048, sk=2048, d=256, causal=False)]
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def inputs(kind, shape, dtype, gen, layout):
    b, h, sq, sk, d = (shape[k] for k in ("b", "h", "sq", "sk", "d"))
    if kind == "normal":
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=gen) for s in (sq, sk, sk))
    else:
        q, k, v = sdpa.mixture_qkv(torch, b, h, sq, sk, d, dtype, gen)
    if layout == "bshd":
        q, k, v = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    return q, k, v


def main():
    fa4 = "--fa4" in sys.argv[1:]
    if "--burst" in sys.argv[1:]:
        REQUEST.update(warmup_ms=20, min_sample_us=500)
    log = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.sw_power_cap",
                            "--format=csv,noheader,nounits", "-lms", "20"], stdout=log)
    gen = torch.Generator(device="cuda").manual_seed(1)
    windows = []

    def timed(label, call):
        samples, _ = sdpa.graph_samples(torch, call, REQUEST)
        t1 = datetime.datetime.now()
        # The timed replays' window: they ran back to back just before t1 (the warm-up before them).
        t0 = t1 - datetime.timedelta(microseconds=sum(samples))
        windows.append((label, statistics.median(samples), t0, t1))

    n = 8192
    for dname, dtype in DTYPES.items():
        a = torch.randn(n, n, device="cuda", dtype=dtype, generator=gen)
        b = torch.randn(n, n, device="cuda", dtype=dtype, generator=gen)
        c = torch.empty(n, n, device="cuda", dtype=dtype)
        timed(f"matmul 8192 | {dname} | normal", lambda i: torch.matmul(a, b, out=c))
        del a, b, c
    backends = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]
    for shape in SHAPES:
        for dname, dtype in DTYPES.items():
            for kind in ("normal", "mixture"):
                q, k, v = inputs(kind, shape, dtype, gen, "bhsd")
                f = torch.nn.functional.scaled_dot_product_attention
                for bname, backend in backends:
                    try:
                        with sdpa_kernel(backend):
                            timed(f"{bname} {shape['name']} | {dname} | {kind}",
                                  lambda i: f(q, k, v, is_causal=shape["causal"]))
                    except Exception as exc:
                        print(f"{bname} {shape['name']} {dname}: {type(exc).__name__}", file=sys.stderr)
                del q, k, v
                if fa4:
                    attend = sdpa.flash_attn_4()
                    q, k, v = inputs(kind, shape, dtype, gen, "bshd")
                    timed(f"fa4 {shape['name']} | {dname} | {kind}", lambda i: attend(q, k, v, causal=shape["causal"]))
                    del q, k, v
    torch.cuda.synchronize()
    time.sleep(0.1)
    smi.terminate()
    smi.wait()
    log.seek(0)
    points = []
    for line in log:
        parts = [x.strip() for x in line.split(",")]
        try:
            ts = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
            points.append((ts, float(parts[1]), float(parts[2]), parts[3]))
        except (ValueError, IndexError):
            continue
    print("| case | dtype | inputs | median µs | SM MHz (mean) | power W (mean) | power-capped samples |")
    print("|---|---|---|---:|---:|---:|---:|")
    for label, median, t0, t1 in windows:
        inside = [p for p in points if t0 <= p[0] <= t1]
        clock = statistics.mean(p[1] for p in inside) if inside else float("nan")
        power = statistics.mean(p[2] for p in inside) if inside else float("nan")
        capped = sum(1 for p in inside if p[3] == "Active")
        case, dname, kind = label.split(" | ")
        print(f"| {case} | {dname} | {kind} | {median:.1f} | {clock:.0f} | {power:.0f} | {capped}/{len(inside)} |")


if __name__ == "__main__":
    main()
