"""Fixed-order CPU kernels (``fixed_order.c``): the engine's batch-invariant GEMM, attention,
RMSNorm and SiLU, and ``Forward``: a Llama step composed of them in one call.

Library GEMMs choose their blocking, thread split and even instruction set by the row count, so a
row's result depends on its neighbours (measurements in ``docs/engine.md``). These kernels sum in
one written-down order instead, the same for every row count, chunking, thread count and ISA.

- ``fixed_order.h``: the ABI (types, constants, prototypes), the one definition both sides
  derive from; ``fixed_order.c``: the kernels.
- ``build.py``: the build at install (``setup.py``): the cffi extension ``_fixed_order``.
- ``library.py``: where the built library is, and why it may be loaded (owner, mode, sources).
- ``abi.py``: the binding: the header's constants, each C call on tensors, the ISA level.
- ``packing.py``: weights in the kernels' layouts (dense panels, GGUF blocks, 8-bit forms).
- ``arena.py``: weights side by side on transparent huge pages.
- ``forward.py``: ``PackedLinear``, ``LayerWeights`` and ``Forward``: a whole step in one call.

Where the kernels were not built (no C compiler at install) or may not be loaded,
``unavailable_reason()`` says why and what is lost, and the engine runs on the library kernels
(``runner.py``); nothing is compiled at run time.
"""

from __future__ import annotations

from origin.engine.kernels.abi import (
    A8_PATHS,
    ISAS,
    PANEL,
    Q4_1,
    Q4_1_A8,
    Q8_0,
    Q8_0_A8,
    Q8_0_A16,
    QK,
    a8_path,
    attention,
    gemm,
    isa,
    library,
    openmp,
    paths_taken,
    rms_norm,
    set_isa,
    set_simd,
    silu_mul,
    supported_isa,
    unavailable_reason,
    weight_kind,
)
from origin.engine.kernels.arena import huge_page_copies
from origin.engine.kernels.forward import Forward, LayerWeights, PackedLinear
from origin.engine.kernels.library import (
    KernelBuildError,
    KernelCacheError,
    KernelTrustError,
    KernelUnavailableError,
    library_path,
)
from origin.engine.kernels.packing import pack_q4_1, pack_q8_0, pack_weight, with_8bit_activations

__all__ = [
    "A8_PATHS",
    "ISAS",
    "PANEL",
    "Q4_1",
    "Q4_1_A8",
    "Q8_0",
    "Q8_0_A8",
    "Q8_0_A16",
    "QK",
    "Forward",
    "KernelBuildError",
    "KernelCacheError",
    "KernelTrustError",
    "KernelUnavailableError",
    "LayerWeights",
    "PackedLinear",
    "a8_path",
    "attention",
    "gemm",
    "huge_page_copies",
    "isa",
    "library",
    "library_path",
    "openmp",
    "pack_q4_1",
    "pack_q8_0",
    "pack_weight",
    "paths_taken",
    "rms_norm",
    "set_isa",
    "set_simd",
    "silu_mul",
    "supported_isa",
    "unavailable_reason",
    "weight_kind",
    "with_8bit_activations",
]
