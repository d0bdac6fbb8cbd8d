#!/usr/bin/env python3
"""Times PyTorch's scaled_dot_product_attention, every backend that runs on the shape, the way
flashtune times its own kernels: CUDA-graph replay of back-to-back calls, timed with CUDA events
after a warm-up, the calls rotating over distinct input sets drawn from flashtune's input mixture
(mixture_qkv below: the inputs its own kernels are timed on).

Reads one JSON request on stdin:
  {"shapes": [{"name", "b", "h", "sq", "sk", "d", "causal", "sets"}], "dtypes": ["f16", "bf16"],
   "backends": ["flash", "cudnn", "efficient", "math", "default", "fa4"], "warmup_ms": 20, "samples": 30,
   "min_sample_us": 500, "seed": 1, "ceilings": true, "device": 0}
"device" (default 0) is the CUDA ordinal of the GPU everything runs on, as flashtune's workers count
them (a run's first GPU). A shape's "causal" is false / "none" (no mask), true / "top-left" (PyTorch's is_causal: query i sees
keys 0..i) or "bottom-right" (causal_lower_right: the last query sees every key, as in decoding with
a KV cache). "sets" (default 1) is how many distinct (q, k, v) sets the timed calls rotate over, so
that call i reads set i % sets and small inputs do not sit in L2 between calls. The backend
"default" is PyTorch's own dispatch (no sdpa_kernel context). The backend "fa4" is FlashAttention-4's
forward (`flash_attn.cute.flash_attn_func`, package flash-attn-4), timed the same way where it is
installed (importable, or in the folder FLASHTUNE_FA4_SITE names, loaded with site.addsitedir so its
.pth files apply); where it is not, each of its rows says so. "ceilings": false skips the roofs
(a re-measurement of noisy rows needs none). "only" (optional), a list of [shape name, dtype,
backend], limits the rows to those (a re-measurement names exactly the noisy ones).
Prints one JSON object: {"torch": ..., "gpu": ..., "rows": [...], "ceilings": [...], "startup_s",
"ceilings_s"}; a row holds either "samples_us" (per call) or "error" (the backend refused the shape,
ran out of memory, ...), and "seconds", the wall time it took; "startup_s" is the imports and the
GPU's set-up before the first row.
The ceilings are the GPU's roofs measured in the same session and timed the same way: dense matmul
{"name": "matmul", "dtype", "value" (TFLOP/s), "unit"} per dtype, and device copy bandwidth
{"name": "copy", "dtype": null, "value" (GB/s, bytes read + written), "unit"}, the same for a read-only
{"name": "read", ...} stream; or "error" instead of value and unit.
Exit code 3 when PyTorch or a GPU is missing, with the reason on stderr.

With --versions it reads no request, imports nothing it times and prints {"versions": {package:
version}}: Python's, and those of the installed packages whose code the figures come from (torch,
triton, NVIDIA's cuDNN, cuBLAS and CUDA runtime wheels, flash-attn-4, also from FLASHTUNE_FA4_SITE).
flashtune keys stored baselines on them: a figure stands for a new one only under the same versions.
"""
import json
import math
import statistics
import sys
import time

# The backends flashtune knows, in the order the report lists them; "default" is PyTorch's dispatch.
BACKENDS = ("flash", "cudnn", "efficient", "math", "default", "fa4")


# Distributions whose code times or is timed: a new version can move a baseline's figure. By name,
# and by prefix for NVIDIA's library wheels (named per CUDA major) and FlashAttention's.
TIMED_PACKAGES = ("torch", "triton", "nvidia-cutlass-dsl")
TIMED_PREFIXES = ("nvidia-cudnn", "nvidia-cublas", "nvidia-cuda-runtime", "nvidia-cuda-nvrtc",
                  "flash-attn")


def versions() -> dict:
    """The timed packages' versions from their metadata, without importing any of them (fast)."""
    import os
    import platform
    from importlib import metadata
    paths = list(sys.path)
    site_dir = os.environ.get("FLASHTUNE_FA4_SITE")
    if site_dir:
        paths.insert(0, site_dir)
    found = {"python": platform.python_version()}
    for dist in metadata.distributions(path=paths):
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in TIMED_PACKAGES or name.startswith(TIMED_PREFIXES):
            found.setdefault(name, dist.version)  # the first on the path is the one imported
    return found


