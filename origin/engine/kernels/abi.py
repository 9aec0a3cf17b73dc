"""The fixed-order kernels' binding: the constants of their header, each C entry point as a
function on tensors, and the instruction-set level they run at.

Everything here derives from ``fixed_order.h``: the calls go through the extension cffi generated
from it (``build.py``), and the constants are its enums, read from the header itself, so packing a
weight needs no compiled library. The level is the CPU's highest unless ``EDGEQA_KERNEL_ISA``
names a lower one (read when the library loads); every level computes the same bits.
"""

from __future__ import annotations

import logging
import re
from functools import cache
from typing import Any

import torch

from base.config import SharedSettings
from origin.engine.kernels.build import HEADER
from origin.engine.kernels.library import KernelUnavailableError, load

logger = logging.getLogger(__name__)


def _header_constants() -> dict[str, int]:
    """Every enumerator of ``fixed_order.h`` (its enums' values are integer literals)."""
    constants: dict[str, int] = {}
    for body in re.findall(r"enum\s+\w+\s*\{([^}]*)\}", HEADER.read_text()):
        for name, value in re.findall(r"(\w+)\s*=\s*(-?\d+)", body):
            constants[name] = int(value)
    return constants


_H = _header_constants()
PANEL, QK = _H["FO_PANEL"], _H["FO_QK"]  # output columns per weight panel; rows per GGUF block
# weight kinds: dense panels, GGUF blocks, and the blocks laid out for 8-bit activations
# (``packing.with_8bit_activations``; Q8_0_A16: activations to ~16 bits, the LM head)
Q4_1, Q8_0, Q4_1_A8, Q8_0_A8, Q8_0_A16 = (
    _H[f"FO_{name}"] for name in ("Q4_1", "Q8_0", "Q4_1_A8", "Q8_0_A8", "Q8_0_A16")
)
DENSE_KINDS = {torch.float32: _H["FO_F32"], torch.bfloat16: _H["FO_BF16"], torch.int8: _H["FO_I8"]}
BLOCK_BYTES = {kind: _H["FO_Q4_1_BYTES"] for kind in (Q4_1, Q4_1_A8)}
BLOCK_BYTES |= {kind: _H["FO_Q8_0_BYTES"] for kind in (Q8_0, Q8_0_A8, Q8_0_A16)}
# the instruction-set levels by number (fo_isa), each with those below it
ISAS = tuple(
    name.removeprefix("FO_ISA_").lower()
    for name in sorted((n for n in _H if n.startswith("FO_ISA_")), key=_H.__getitem__)
)
_PATH_BITS = {name: _H[f"FO_PATH_{name.upper()}"] for name in ISAS}
A8_PATHS = ("c", "avx2", "vnni")  # fo_a8_path
REFUSED, NO_MEMORY = _H["FO_REFUSED"], _H["FO_NO_MEMORY"]
WHAT_IS_LOST = (
    "Without the fixed-order kernels the engine runs on the library kernels (oneDNN, MKL): no "
    "batch invariance (a greedy answer may change with the load, prompt chunking or the CPU), no "
    "GGUF-block weights (gguf, gguf-a8: auto serves the device's default weights instead, more "
    "memory and a slower decode) and no fused step"
)


@cache
def binding() -> tuple[Any, Any, int]:
    """(ffi, lib, the level set at load): the library loaded, at ``EDGEQA_KERNEL_ISA``'s level."""
    module = load()
    lib = module.lib
    wanted = SharedSettings.from_env().kernel_isa
    level = lib.fo_set_isa(-1 if wanted == "auto" else ISAS.index(wanted))
    if wanted != "auto" and ISAS[level] != wanted:
        logger.warning(
            "EDGEQA_KERNEL_ISA=%s: this CPU runs the fixed-order kernels at most at %s; using it",
            wanted,
            ISAS[level],
        )
    return module.ffi, lib, level


def library() -> Any:
    """The kernels' C functions (cffi's ``lib``), loaded once per process at the configured
    level; ``KernelUnavailableError`` where they cannot be (``library.py`` says why)."""
    return binding()[1]


@cache
def unavailable_reason() -> str | None:
    """Why the kernels cannot be loaded, or None once they are: callers that can run without
    them (``runner.py``, ``auto`` weights) do. The first call logs what running without costs."""
    try:
        binding()
    except KernelUnavailableError as error:
        logger.warning("%s. %s.", error, WHAT_IS_LOST)
        return str(error)
    return None


def supported_isa() -> str:
    """The highest level this build of the kernels runs on this CPU."""
    return ISAS[library().fo_isa_supported()]


def isa() -> str:
    """The level the kernels run at now."""
    return ISAS[library().fo_isa()]


def set_isa(name: str | None) -> str:
    """Run the kernels at level ``name`` (None: the level chosen at load); tests use it to show
    every level computes the same bits. ``ValueError`` for a level this CPU does not run."""
    _, lib, default = binding()
    if name is not None and name not in ISAS:
        raise ValueError(f"kernel ISA {name!r} is not one of {', '.join(ISAS)}")
    wanted = default if name is None else ISAS.index(name)
    level = lib.fo_set_isa(wanted)
    if level != wanted:
        lib.fo_set_isa(default)
        raise ValueError(f"this CPU runs the fixed-order kernels at most at {ISAS[level]}")
    return ISAS[level]


def set_simd(on: bool | None) -> int:
    """The scalar path (False), AVX2 (True) or the level chosen at load (None), capped at what
    the CPU runs. Returns the level in use (an index of ``ISAS``: 0 scalar, 1 AVX2, ...)."""
    _, lib, default = binding()
    return int(lib.fo_set_isa(default if on is None else ISAS.index("avx2") if on else 0))


