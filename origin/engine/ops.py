"""The Llama forward's per-row and elementwise steps (RMSNorm, SiLU-and-multiply, RoPE), as
transformers computes them; ``kernels/`` has the fixed-order RMSNorm and SiLU that batch-invariant
runners use instead."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # as transformers' LlamaRMSNorm: statistics in fp32, scale in the model dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_table(
    rotary: Any, max_len: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ([max_len, head_dim]) of the model's rotary embedding (its own scaling) at every
    position, computed in float64 and rounded once: the same bits whichever vector unit ran it."""
    positions = torch.arange(max_len, device=device, dtype=torch.float32)
    freqs = positions[:, None] * rotary.inv_freq.to(device, torch.float32)[None, :]
    angles = torch.cat((freqs, freqs), dim=-1).double()
    scaling = float(getattr(rotary, "attention_scaling", 1.0))
    cos = (angles.cos() * scaling).to(dtype)
    sin = (angles.sin() * scaling).to(dtype)
    return cos, sin


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [tokens, heads, head_dim]; cos, sin: [tokens, 1, head_dim]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
