"""The precisions of the engine's weights: one registry entry each, the only place that names them.

``none`` serves the weights as loaded (fp32 on a CPU, bf16 on CUDA); ``bf16``, ``int8``
(weight-only) and ``w8a8`` (INT8 weights and activations, batch-invariant by construction: see
``docs/engine.md``) convert them when the engine is built; ``gguf`` (CPU) serves a model
converted from a GGUF file from that file's own 4- and 8-bit blocks, bitwise the fp32 model's
results; ``gguf-a8`` (CPU) multiplies those blocks with activations quantized to 8 bits per block
of 32, the arithmetic of llama.cpp's CPU backend: on AVX-512 VNNI 2x gguf's throughput at full
batches (on AVX2 a little above gguf's; without AVX2 several times slower: plain C), still
batch-invariant, not the fp32 model's numbers; ``auto`` is a setting's way of letting the
builder decide for the device and model (``origin/runtime.py``, asking ``choose_auto``): an
engine itself always runs one of ``ENGINE_QUANTIZATIONS``.

Each entry (``Precision``) declares what an engine builds for it: the weight format, the linear
layer that multiplies on each kind of kernels (``Backend``) and so the devices it runs on, the
runner's forward path on the fixed-order kernels, how it is batch-invariant, the LM head's
precision, where its INT8 scales are calibrated, the dtype its weights load in on CUDA when not
told, and whether ``auto`` may choose it. The runner
(``origin/engine/runner.py``) and ``origin/engine/linear.py`` build from the entry, looked up
once when an engine is built (``lookup``); nothing else compares these names.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, get_args

Quantization = Literal["auto", "none", "bf16", "int8", "w8a8", "gguf", "gguf-a8"]
EngineQuantization = Literal["none", "bf16", "int8", "w8a8", "gguf", "gguf-a8"]
Device = Literal["cpu", "cuda"]
CudaDtype = Literal["bfloat16", "float16"]
AUTO: Final = (
    "auto"  # a setting's word (resolved by origin/runtime.py), never an engine's precision
)


class WeightFormat(enum.Enum):
    """How a precision's weights are held."""

    AS_LOADED = "the model's own dtype (fp32 on a CPU, bf16 on CUDA)"
    BF16 = "bf16"
    INT8 = "INT8 per output channel, with activation-aware input scales where calibrated"
    GGUF_BLOCKS = "the GGUF file's own Q4_1/Q8_0 blocks (origin/engine/gguf_blocks.py)"
    GGUF_BLOCKS_A8 = "the GGUF file's blocks, laid out for 8-bit activations"

    @property
    def from_gguf_file(self) -> bool:
        """Read from the GGUF file the model was converted from, not from the model's tensors."""
        return self in (WeightFormat.GGUF_BLOCKS, WeightFormat.GGUF_BLOCKS_A8)


class Backend(enum.Enum):
    """The kernels a step runs on, in the order a runner prefers them on a device."""

    FIXED_ORDER = "the CPU's fixed-order C kernels (origin/engine/kernels/)"
    CPU_LIBRARY = "the CPU's library kernels (ATen, oneDNN, MKL)"
    CUDA_LIBRARY = "CUDA's library kernels (ATen, cuBLAS)"

    @property
    def device(self) -> Device:
        return "cuda" if self is Backend.CUDA_LIBRARY else "cpu"


class LinearKind(enum.Enum):
    """The class that multiplies (``origin/engine/linear.py``, ``make_linear``)."""

    FIXED_ORDER = "kernels.PackedLinear: the fixed-order GEMM"
    DENSE = "DenseLinear: the library GEMM in the weights' dtype"
    BF16 = "Bf16Linear: bf16 GEMM inputs, fp32 accumulation and around"
    INT8_WEIGHT_ONLY = "Int8WeightOnlyLinear: _weight_int8pack_mm, a bf16 GEMM above 4 rows"
    LLM_INT8 = "BnbInt8Linear: bitsandbytes LLM.int8 (outlier features in fp16)"
    W8A8 = "W8A8Linear: INT8 activations per row, exact integer dot products"


class ForwardPath(enum.Enum):
    """How ``LlamaRunner`` runs a step."""

    FUSED = "the whole step in one fixed-order C call (kernels.Forward)"
    FIXED_ORDER_OPS = "op by op: the linears, with fixed-order norms, SiLU and attention"
    LIBRARY_OPS = "op by op on the library's norms, SiLU and attention"


class Invariance(enum.Enum):
    """Where a precision's rows do not depend on the rest of the step (``docs/engine.md``)."""

    FIXED_ORDER = "on the fixed-order kernels"
    ARITHMETIC = "on every backend: exact integer dot products"