def paths_taken() -> frozenset[str]:
    """The levels whose kernel variants ran since the last call: which code a call took (a
    level's own variants exist where it pays: AVX-512 for one-row GGUF GEMMs and 8-bit
    activations' quantization, VNNI for their integer dot products)."""
    bits = library().fo_take_paths()
    return frozenset(name for name, bit in _PATH_BITS.items() if bits & bit)


def a8_path() -> str:
    """Where the 8-bit activation kernels' integer dot products (``gguf-a8``) run at the level in
    use: ``vnni`` (AVX-512 VNNI), ``avx2`` (VPMADDUBSW on 4-bit halves) or ``c`` (plain C, an
    order of magnitude slower). The same numbers on each."""
    return A8_PATHS[library().fo_a8_path()]


def openmp() -> bool:
    """Whether the kernels were built with OpenMP (else every call runs on the calling thread)."""
    return bool(library().fo_openmp())


def weight_kind(packed: torch.Tensor, kind: int | None = None) -> tuple[int, int]:
    """(kind, reduction length K) of a packed weight: its dtype's, or a GGUF block kind's."""
    if kind is None:
        if packed.dtype not in DENSE_KINDS:
            raise TypeError(f"a {packed.dtype} packed weight needs its GGUF block kind")
        return DENSE_KINDS[packed.dtype], packed.shape[1]
    if kind not in BLOCK_BYTES or packed.dtype != torch.uint8:
        raise TypeError(f"GGUF block kind {kind} is packed as uint8 blocks")
    if packed.shape[2] != BLOCK_BYTES[kind]:
        raise ValueError(f"blocks of {packed.shape[2]} bytes are not kind {kind}'s")
    return kind, packed.shape[1] * QK


def pointer(ffi: Any, ctype: str, t: torch.Tensor | None) -> Any:
    """``t``'s data as a C pointer of ``ctype`` (NULL for None); the caller keeps ``t`` alive."""
    return ffi.NULL if t is None else ffi.cast(ctype, t.data_ptr())


def gemm(
    x: torch.Tensor, packed: torch.Tensor, out_features: int, kind: int | None = None
) -> torch.Tensor:
    """x [M, in] float32 @ the packed weight -> [M, out_features] float32, in the fixed order;
    ``kind``: Q4_1 or Q8_0 for GGUF blocks (``pack_q4_1``, ``pack_q8_0``), Q4_1_A8, Q8_0_A8 or
    Q8_0_A16 for them with quantized activations (``with_8bit_activations``)."""
    ffi, lib, _ = binding()
    x = x.float().contiguous()
    m, k = x.shape
    code_kind, packed_k = weight_kind(packed, kind)
    panels = packed.shape[0]
    y = torch.empty(m, panels * PANEL, dtype=torch.float32)
    code = REFUSED
    if packed_k == k:
        code = lib.fo_gemm(
            pointer(ffi, "float *", x), k, pointer(ffi, "void *", packed), code_kind,
            pointer(ffi, "float *", y), y.shape[1], m, k, y.shape[1],
        )  # fmt: skip
    if code == NO_MEMORY:
        raise MemoryError("fo_gemm could not allocate its scratch buffers")
    if code:
        raise ValueError(f"fo_gemm refused shapes x {tuple(x.shape)}, w {tuple(packed.shape)}")
    return y if y.shape[1] == out_features else y[:, :out_features]


def attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [T, heads, d] fp32; caches [slots, kv_heads, max_len, d] fp32 contiguous; query t
    attends keys [0, lengths[t]) of slot slots[t]. Returns [T, heads, d]."""
    ffi, lib, _ = binding()
    q = q.float().contiguous()
    t, h, d = q.shape
    out = torch.empty_like(q)
    slots = slots.to(torch.int64).contiguous()
    lengths = lengths.to(torch.int64).contiguous()
    f32, i64 = "float *", "int64_t *"
    code = lib.fo_attention(
        pointer(ffi, f32, q), pointer(ffi, f32, k_cache), pointer(ffi, f32, v_cache),
        k_cache.shape[2], pointer(ffi, i64, slots), pointer(ffi, i64, lengths), t, h,
        k_cache.shape[1], d, scale, pointer(ffi, f32, out),
    )  # fmt: skip
    if code == NO_MEMORY:
        raise MemoryError("fo_attention could not allocate its scratch buffers")
    if code:
        raise ValueError(f"fo_attention refused q {tuple(q.shape)}, cache {tuple(k_cache.shape)}")
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [M, D] fp32 normalised by each row's root mean square, times weight [D] (fp32)."""
    ffi, lib, _ = binding()
    x = x.float().contiguous()
    weight = weight.float().contiguous()
    m, d = x.shape
    if weight.shape != (d,):
        raise ValueError(f"rms_norm weight {tuple(weight.shape)} for rows of {d}")
    y = torch.empty_like(x)
    f32 = "float *"
    lib.fo_rms_norm(
        pointer(ffi, f32, x), pointer(ffi, f32, weight), pointer(ffi, f32, y), m, d, eps
    )
    return y


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[M, 2N] fp32 (gate columns, then up columns) -> silu(gate) * up, [M, N]."""
    ffi, lib, _ = binding()
    gate_up = gate_up.float().contiguous()
    m, n2 = gate_up.shape
    if n2 % 2:
        raise ValueError(f"silu_mul needs an even width, not {n2}")
    y = torch.empty(m, n2 // 2, dtype=torch.float32)
    lib.fo_silu_mul(pointer(ffi, "float *", gate_up), pointer(ffi, "float *", y), m, n2 // 2)
    return y
