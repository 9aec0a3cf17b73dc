"""``Forward``: a Llama-family step in one call of the fixed-order kernels (``fo_forward``), and
the packed layers it reads (``PackedLinear``, ``LayerWeights``): the same operations in the same
order as the kernels composed with fp32 elementwise steps, bit for bit
(``tests/origin/engine/test_forward_kernel.py``), without a Python dispatch per operation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from origin.engine.kernels.abi import NO_MEMORY, PANEL, binding, gemm, pointer, weight_kind


@dataclass(frozen=True)
class PackedLinear:
    """A linear layer as the fixed-order kernels run it: y = ((x * in_scale) @ W) * scale + bias,
    each step optional, W packed by ``pack_weight``; every tensor fp32 but W."""

    packed: torch.Tensor
    out_features: int
    in_scale: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    kind: int | None = None  # Q4_1 or Q8_0: GGUF blocks; None: the packed tensor's dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The layer alone: the arithmetic ``Forward`` runs for it."""
        if self.in_scale is not None:
            x = x * self.in_scale
        y = gemm(x, self.packed, self.out_features, self.kind)
        if self.scale is not None:
            y = y * self.scale
        return y if self.bias is None else y + self.bias

    @property
    def reduction(self) -> int:
        return weight_kind(self.packed, self.kind)[1]

    @property
    def weight_bytes(self) -> int:
        return self.packed.numel() * self.packed.element_size()

    def spec(self, ffi: Any) -> dict[str, Any]:
        """The layer as ``fixed_order.h``'s ``fo_linear`` (an initializer for ``ffi.new``)."""
        for t in (self.in_scale, self.scale, self.bias):
            if t is not None and (t.dtype != torch.float32 or not t.is_contiguous()):
                raise TypeError("in_scale, scale and bias must be contiguous float32")
        kind, k = weight_kind(self.packed, self.kind)
        return {
            "w": pointer(ffi, "void *", self.packed),
            "in_scale": pointer(ffi, "float *", self.in_scale),
            "scale": pointer(ffi, "float *", self.scale),
            "bias": pointer(ffi, "float *", self.bias),
            "K": k,
            "N": self.packed.shape[0] * PANEL,
            "out": self.out_features,
            "kind": kind,
        }


@dataclass(frozen=True)
class LayerWeights:
    qkv: PackedLinear
    o: PackedLinear
    gate_up: PackedLinear
    down: PackedLinear
    input_norm: torch.Tensor  # [hidden] fp32
    post_norm: torch.Tensor


class Forward:
    """A Llama-family step in one call (``fo_forward``): the same operations in the same order as
    the kernels composed with fp32 elementwise steps, bit for bit (``tests/origin/engine/
    test_forward_kernel.py``), without a Python dispatch per operation."""

    def __init__(
        self,
        layers: list[LayerWeights],
        final_norm: torch.Tensor,
        head: PackedLinear,
        *,
        heads: int,
        kv_heads: int,
        head_dim: int,
        eps: float,
        scale: float,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> None:
        for t in (final_norm, k_cache, v_cache, cos, sin):
            if t.dtype != torch.float32 or not t.is_contiguous():
                raise TypeError("norms, caches and rotary tables must be contiguous float32")
        ffi, self._lib, _ = binding()
        self._ffi = ffi
        n_layers, slots, _, max_len, _ = k_cache.shape
        # the tensors every pointer below points into, alive as long as this step is
        self._keep = (layers, final_norm, head, k_cache, v_cache, cos, sin)
        f32 = "float *"
        self._layers = ffi.new(
            "fo_layer[]",
            [
                {
                    "qkv": w.qkv.spec(ffi), "o": w.o.spec(ffi), "gate_up": w.gate_up.spec(ffi),
                    "down": w.down.spec(ffi), "input_norm": pointer(ffi, f32, w.input_norm),
                    "post_norm": pointer(ffi, f32, w.post_norm),
                }
                for w in layers
            ],
        )  # fmt: skip
        self._dims = ffi.new(
            "fo_dims *",
            {
                "layers": n_layers, "hidden": final_norm.shape[0], "heads": heads,
                "kv_heads": kv_heads, "head_dim": head_dim, "ffn": layers[0].down.reduction,
                "slots": slots, "max_len": max_len, "eps": eps, "scale": scale,
            },
        )  # fmt: skip
        self._head = ffi.new("fo_linear *", head.spec(ffi))
        self.vocab = head.out_features
        self._args = tuple(pointer(ffi, f32, t) for t in (final_norm, k_cache, v_cache, cos, sin))

    def __call__(
        self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor
    ) -> torch.Tensor:
        """x [T, hidden] fp32 (the tokens' embeddings; overwritten), positions and slots [T],
        rows [R]: the tokens whose logits are wanted. Returns logits [R, vocab] fp32."""
        ffi = self._ffi
        x = x.float().contiguous()
        positions = positions.to(torch.int64).contiguous()
        slots = slots.to(torch.int64).contiguous()
        rows = rows.to(torch.int64).contiguous()
        width = self._head.N
        logits = torch.empty(len(rows), width, dtype=torch.float32)
        norm, k_cache, v_cache, cos, sin = self._args
        f32, i64 = "float *", "int64_t *"
        code = self._lib.fo_forward(
            self._dims, self._layers, norm, self._head, pointer(ffi, f32, x), x.shape[0],
            pointer(ffi, i64, positions), pointer(ffi, i64, slots), k_cache, v_cache, cos, sin,
            pointer(ffi, i64, rows), len(rows), pointer(ffi, f32, logits),
        )  # fmt: skip
        if code == NO_MEMORY:
            raise MemoryError("fo_forward could not allocate its scratch buffers")
        if code:
            raise ValueError("fo_forward refused a position, slot, head shape or layer")
        return logits if width == self.vocab else logits[:, : self.vocab]
