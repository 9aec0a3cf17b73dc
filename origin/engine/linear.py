"""The engine's linear layers: dense (weights stored [in, out] for fast x @ W) and INT8.

INT8 is "quantize offline, swap Linear at load" (gpt-fast). On CUDA it is bitsandbytes LLM.int8
(outlier columns kept in fp16). On CPU it is weight-only INT8 with per-output-channel scales: the
activations stay in floating point (bf16 into the kernel, fp32 around it), because this model's
activation outliers make per-tensor activation quantization (``torch.ao`` dynamic quantization)
agree with fp32 on under half of the greedy tokens. Norms, embeddings and the LM head are never
quantized.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Protocol

import torch

from origin.precision import ENGINE_QUANTIZATIONS

# clip ratios tried per output channel; the one with the least squared error wins
_CLIP_RATIOS = (1.0, 0.97, 0.94, 0.91, 0.88, 0.85)


class Linear(Protocol):
    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    @property
    def weight_bytes(self) -> int: ...


def split_columns(weight_t: torch.Tensor, parts: int = 2) -> torch.Tensor:
    """[in, out] -> [parts, in, out / parts]: a GEMV as one batched matmul over column blocks.

    MKL runs a single-row matmul on one thread; as a batch of ``parts`` column blocks it runs
    them on separate threads (~1.4x faster on 2 cores).
    """
    return torch.stack(list(weight_t.chunk(parts, dim=1))).contiguous()


def gemv_split(x: torch.Tensor, weight_split: torch.Tensor) -> torch.Tensor:
    """x: [1, in] @ columns split by ``split_columns`` -> [1, out]."""
    parts = weight_split.shape[0]
    y = torch.bmm(x.expand(parts, 1, x.shape[1]), weight_split)  # [parts, 1, out / parts]
    return y.transpose(0, 1).reshape(1, -1)


class DenseLinear:
    """y = x @ W^T + b in the weights' dtype.

    On CPU a single row goes through ``gemv_split`` (two threads on column blocks of the
    transposed weight, ~2x faster than MKL's one-thread GEMV on [out, in]); from two rows up
    oneDNN with a prepacked weight is fastest, so the CPU keeps both forms.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.bias = bias
        self.out_features = weight.shape[0]
        self.packed: torch.nn.Module | None = None
        self.weight_split: torch.Tensor | None = None
        # [in, out]; on CPU replaced by the prepacked and split forms, which cover every row count
        self.weight_t: torch.Tensor | None = weight.t().contiguous()
        on_cpu = weight.device.type == "cpu"
        if on_cpu and weight.dtype in (torch.float32, torch.bfloat16):
            module = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
            module.weight.data = weight.contiguous()
            if bias is not None:
                module.bias.data = bias
            with warnings.catch_warnings():
                # MkldnnLinear is a ScriptModule; torch.jit's deprecation notice is not ours to fix
                warnings.simplefilter("ignore", DeprecationWarning)
                from torch.utils import mkldnn

                self.packed = mkldnn.to_mkldnn(module, weight.dtype)
            if self.out_features % 2 == 0:
                self.weight_split = split_columns(weight.t())
                self.weight_t = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1 and self.weight_split is not None:
            y = gemv_split(x, self.weight_split)
            return y if self.bias is None else y + self.bias
        if self.packed is not None:
            return self.packed(x)
        assert self.weight_t is not None
        if self.bias is None:
            return x @ self.weight_t
        return torch.addmm(self.bias, x, self.weight_t)

    @property
    def weight_bytes(self) -> int:
        weight = self.weight_t if self.weight_t is not None else self.weight_split
        assert weight is not None
        return weight.numel() * weight.element_size()


class Bf16Linear:
    """CPU bf16 weights: activations cast to bf16 into one oneDNN GEMM (fp32 accumulation).

    Half the bytes of fp32 and the CPU's bf16 dot-product instructions (AVX512-BF16/AMX):
    ~2x faster than fp32 at every batch size. The residual stream, norms, attention and KV cache
    stay in fp32, so only the GEMM inputs are rounded.
    """

    compute_dtype = torch.bfloat16
    # CPU bf16 GEMM rows are bitwise independent of the row count only up to this reduction
    # length; longer reductions run in pieces summed in fp32 (see _AttentionPlan for why it matters)
    max_k = 1024

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight_t = weight.t().contiguous().to(self.compute_dtype)  # [in, out]
        in_features = weight.shape[1]
        pieces = -(-in_features // self.max_k)
        bounds = [round(i * in_features / pieces) for i in range(pieces + 1)]
        self.k_pieces = list(itertools.pairwise(bounds))
        self.weight_split = None
        if weight.shape[0] % 2 == 0 and pieces == 1:
            self.weight_split = split_columns(self.weight_t)
        self.bias = bias
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xc = x.to(self.compute_dtype)
        if len(self.k_pieces) > 1:
            parts = [(xc[:, a:b] @ self.weight_t[a:b]).to(x.dtype) for a, b in self.k_pieces]
            y = torch.stack(parts).sum(dim=0)
        elif x.shape[0] == 1 and self.weight_split is not None:
            y = gemv_split(xc, self.weight_split).to(x.dtype)
        else:
            y = (xc @ self.weight_t).to(x.dtype)
        return y if self.bias is None else y + self.bias

    @property
    def weight_bytes(self) -> int:
        return self.weight_t.numel() * self.weight_t.element_size()


def quantize_per_channel_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT8 per output channel with a per-channel clip search.

    weight: [out, in] float. Returns (int8 [out, in], scales [out] float32).
    """
    w = weight.float()
    absmax = w.abs().amax(dim=1).clamp(min=1e-8)
    best_err = torch.full_like(absmax, float("inf"))
    best_scale = absmax / 127.0
    for ratio in _CLIP_RATIOS:
        scale = absmax * ratio / 127.0
        q = torch.clamp(torch.round(w / scale[:, None]), -127, 127)
        err = ((q * scale[:, None] - w) ** 2).sum(dim=1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_scale = torch.where(better, scale, best_scale)
    q = torch.clamp(torch.round(w / best_scale[:, None]), -127, 127).to(torch.int8)
    return q.contiguous(), best_scale


class Int8WeightOnlyLinear:
    """CPU weight-only INT8: int8 weights, activations in bf16 into the kernel, fp32 around it.

    For up to 4 rows ``_weight_int8pack_mm`` reads the int8 weights directly (~3x faster than
    fp32 at batch 1). That kernel scales badly with rows, so larger batches convert the int8
    weights to bf16 on the fly and use one bf16 GEMM, then apply the per-channel scales.
    """

    compute_dtype = torch.bfloat16
    _small_m = 4

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        calibration: torch.Tensor | None = None,
    ) -> None:
        from origin.engine.calibration import activation_scales

        act_scales = None
        if calibration is not None:
            act_scales = activation_scales(weight, calibration, quantize_per_channel_int8)
        self.input_scale = None if act_scales is None else (1.0 / act_scales).to(weight.device)
        scaled = weight if act_scales is None else weight * act_scales[None, :].to(weight)
        q, scales = quantize_per_channel_int8(scaled)
        self.weight = q  # [out, in] int8
        self.scales = scales.to(self.compute_dtype)
        self.bias = bias
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_scale is not None:
            x = x * self.input_scale
        xc = x.to(self.compute_dtype)
        if x.shape[0] <= self._small_m:
            y = torch._weight_int8pack_mm(xc, self.weight, self.scales)
        else:
            y = (xc @ self.weight.to(self.compute_dtype).t()) * self.scales
        y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias

    @property
    def weight_bytes(self) -> int:
        return self.weight.numel() + self.scales.numel() * self.scales.element_size()


class BnbInt8Linear:
    """CUDA LLM.int8 (bitsandbytes): int8 weights, outlier features in fp16."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        device: torch.device,
        threshold: float = 6.0,
    ) -> None:
        import bitsandbytes as bnb

        out_features, in_features = weight.shape
        layer = bnb.nn.Linear8bitLt(
            in_features,
            out_features,
            bias=bias is not None,
            has_fp16_weights=False,
            threshold=threshold,
        )
        layer.weight = bnb.nn.Int8Params(
            weight.to(torch.float16).cpu(), requires_grad=False, has_fp16_weights=False
        )
        if bias is not None:
            layer.bias = torch.nn.Parameter(bias.to(torch.float16).cpu(), requires_grad=False)
        self.layer = layer.to(device)  # quantizes on the move to CUDA
        self.out_features = out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.to(torch.float16)).to(x.dtype)

    @property
    def weight_bytes(self) -> int:
        return int(self.layer.weight.numel())


def make_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    quantization: str,
    device: torch.device,
    calibration: torch.Tensor | None = None,
) -> Linear:
    """The linear layer for ``quantization``; ``calibration`` (sample inputs) tunes CPU INT8."""
    if quantization not in ENGINE_QUANTIZATIONS:
        raise ValueError(
            f"quantization must be one of {', '.join(ENGINE_QUANTIZATIONS)}, got {quantization!r}"
        )
    if quantization == "none":
        return DenseLinear(weight, bias)
    if quantization == "bf16":
        if device.type == "cuda":
            return DenseLinear(weight.to(torch.bfloat16), None if bias is None else bias.bfloat16())
        return Bf16Linear(weight, None if bias is None else bias.float())
    if device.type == "cuda":
        return BnbInt8Linear(weight, bias, device)
    return Int8WeightOnlyLinear(weight, None if bias is None else bias.float(), calibration)
