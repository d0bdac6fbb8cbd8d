#!/usr/bin/env python3
"""Do flashtune's two causal alignments mean what PyTorch means? (run on the GPU machine)

flashtune's oracle (src/gpu/check.rs) lets query row i see keys j <= i + offset, with offset 0 for
"top-left" (PyTorch `is_causal=True`) and Sk - Sq for "bottom-right" (PyTorch `causal_lower_right`),
and gives a row that sees no key O = 0. Every flashtune run checks its kernels against that oracle;
this script checks the oracle's rule against PyTorch SDPA on the Sq != Sk causal shapes of
policies.toml, so the chain kernel -> oracle -> PyTorch is closed. Exit 1 on a mismatch.
"""
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

def flashtune_rule(q, k, v, alignment):
    sq, sk = q.shape[-2], k.shape[-2]
    offset = 0 if alignment == "top-left" else sk - sq
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    visible = j <= i + offset
    s = (q.double() @ k.double().transpose(-1, -2)) / q.shape[-1] ** 0.5
    s = s.masked_fill(~visible, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row with no key: O = 0
    return p @ v.double(), visible.any(dim=-1)

def pytorch(q, k, v, alignment):
    if alignment == "top-left":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[-2], k.shape[-2]))

ok = True
torch.manual_seed(0)
print("| Sq | Sk | d | alignment | dtype | rows with keys | max abs vs flashtune's rule | other alignment's rule | verdict |")
print("|---:|---:|---:|---|---|---:|---:|---:|---|")
for sq, sk, d in [(300, 77, 128), (512, 1024, 64), (1024, 512, 128), (77, 300, 128)]:
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = (torch.randn(2, 4, s, d, device="cuda", dtype=dtype) for s in (sq, sk, sk))
        for alignment, other in (("top-left", "bottom-right"), ("bottom-right", "top-left")):
            got = pytorch(q, k, v, alignment).double()
            want, has_keys = flashtune_rule(q, k, v, alignment)
            wrong, _ = flashtune_rule(q, k, v, other)
            rows = has_keys.nonzero().flatten()
            # PyTorch leaves rows with no key undefined (NaN in some backends): compare the others,
            # and say how many there are.
            err = (got[..., rows, :] - want[..., rows, :]).abs().max().item()
            err_other = (got[..., rows, :] - wrong[..., rows, :]).abs().max().item()
            tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
            good = err < tol and (sq == sk or err_other > 10 * tol)
            ok &= good
            print(f"| {sq} | {sk} | {d} | {alignment} | {str(dtype)[6:]} | {len(rows)}/{sq} | {err:.2e} | {err_other:.2e} | {'same' if good else 'MISMATCH'} |")
sys.exit(0 if ok else 1)
