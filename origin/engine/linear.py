"""The engine's linear layers: dense (weights stored [in, out] for fast x @ W) and INT8.

INT8 is "quantize offline, swap Linear at load" (gpt-fast). On CUDA it is bitsandbytes LLM.int8
(outlier columns kept in fp16), quantized where the weights lie. On CPU it is weight-only INT8
with per-output-channel scales: the activations stay in floating point (bf16 into the kernel,
fp32 around it), because this model's activation outliers make per-tensor activation
quantization (``torch.ao`` dynamic quantization) agree with fp32 on under half of the greedy
tokens. Norms and embeddings are never quantized.

Which class multiplies for a precision, on which kernels, is its registry entry's
(``origin/precision.py``, ``Precision.linears``); ``make_linear`` builds it.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable
from typing import Protocol

import torch

from origin.engine import kernels
from origin.precision import Backend, LinearKind, Precision, WeightFormat

# clip ratios tried per output channel; the one with the least squared error wins
_CLIP_RATIOS = (1.0, 0.97, 0.94, 0.91, 0.88, 0.85)


class Linear(Protocol):
    @property
    def out_features(self) -> int: ...

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
        self.dtype = weight.dtype
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
        if x.dtype != self.dtype:  # a bf16 LM head after fp16 layers (LLM.int8's, on CUDA)
            return self(x.to(self.dtype)).to(x.dtype)
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
    # length; longer reductions run in pieces summed in fp32 (see attention.py for why it matters)
    max_k = 1024

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight_t = weight.t().contiguous().to(self.compute_dtype)  # [in, out]
        self.k_pieces = k_pieces(weight.shape[1], self.max_k)
        self.weight_split = None
        if weight.shape[0] % 2 == 0 and len(self.k_pieces) == 1:
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
    # the weights in steps of absmax / 127: a row's error under each clip ratio is then measured
    # in the same unit for every ratio, so the search needs no per-ratio rescaling
    unit = w * (127.0 / absmax)[:, None]
    step = torch.empty_like(unit)
    best_err = torch.full_like(absmax, float("inf"))
    best_ratio = torch.ones_like(absmax)
    for ratio in _CLIP_RATIOS:
        torch.div(unit, ratio, out=step).round_().clamp_(-127, 127).mul_(ratio).sub_(unit)
        err = step.square_().sum(dim=1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_ratio = torch.where(better, ratio, best_ratio)
    scale = absmax * best_ratio / 127.0
    q = torch.div(w, scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale


def k_pieces(in_features: int, max_k: int, align: int = 1) -> list[tuple[int, int]]:
    """``[0, in_features)`` in the fewest near-equal pieces of at most ``max_k``, each a multiple
    of ``align`` long (``in_features`` must be one)."""
    units, max_units = in_features // align, max(1, max_k // align)
    pieces = -(-units // max_units)
    base, extra = divmod(units, pieces)
    bounds = [0]
    for i in range(pieces):
        bounds.append(bounds[-1] + (base + (i < extra)) * align)
    return list(itertools.pairwise(bounds))


def calibrated_int8(
    weight: torch.Tensor, calibration: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(the activations' scale at run time or None, INT8 weights [out, in], per-channel scales):
    with ``calibration``, the input-channel scales ``s`` that activation-aware calibration chose
    (``calibration.awq_scales``), the weights quantized as ``W s`` and the activations divided
    by ``s`` at run time."""
    if calibration is None:
        q, scales = quantize_per_channel_int8(weight)
        return None, q, scales
    device = weight.device
    act_scales = calibration.float().cpu()
    q, scales = quantize_per_channel_int8(weight.float().cpu() * act_scales[None, :])
    return (1.0 / act_scales).to(device), q.to(device), scales.to(device)


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
        self.input_scale, q, scales = calibrated_int8(weight, calibration)
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
    """CUDA LLM.int8 (bitsandbytes): int8 weights, outlier features in fp16.

    The weight is quantized where it lies (on the device), as ``Int8Params`` quantizes on a move
    from the host: row-wise absmax INT8 of its fp16 values. The layer is built on the meta device,
    so ``Linear8bitLt`` allocates and initializes no fp32 weight of its own, and nothing of the
    model goes through host memory."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, threshold: float = 6.0):
        import bitsandbytes as bnb

        out_features, in_features = weight.shape
        layer = bnb.nn.Linear8bitLt(
            in_features,
            out_features,
            bias=bias is not None,
            has_fp16_weights=False,
            threshold=threshold,
            device="meta",
        )
        # int8 [out, in], scales [out] (fp32), on the weight's device
        fp16 = weight.to(torch.float16).contiguous()
        int8, scales, _ = bnb.functional.int8_vectorwise_quant(fp16)
        layer.weight = bnb.nn.Int8Params(
            int8, requires_grad=False, has_fp16_weights=False, CB=int8, SCB=scales
        )
        if bias is not None:
            layer.bias = torch.nn.Parameter(bias.to(torch.float16), requires_grad=False)
        self.layer = layer
        self.out_features = out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.to(torch.float16)).to(x.dtype)

    @property
    def weight_bytes(self) -> int:
        return int(self.layer.weight.numel())


_INT8_KERNEL_K = 16  # _weight_int8pack_mm's reduction step (AVX-512; 8 on AVX2)


def quantize_rows(x: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row integers of ``bits`` bits: (values in [-q, q] as float32, q = 2^(bits-1)
    - 1; scales [rows, 1]). A row's values and scale depend on that row alone."""
    q = float((1 << (bits - 1)) - 1)
    scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / q
    return torch.round(x / scale).clamp_(-q, q), scale