def main() -> int:
    if sys.argv[1:] == ["--versions"]:
        json.dump({"versions": versions()}, sys.stdout)
        print()
        return 0
    request = json.load(sys.stdin)
    started = time.monotonic()
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as exc:  # ImportError, or a broken install
        print(f"PyTorch is not importable: {exc}", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("PyTorch sees no CUDA device", file=sys.stderr)
        return 3
    device = int(request.get("device", 0))
    if not 0 <= device < torch.cuda.device_count():
        print(f"GPU {device} requested, {torch.cuda.device_count()} visible", file=sys.stderr)
        return 3
    torch.cuda.set_device(device)  # every "cuda" below is this GPU, FlashAttention-4's calls too

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH,
                "default": None, "fa4": None}
    dtypes = {"f16": torch.float16, "bf16": torch.bfloat16}
    gen = torch.Generator(device="cuda").manual_seed(int(request.get("seed", 1)))
    rows = []
    startup_s = time.monotonic() - started
    only = {tuple(r) for r in request["only"]} if "only" in request else None
    for shape in request["shapes"]:
        for dtype_name in request["dtypes"]:
            for backend in request.get("backends", list(BACKENDS)):
                if only is not None and (shape["name"], dtype_name, backend) not in only:
                    continue
                row_started = time.monotonic()
                row = {"shape": shape["name"], "dtype": dtype_name, "backend": backend}
                try:
                    if backend not in backends:
                        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
                    if backend == "fa4":
                        row["samples_us"], row["launches_per_sample"] = time_fa4(
                            torch, dtypes[dtype_name], shape, request, gen)
                    else:
                        row["samples_us"], row["launches_per_sample"] = time_one(
                            torch, sdpa_kernel, backends[backend], dtypes[dtype_name], shape, request, gen)
                except Exception as exc:  # a backend that does not support the shape says so here
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
                    torch.cuda.synchronize()
                row["seconds"] = time.monotonic() - row_started
                rows.append(row)
    ceilings_started = time.monotonic()
    ceilings = measure_ceilings(torch, dtypes, request, gen) if request.get("ceilings", True) else []
    json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "rows": rows,
               "ceilings": ceilings, "startup_s": startup_s,
               "ceilings_s": time.monotonic() - ceilings_started}, sys.stdout)
    print()
    return 0


def alignment(causal):
    """A shape's mask: None, "top-left" or "bottom-right" (flashtune writes true for top-left)."""
    if causal is True or causal == "top-left":
        return "top-left"
    if causal is False or causal is None or causal == "none":
        return None
    if causal == "bottom-right":
        return "bottom-right"
    raise ValueError(f"unknown causal alignment {causal!r}")


def sdpa_call(torch, shape):
    """The call to time, given one (q, k, v) set, with the shape's mask aligned as it says."""
    f = torch.nn.functional.scaled_dot_product_attention
    mask = alignment(shape.get("causal", False))
    if mask == "bottom-right":
        from torch.nn.attention.bias import causal_lower_right
        bias = causal_lower_right(shape["sq"], shape["sk"])
        return lambda q, k, v: f(q, k, v, attn_mask=bias, is_causal=False)
    causal = mask == "top-left"
    return lambda q, k, v: f(q, k, v, is_causal=causal)


def time_one(torch, sdpa_kernel, backend, dtype, shape, request, gen):
    b, h, sq, sk, d = (shape[k] for k in ("b", "h", "sq", "sk", "d"))
    n_sets = max(1, int(shape.get("sets", 1)))
    # flashtune's own input mixture, never zeros, a fresh draw per set (mixture_qkv says why).
    sets = [mixture_qkv(torch, b, h, sq, sk, d, dtype, gen) for _ in range(n_sets)]
    attend = sdpa_call(torch, shape)

    def call(i):
        return attend(*sets[i % n_sets])

    if backend is None:  # PyTorch's own choice, as a user who names no backend gets it
        call(0)
        return graph_samples(torch, call, request, n_sets)
    with sdpa_kernel(backend):
        call(0)  # raises if the backend cannot run this shape
        return graph_samples(torch, call, request, n_sets)


