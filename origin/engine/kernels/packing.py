"""Weights in the layouts the fixed-order kernels read (``fixed_order.c``): dense weights in panels
of ``PANEL`` output columns, the GGUF file's own Q4_1 and Q8_0 blocks repacked by panel, and the
same blocks laid out again for 8-bit activations. Plain tensor reshuffles: no compiled library."""

from __future__ import annotations

import torch

from origin.engine.kernels.abi import (
    DENSE_KINDS,
    PANEL,
    Q4_1,
    Q4_1_A8,
    Q8_0,
    Q8_0_A8,
    Q8_0_A16,
    QK,
    weight_kind,
)


def pack_weight(weight_t: torch.Tensor) -> torch.Tensor:
    """[in, out] (fp32, bf16 or int8) -> panels [out / PANEL, in, PANEL], ``out`` zero-padded to a
    multiple of PANEL."""
    if weight_t.dtype not in DENSE_KINDS:
        raise TypeError(f"fixed-order GEMM weights are fp32, bf16 or int8, not {weight_t.dtype}")
    k, n = weight_t.shape
    pad = -n % PANEL
    if pad:
        weight_t = torch.cat([weight_t, weight_t.new_zeros(k, pad)], dim=1)
    return weight_t.reshape(k, -1, PANEL).transpose(0, 1).contiguous()


def _panels(t: torch.Tensor) -> torch.Tensor:
    """[out, ...] zero-padded to whole panels, as [panels, PANEL, ...]."""
    pad = -t.shape[0] % PANEL
    if pad:
        t = torch.cat([t, t.new_zeros(pad, *t.shape[1:])])
    return t.reshape(-1, PANEL, *t.shape[1:])


def pack_q4_1(d: torch.Tensor, m: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """GGUF Q4_1 rows -> panels of blocks (``fixed_order.c``): d, m [out, K / QK] float16, q
    [out, K] 0..15; weight = d * q + m. Returns uint8 [panels, K / QK, bytes]."""
    out, k = q.shape
    if k % QK or d.shape != (out, k // QK) or m.shape != d.shape:
        raise ValueError(f"Q4_1 blocks: q {tuple(q.shape)}, d {tuple(d.shape)}, m {tuple(m.shape)}")
    scales = [_panels(t.to(torch.float16)).transpose(1, 2).contiguous() for t in (d, m)]
    qs = _panels(q.to(torch.uint8)).reshape(-1, PANEL, k // QK, QK).permute(0, 2, 3, 1)
    # rows k and k + 1 of a column share a byte (k in the low nibble)
    nibbles = (qs[:, :, 0::2] | (qs[:, :, 1::2] << 4)).reshape(*qs.shape[:2], -1)
    return torch.cat([scales[0].view(torch.uint8), scales[1].view(torch.uint8), nibbles], dim=-1)


def pack_q8_0(d: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """GGUF Q8_0 rows -> panels of blocks: d [out, K / QK] float16, q [out, K] int8; weight =
    d * q. Returns uint8 [panels, K / QK, bytes]."""
    out, k = q.shape
    if k % QK or d.shape != (out, k // QK):
        raise ValueError(f"Q8_0 blocks: q {tuple(q.shape)}, d {tuple(d.shape)}")
    scales = _panels(d.to(torch.float16)).transpose(1, 2).contiguous()
    qs = _panels(q.to(torch.int8)).reshape(-1, PANEL, k // QK, QK).permute(0, 2, 3, 1)
    return torch.cat(
        [scales.view(torch.uint8), qs.reshape(*qs.shape[:2], -1).view(torch.uint8)], -1
    )


def with_8bit_activations(
    packed: torch.Tensor, kind: int, residual: bool = False
) -> tuple[torch.Tensor, int]:
    """Q4_1 or Q8_0 panels of blocks (``pack_q4_1``, ``pack_q8_0``) -> the same weights laid out
    for the kernels that quantize activations to 8 bits per block (``fixed_order.c``: four
    reduction rows of a column in each 32-bit lane, as VPDPBUSD reads them; Q8_0 offset to
    unsigned). Returns (blocks, kind): Q4_1_A8, Q8_0_A8, or with ``residual`` (Q8_0 only: the
    LM head) Q8_0_A16, whose activations' rounding error gets a second 8-bit pass."""
    if residual and kind != Q8_0:
        raise ValueError("the residual activation pass is for Q8_0 blocks (the LM head)")
    weight_kind(packed, kind)
    if kind not in (Q4_1, Q8_0):
        raise ValueError(f"kind {kind} is not a GGUF block kind with an 8-bit activation form")
    panels, blocks, _ = packed.shape
    if kind == Q4_1:
        nib = packed[..., 4 * PANEL :].reshape(panels, blocks, QK // 2, PANEL)
        q = torch.stack([nib & 15, nib >> 4], dim=3).reshape(panels, blocks, 4, 2, 4, PANEL)
        low, high = q[:, :, :, 0].transpose(-1, -2), q[:, :, :, 1].transpose(-1, -2)
        body = (low | (high << 4)).reshape(panels, blocks, -1)
        return torch.cat([packed[..., : 4 * PANEL], body], dim=-1).contiguous(), Q4_1_A8
    q = packed[..., 2 * PANEL :].reshape(panels, blocks, QK // 4, 4, PANEL).transpose(-1, -2)
    body = (q.reshape(panels, blocks, -1) ^ 0x80).contiguous()
    blocks_a8 = torch.cat([packed[..., : 2 * PANEL], body], dim=-1).contiguous()
    return blocks_a8, Q8_0_A16 if residual else Q8_0_A8