class W8A8Linear:
    """INT8 weights and INT8 activations whose dot products are exact: batch-invariant by
    construction, on every kernel the CPU or GPU may pick.

    Each activation row is quantized on its own (``quantize_rows``), so its integers and scale do
    not depend on the other rows. A product of two INT8 values is below 2^14 and a sum of up to
    ``max_k`` of them stays below 2^24, so in fp32 (or bf16 products with fp32 accumulation, as
    AVX512-BF16, AMX and tensor cores compute them) every partial sum is an exact integer:
    whatever order, blocking, ISA or thread split a GEMM uses, a row's dot products come out
    bitwise the same. Longer reductions run in pieces summed in a fixed order. The dot products
    are rounded to bf16 (the fast INT8 kernel's output) the same way on both paths, then scaled.
    (CUDA runs the GEMM in fp32: exact too, and cuBLAS cannot reduce partial sums in bf16.)

    Up to 4 rows ``_weight_int8pack_mm`` reads the INT8 weights directly (batch-1 decode); more
    rows run one float GEMM per piece on integer-valued weights (bf16 where the CPU has native
    bf16, else fp32: exact either way)."""

    _small_m = 4

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        calibration: torch.Tensor | None = None,
        act_bits: int = 8,
    ) -> None:
        self.act_bits = act_bits
        # the longest reduction whose partial sums stay exact integers in fp32 (< 2^24): 1040 for
        # 8-bit activations, 258 for 10-bit ones
        max_k = (1 << 24) // (((1 << (act_bits - 1)) - 1) * 127)
        # calibrated for weight-only error: a W8A8-aware objective agreed less with fp32 here
        self.input_scale, q, scales = calibrated_int8(weight, calibration)
        in_features = weight.shape[1]
        on_cpu = weight.device.type == "cpu"
        # the INT8 kernel takes bf16 activations (8-bit ones only) and reads the reduction 16 at a
        # time with no tail: pieces aligned to 16, or no INT8 kernel
        narrow = act_bits <= 8
        int8_kernel = on_cpu and narrow and in_features % _INT8_KERNEL_K == 0
        align = _INT8_KERNEL_K if int8_kernel else 1
        self.k_pieces = k_pieces(in_features, max_k, align)
        # integer-valued weights for the GEMM path, exact in fp32 and (8-bit activations) in
        # bf16 products with fp32 sums on CPUs; CUDA in fp32, since cuBLAS may reduce bf16
        # split-K partial sums in bf16
        native_bf16 = on_cpu and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        self.gemm_dtype = torch.bfloat16 if narrow and native_bf16 else torch.float32
        self.int8 = [q[:, a:b].contiguous() for a, b in self.k_pieces] if int8_kernel else None
        self.weight_t = [q[:, a:b].t().to(self.gemm_dtype).contiguous() for a, b in self.k_pieces]
        self.ones = torch.ones(weight.shape[0], dtype=torch.bfloat16, device=weight.device)
        self.scales = scales.float().to(weight.device)
        self.bias = bias
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_scale is not None:
            x = x * self.input_scale
        xq, row_scale = quantize_rows(x.float(), self.act_bits)
        y: torch.Tensor | None = None
        for i, (a, b) in enumerate(self.k_pieces):
            xp = xq[:, a:b]
            if self.int8 is not None and x.shape[0] <= self._small_m:
                dots = torch._weight_int8pack_mm(
                    xp.bfloat16().contiguous(), self.int8[i], self.ones
                )
            else:
                dots = xp.to(self.gemm_dtype) @ self.weight_t[i]
            if self.act_bits <= 8:  # as the INT8 kernel rounds them, on every path
                dots = dots.bfloat16()
            part = dots.float() * self.scales
            y = part if y is None else y + part
        assert y is not None
        y = (y * row_scale).to(x.dtype)
        return y if self.bias is None else y + self.bias

    @property
    def weight_bytes(self) -> int:
        """The bytes a batch-1 step reads (the INT8 weights; the GEMM copy serves larger steps)."""
        weights = self.int8 if self.int8 is not None else self.weight_t
        return sum(w.numel() * w.element_size() for w in weights) + self.scales.numel() * 4