class Needs(enum.Enum):
    """What ``auto`` needs before it chooses a precision (checked by ``origin/runtime.py``)."""

    GGUF_BLOCKS = (
        "a Llama-family model converted from a GGUF file whose matrices are Q4_1 or Q8_0, and "
        "the fixed-order kernels that read them"
    )
    NATIVE_BF16 = "a CPU with native bf16 dot products (AVX512-BF16, AMX)"
    FAST_A8 = (
        "the kernels' integer dot products for 8-bit activations in SIMD (AVX-512 VNNI or "
        "AVX2), not plain C"
    )


@dataclass(frozen=True)
class Auto:
    """``auto`` chooses, of the precisions it may choose on the device (``on``) whose needs
    hold, the one with the lowest ``preference``."""

    preference: int
    on: tuple[Device, ...]
    needs: frozenset[Needs] = frozenset()


@dataclass(frozen=True, eq=False)  # one entry per precision: equal when the same entry
class Precision:
    """One precision, as an engine builds it."""

    name: EngineQuantization
    weights: WeightFormat
    devices: tuple[Device, ...]
    # the class that multiplies on each backend it runs on (their devices are ``devices``)
    linears: Mapping[Backend, LinearKind]
    # the runner's path on the fixed-order kernels; on the library's every step runs op by op
    forward: ForwardPath
    invariance: Invariance
    head: EngineQuantization  # the LM head's precision (the GGUF entries: the file's own head)
    calibrated_on: tuple[Device, ...] = ()  # where INT8 scales are calibrated on prompts at load
    # the dtype its weights are loaded in on CUDA when EDGEQA_DTYPE is auto: what its linears
    # take there, so the weights land on the device as served (``origin.runtime.load_dtype``)
    cuda_dtype: CudaDtype = "bfloat16"
    auto: Auto | None = None  # None: ``auto`` never chooses it

    def backend(self, device: str, batch_invariant: bool) -> Backend:
        """The kernels a runner on ``device`` prefers: the fixed-order ones when batch
        invariance is asked for or this precision has no others there, else the library's.
        ``ValueError`` when it does not run on ``device``."""
        kind = device_type(device)
        here = sorted((b for b in self.linears if b.device == kind), key=list(Backend).index)
        if not here:
            raise ValueError(
                f"precision {self.name} runs on {', '.join(d.upper() for d in self.devices)}, "
                f"not on {kind.upper()}"
            )
        if not batch_invariant:
            here = [b for b in here if b is not Backend.FIXED_ORDER] or here
        return here[0]

    def fallback(self, backend: Backend) -> Backend | None:
        """The library backend on ``backend``'s device, if this precision has one: where the
        fixed-order kernels cannot be loaded."""
        return next(
            (b for b in self.linears if b.device == backend.device and b is not backend), None
        )

    def forward_path(self, backend: Backend) -> ForwardPath:
        return self.forward if backend is Backend.FIXED_ORDER else ForwardPath.LIBRARY_OPS

    def invariant_on(self, backend: Backend) -> bool:
        return self.invariance is Invariance.ARITHMETIC or backend is Backend.FIXED_ORDER


_FIXED, _CPU, _CUDA = Backend.FIXED_ORDER, Backend.CPU_LIBRARY, Backend.CUDA_LIBRARY