# The inputs every attention backend is timed on: flashtune's input mixture
# (src/gpu/trial/mixture.rs, which says why), the distribution its own kernels are timed on. An H200
# under these kernels runs at its 700 W cap, and its SM clock then depends on what the tensor cores
# multiply: on N(0, 1) inputs instead of the mixture, timed as a run times, cuDNN's figures moved by
# -9 to +2 % and FlashAttention-4's by -1 to +4 % (at a settled clock cuDNN's by +1 to +4 %;
# scripts/power-by-inputs.py, docs/measurements/2026-11-30-h200-epilogue), so a baseline timed on
# other inputs than the kernel it is compared with moves the ratio by as much. Per head, out of 8:
# plain N(0, 1) 2, wide 2 (Q and K times sigma in 2..8), aligned 1 (Q and K rows along one shared
# direction, rho 0.9, gain 1..2), spiky 1 (three channels of Q and K at +-m, m in 4..10), outlier
# tokens 2 (one key row in 16 times f, f in 4..40). V is always N(0, 1).
ALIGNED_NOISE, ALIGNED_SHARED = math.sqrt(0.1), math.sqrt(0.9)


def mixture_qkv(torch, b, h, sq, sk, d, dtype, gen):
    """Q, K, V of shape (b, h, s, d) drawn from flashtune's input mixture, each head its own component."""
    heads = b * h
    dev = "cuda"

    def randn(*size):
        return torch.randn(*size, device=dev, dtype=torch.float32, generator=gen)

    def randint(high, *size):
        return torch.randint(0, high, size, device=dev, generator=gen)

    q, k, v = randn(heads, sq, d), randn(heads, sk, d), randn(heads, sk, d)
    pick = randint(8, heads)
    par = randint(1 << 16, heads).float()
    col = lambda x: x[:, None, None]  # a per-head value against (head, row, channel)
    wide = (pick >= 2) & (pick <= 3)
    sigma = torch.where(wide, 2 + torch.remainder(par, 7), torch.ones_like(par))
    q, k = q * col(sigma), k * col(sigma)
    sign_q, sign_k = randint(2, heads, sq, 1) * 2.0 - 1.0, randint(2, heads, sk, 1) * 2.0 - 1.0
    direction = randn(heads, 1, d)
    gain = col(1 + 0.25 * torch.remainder(par, 5))
    aligned = col(pick == 4)
    q = torch.where(aligned, ALIGNED_NOISE * q + ALIGNED_SHARED * gain * sign_q * direction, q)
    k = torch.where(aligned, ALIGNED_NOISE * k + ALIGNED_SHARED * gain * sign_k * direction, k)
    channels = torch.zeros(heads, d, device=dev).scatter_(1, randint(d, heads, 3), 1.0)[:, None, :]
    spike = col((pick == 5).float() * (4 + torch.remainder(par, 7))) * channels
    q, k = q + spike * sign_q, k + spike * sign_k
    outlier_rows = col(pick >= 6) & (randint(16, heads, sk, 1) == 0)
    k = torch.where(outlier_rows, k * col(4 + torch.remainder(par, 37)), k)
    return tuple(x.view(b, h, -1, d).to(dtype) for x in (q, k, v))


def flash_attn_4():
    """FlashAttention-4's forward, or an ImportError saying it is not installed."""
    import os
    site_dir = os.environ.get("FLASHTUNE_FA4_SITE")
    if site_dir:
        import site
        site.addsitedir(site_dir)
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as exc:
        raise ImportError(f"flash-attn-4 not installed ({type(exc).__name__}: {exc})") from None
    return flash_attn_func