def fixed_order_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    weights: WeightFormat,
    calibration: torch.Tensor | None = None,
) -> kernels.PackedLinear:
    """CPU weights (fp32, bf16 or INT8 with per-channel scales) for the fixed-order GEMM
    (``kernels/fixed_order.c``): fp32 activations, each output one FMA chain over the inputs in
    order, so a row's result is the same whatever rows share the call, on every x86 ISA. Faster
    than the library GEMMs at this model's sizes (measured in ``docs/engine.md``). The fused step
    (``kernels.Forward``) reads the same ``PackedLinear`` that runs a layer alone."""
    input_scale = scales = None
    if weights is WeightFormat.INT8:
        input_scale, q, scales = calibrated_int8(weight, calibration)
        weight_t = q.t()
    elif weights is WeightFormat.BF16 or weight.dtype == torch.bfloat16:
        weight_t = weight.t().to(torch.bfloat16)
    else:
        weight_t = weight.t().float()

    def fp32(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.float().contiguous()

    return kernels.PackedLinear(
        kernels.pack_weight(weight_t), weight.shape[0], fp32(input_scale), fp32(scales),
        fp32(bias),
    )  # fmt: skip


def _dense(weight: torch.Tensor, bias: torch.Tensor | None, weights: WeightFormat) -> DenseLinear:
    if weights is WeightFormat.BF16:
        return DenseLinear(weight.to(torch.bfloat16), None if bias is None else bias.bfloat16())
    return DenseLinear(weight, bias)


def _float(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.float()


# weight [out, in], bias, the entry's weight format, calibration, activation bits -> the linear
_Build = Callable[
    [torch.Tensor, torch.Tensor | None, WeightFormat, torch.Tensor | None, int], Linear
]
_BUILDS: dict[LinearKind, _Build] = {
    LinearKind.FIXED_ORDER: lambda w, b, f, c, _: fixed_order_linear(w, b, f, c),
    LinearKind.DENSE: lambda w, b, f, c, _: _dense(w, b, f),
    LinearKind.BF16: lambda w, b, f, c, _: Bf16Linear(w, _float(b)),
    LinearKind.INT8_WEIGHT_ONLY: lambda w, b, f, c, _: Int8WeightOnlyLinear(w, _float(b), c),
    LinearKind.LLM_INT8: lambda w, b, f, c, _: BnbInt8Linear(w, b),
    LinearKind.W8A8: lambda w, b, f, c, bits: W8A8Linear(w, _float(b), c, bits),
}


def make_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    precision: Precision,
    backend: Backend,
    calibration: torch.Tensor | None = None,
    act_bits: int = 8,
) -> Linear:
    """The linear layer ``precision`` multiplies with on ``backend`` (the entry's ``linears``:
    ``origin/precision.py``); ``calibration`` (the input-channel scales
    ``calibration.awq_scales`` chose) tunes CPU INT8; ``act_bits``: the activation integers'
    width in ``w8a8``."""
    kind = precision.linears.get(backend)
    if kind is None:
        raise ValueError(f"precision {precision.name} does not run on {backend.value}")
    if precision.weights.from_gguf_file:
        raise ValueError(
            f"{precision.name} weights are the GGUF file's blocks: see origin/engine/gguf_blocks.py"
        )
    return _BUILDS[kind](weight, bias, precision.weights, calibration, act_bits)