REGISTRY: tuple[Precision, ...] = (
    Precision(
        "none",
        WeightFormat.AS_LOADED,
        ("cpu", "cuda"),
        {_FIXED: LinearKind.FIXED_ORDER, _CPU: LinearKind.DENSE, _CUDA: LinearKind.DENSE},
        ForwardPath.FUSED,
        Invariance.FIXED_ORDER,
        head="none",
        auto=Auto(3, ("cpu", "cuda")),
    ),
    Precision(
        "bf16",
        WeightFormat.BF16,
        ("cpu", "cuda"),
        # CUDA: the dense GEMM on bf16 weights
        {_FIXED: LinearKind.FIXED_ORDER, _CPU: LinearKind.BF16, _CUDA: LinearKind.DENSE},
        ForwardPath.FUSED,
        Invariance.FIXED_ORDER,
        head="bf16",
        # 2x the fp32 throughput at 0.99 greedy agreement where the CPU multiplies bf16 natively
        auto=Auto(2, ("cpu",), frozenset({Needs.NATIVE_BF16})),
    ),
    Precision(
        "int8",
        WeightFormat.INT8,
        ("cpu", "cuda"),
        {
            _FIXED: LinearKind.FIXED_ORDER,
            _CPU: LinearKind.INT8_WEIGHT_ONLY,
            _CUDA: LinearKind.LLM_INT8,
        },
        ForwardPath.FUSED,
        Invariance.FIXED_ORDER,
        # an INT8 head cost greedy agreement at the logits (0.965 against 0.980), bf16 does not
        head="bf16",
        calibrated_on=("cpu",),  # bitsandbytes quantizes on its own
        cuda_dtype="float16",  # LLM.int8 multiplies fp16 (its outlier columns too)
    ),
    Precision(
        "w8a8",
        WeightFormat.INT8,
        ("cpu", "cuda"),
        {_FIXED: LinearKind.W8A8, _CPU: LinearKind.W8A8, _CUDA: LinearKind.W8A8},
        # its GEMMs are the library's, invariant by their arithmetic
        ForwardPath.FIXED_ORDER_OPS,
        Invariance.ARITHMETIC,
        head="w8a8",  # every GEMM of a step must be invariant (the head: 10-bit activations)
        calibrated_on=("cpu", "cuda"),
    ),
    Precision(
        "gguf",
        WeightFormat.GGUF_BLOCKS,
        ("cpu",),
        {_FIXED: LinearKind.FIXED_ORDER},  # the fixed-order kernels alone read the blocks
        ForwardPath.FUSED,
        Invariance.FIXED_ORDER,
        head="gguf",
        # the fp32 model's answers; auto's choice where 8-bit activations would run in plain C
        auto=Auto(1, ("cpu",), frozenset({Needs.GGUF_BLOCKS})),
    ),
    Precision(
        "gguf-a8",
        WeightFormat.GGUF_BLOCKS_A8,
        ("cpu",),
        {_FIXED: LinearKind.FIXED_ORDER},
        ForwardPath.FUSED,
        Invariance.FIXED_ORDER,
        head="gguf-a8",
        # the origin's tail under load: 2-2.5x gguf's batched step on AVX-512 VNNI, ahead on
        # AVX2 too; greedy agreement with fp32 0.97 (docs/origin.md, "The default precision")
        auto=Auto(0, ("cpu",), frozenset({Needs.GGUF_BLOCKS, Needs.FAST_A8})),
    ),
)

_BY_NAME: dict[str, Precision] = {precision.name: precision for precision in REGISTRY}
ENGINE_QUANTIZATIONS: tuple[str, ...] = tuple(_BY_NAME)
QUANTIZATIONS: tuple[str, ...] = (AUTO, *ENGINE_QUANTIZATIONS)
assert ENGINE_QUANTIZATIONS == get_args(EngineQuantization), "the Literal and the registry differ"
assert QUANTIZATIONS == get_args(Quantization), "the Literal and the registry differ"


def lookup(name: str, setting: str = "quantization") -> Precision:
    """The registry's entry for ``name``; ``ValueError`` naming ``setting`` when there is none."""
    precision = _BY_NAME.get(name)
    if precision is not None:
        return precision
    if name == AUTO:
        raise ValueError(
            f"{setting} {AUTO!r} is resolved when an engine is built (origin/runtime.py); an "
            f"engine runs one of {', '.join(ENGINE_QUANTIZATIONS)}"
        )
    raise ValueError(f"{setting} must be one of {', '.join(ENGINE_QUANTIZATIONS)}, got {name!r}")


def device_type(device: str) -> Device:
    """``"cpu"`` or ``"cuda"`` for a device's name (``"cuda:1"``, a ``torch.device``'s str)."""
    kind = str(device).split(":", 1)[0]
    if kind not in get_args(Device):
        raise ValueError(f"device must be one of {', '.join(get_args(Device))}, got {device!r}")
    return kind  # type: ignore[return-value]


def invariant_precisions(backend: Backend) -> tuple[Precision, ...]:
    """The precisions that run on ``backend`` and are batch-invariant there."""
    return tuple(p for p in REGISTRY if backend in p.linears and p.invariant_on(backend))


def choose_auto(device: str, met: Callable[[Needs], bool]) -> Precision:
    """``auto``'s precision on ``device``: of those it may choose that run there, the most
    preferred whose needs all hold (``met``)."""
    kind = device_type(device)
    choices = [(p.auto, p) for p in REGISTRY if p.auto is not None and kind in p.auto.on]
    for auto, precision in sorted(choices, key=lambda choice: choice[0].preference):
        if all(met(need) for need in auto.needs):
            return precision
    raise ValueError(f"auto has no precision to choose on {kind}: none of their needs hold")