def time_fa4(torch, dtype, shape, request, gen):
    """FA4 on the shape, timed as the SDPA backends are. Its layout is (batch, seqlen, heads, dim) and
    its causal mask is bottom-right aligned (as FlashAttention >= 2.1): a top-left mask with Sq != Sk
    is one it cannot run."""
    attend = flash_attn_4()
    b, h, sq, sk, d = (shape[k] for k in ("b", "h", "sq", "sk", "d"))
    mask = alignment(shape.get("causal", False))
    if mask == "top-left" and sq != sk:
        raise ValueError("FA4's causal mask is bottom-right aligned; top-left with Sq != Sk is not its mask")
    causal = mask is not None
    n_sets = max(1, int(shape.get("sets", 1)))
    sets = [tuple(x.transpose(1, 2).contiguous() for x in mixture_qkv(torch, b, h, sq, sk, d, dtype, gen))
            for _ in range(n_sets)]

    def call(i):
        return attend(*sets[i % n_sets], causal=causal)

    call(0)  # compiles the kernel for this shape (1-3 s the first time), raises if it cannot run it
    return graph_samples(torch, call, request, n_sets)


# A matmul this size runs long enough on any datacenter GPU to reach its sustained clock.
MATMUL_N = 8192
# Far beyond any L2, so the copy streams from and to DRAM.
COPY_BYTES = 1 << 30


def measure_ceilings(torch, dtypes, request, gen):
    ceilings = []
    for name in request["dtypes"]:
        entry = {"name": "matmul", "dtype": name}
        try:
            n = MATMUL_N
            a = torch.randn(n, n, device="cuda", dtype=dtypes[name], generator=gen)
            b = torch.randn(n, n, device="cuda", dtype=dtypes[name], generator=gen)
            c = torch.empty(n, n, device="cuda", dtype=dtypes[name])
            samples, _ = graph_samples(torch, lambda i: torch.matmul(a, b, out=c), request)
            entry.update(value=2.0 * n ** 3 / statistics.median(samples) / 1e6, unit="TFLOP/s")
            del a, b, c
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
        ceilings.append(entry)
    entry = {"name": "copy", "dtype": None}
    try:
        src = torch.randint(0, 256, (COPY_BYTES,), device="cuda", dtype=torch.uint8, generator=gen)
        dst = torch.empty_like(src)
        samples, _ = graph_samples(torch, lambda i: dst.copy_(src), request)
        entry.update(value=2.0 * COPY_BYTES / statistics.median(samples) / 1e3, unit="GB/s")
        del src, dst
    except Exception as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
    ceilings.append(entry)
    # Attention streams K and V in and writes little, and HBM reads alone run faster than a copy's
    # mix of reads and writes: a read-only reduction is the roof a decode kernel is held to.
    entry = {"name": "read", "dtype": None}
    try:
        src = torch.randn(COPY_BYTES // 2, device="cuda", dtype=torch.float16, generator=gen)
        total = torch.empty((), device="cuda", dtype=torch.float32)
        samples, _ = graph_samples(
            torch, lambda i: torch.sum(src, 0, dtype=torch.float32, out=total), request)
        entry.update(value=COPY_BYTES / statistics.median(samples) / 1e3, unit="GB/s")
        del src, total
    except Exception as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
    ceilings.append(entry)
    torch.cuda.synchronize()
    return ceilings


def graph_samples(torch, call, request, n_sets=1):
    """Per-call microseconds of `call(i)`: enough calls per CUDA graph that a replay lasts at least
    min_sample_us (a whole number of rounds over the input sets, call i reading set i % n_sets), a
    warm-up, then one sample per replay."""
    call(0)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call(0)
    end.record()
    torch.cuda.synchronize()
    single_us = max(start.elapsed_time(end) * 1000.0, 0.5)
    launches = max(1, min(1000, math.ceil(request["min_sample_us"] / single_us)))
    # Every set as often as every other: a partial round would weigh the first sets more.
    launches = max(n_sets, math.ceil(launches / n_sets) * n_sets)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(max(3, n_sets)):  # warm the library's own workspace before capture
            call(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            call(i)
    warm_us = 0.0
    while warm_us < request["warmup_ms"] * 1000.0:
        warm_us += replay_us(torch, graph, start, end)
    samples = [replay_us(torch, graph, start, end) / launches for _ in range(request["samples"])]
    return samples, launches


def replay_us(torch, graph, start, end):
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0


if __name__ == "__main__":
    sys.exit(main())
