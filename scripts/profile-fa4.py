#!/usr/bin/env python3
"""FlashAttention-4's forward on one policy shape, once inside an NVTX range "fa4", for Nsight Compute
to profile beside flashtune's own kernels with the same metrics (gpu-session.sh's fa4-ncu stage):

  ncu --nvtx --nvtx-include "fa4/" --metrics "$(python3 scripts/profile-fa4.py --metrics)" \
      python3 scripts/profile-fa4.py SHAPE DTYPE          (FLASHTUNE_FA4_SITE as for the baselines)

--metrics prints policies.toml's [profile] metrics, comma-separated. The inputs are flashtune's
mixture, as the baselines draw them; the call before the range compiles the kernel.
"""
import os
import sys
import tomllib

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "..", "policies.toml"), "rb") as f:
    policies = tomllib.load(f)
if sys.argv[1:] == ["--metrics"]:
    print(",".join(policies["profile"]["metrics"]))
    sys.exit(0)
if len(sys.argv) != 3:
    sys.exit(__doc__)
name, dtype_name = sys.argv[1], sys.argv[2]
shape = next((s for s in policies["shapes"] if s["name"] == name), None)
if shape is None:
    sys.exit(f"profile-fa4: no shape named {name} in policies.toml")

# The baselines' own adapter: its mixture, its FA4 loader, its alignments.
sys.path.insert(0, os.path.join(here, "..", "baselines"))
import torch_sdpa as sdpa  # noqa: E402
import torch  # noqa: E402

dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
attend = sdpa.flash_attn_4()
b, h, sq, sk, d = (shape[k] for k in ("b", "h", "sq", "sk", "d"))
causal = sdpa.alignment(shape.get("causal", False)) is not None
gen = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (x.transpose(1, 2).contiguous() for x in sdpa.mixture_qkv(torch, b, h, sq, sk, d, dtype, gen))
attend(q, k, v, causal=causal)
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("fa4")
attend(q, k, v, causal=causal)
torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
