"""Fixed-order CPU kernels (``fixed_order.c``): the engine's batch-invariant GEMM, attention,
RMSNorm and SiLU.

Library GEMMs choose their blocking, thread split and even instruction set by the row count, so a
row's result depends on its neighbours (measurements in ``docs/engine.md``). These kernels sum in
one written-down order instead, the same for every row count, chunking, thread count and ISA.

The C source is compiled on first use with the system's C compiler (``$CC``, else ``cc``) into
``~/.cache/edgeqa/kernels/`` (named by the source's hash; written under a temporary name and
renamed, so concurrent processes are safe) and loaded with ctypes; the calls release the GIL.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from edge_index.config import DEFAULT_CACHE_DIR
from edge_index.errors import EdgeQAError

PANEL = 16  # output columns per packed weight panel (fixed_order.c)
_SOURCE = Path(__file__).with_name("fixed_order.c")
_FLAGS = ["-O2", "-shared", "-fPIC", "-fopenmp", "-std=c11"]
_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}
_P = ctypes.c_void_p
_I = ctypes.c_int64


class KernelBuildError(EdgeQAError, RuntimeError):
    """The fixed-order kernels could not be compiled (no C compiler, or it failed)."""


def _build(target: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise KernelBuildError(
            "batch-invariant kernels need a C compiler (cc or $CC; apt-get install gcc), "
            "or set EDGEQA_BATCH_INVARIANT=false"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so")
    os.close(fd)
    try:
        cmd = [compiler, *_FLAGS, str(_SOURCE), "-o", tmp, "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise KernelBuildError(f"compiling {_SOURCE.name} failed: {done.stderr.strip()}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@cache
def library() -> ctypes.CDLL:
    """The compiled kernels (built on the first call in a fresh cache)."""
    digest = hashlib.sha256(_SOURCE.read_bytes() + " ".join(_FLAGS).encode()).hexdigest()[:16]
    name = f"fixed_order-{digest}.so"
    target = DEFAULT_CACHE_DIR / "kernels" / name
    try:
        if not target.exists():
            _build(target)
    except PermissionError:
        target = Path(tempfile.gettempdir()) / "edgeqa-kernels" / name
        if not target.exists():
            _build(target)
    lib = ctypes.CDLL(str(target))
    lib.fo_gemm.argtypes = [_P, _I, _P, ctypes.c_int, _P, _I, _I, _I, _I]
    lib.fo_gemm.restype = ctypes.c_int
    lib.fo_attention.argtypes = [_P, _P, _P, _I, _P, _P, _I, _I, _I, _I, ctypes.c_float, _P]
    lib.fo_attention.restype = ctypes.c_int
    lib.fo_rms_norm.argtypes = [_P, _P, _P, _I, _I, ctypes.c_float]
    lib.fo_rms_norm.restype = ctypes.c_int
    lib.fo_silu_mul.argtypes = [_P, _P, _I, _I]
    lib.fo_silu_mul.restype = ctypes.c_int
    lib.fo_set_simd.argtypes = [ctypes.c_int]
    lib.fo_set_simd.restype = ctypes.c_int
    return lib


def set_simd(on: bool | None) -> bool:
    """Force the scalar path (False), the AVX2 one (True) or the CPU's best (None): tests use it
    to show both give the same bits. Returns whether SIMD is in use."""
    return bool(library().fo_set_simd(-1 if on is None else int(on)))


def pack_weight(weight_t: torch.Tensor) -> torch.Tensor:
    """[in, out] (fp32, bf16 or int8) -> panels [out / PANEL, in, PANEL], ``out`` zero-padded to a
    multiple of PANEL."""
    if weight_t.dtype not in _KINDS:
        raise TypeError(f"fixed-order GEMM weights are fp32, bf16 or int8, not {weight_t.dtype}")
    k, n = weight_t.shape
    pad = -n % PANEL
    if pad:
        weight_t = torch.cat([weight_t, weight_t.new_zeros(k, pad)], dim=1)
    return weight_t.reshape(k, -1, PANEL).transpose(0, 1).contiguous()


def gemm(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """x [M, in] float32 @ the packed weight -> [M, out_features] float32, in the fixed order."""
    x = x.float().contiguous()
    m, k = x.shape
    panels = packed.shape[0]
    y = torch.empty(m, panels * PANEL, dtype=torch.float32)
    code = library().fo_gemm(
        x.data_ptr(), k, packed.data_ptr(), _KINDS[packed.dtype], y.data_ptr(), y.shape[1], m, k,
        y.shape[1],
    )  # fmt: skip
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
    q = q.float().contiguous()
    t, h, d = q.shape
    out = torch.empty_like(q)
    slots = slots.to(torch.int64).contiguous()
    lengths = lengths.to(torch.int64).contiguous()
    code = library().fo_attention(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[2],
        slots.data_ptr(), lengths.data_ptr(), t, h, k_cache.shape[1], d, scale, out.data_ptr(),
    )  # fmt: skip
    if code:
        raise ValueError(f"fo_attention refused q {tuple(q.shape)}, cache {tuple(k_cache.shape)}")
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [M, D] fp32 normalised by each row's root mean square, times weight [D] (fp32)."""
    x = x.float().contiguous()
    weight = weight.float().contiguous()
    m, d = x.shape
    if weight.shape != (d,):
        raise ValueError(f"rms_norm weight {tuple(weight.shape)} for rows of {d}")
    y = torch.empty_like(x)
    library().fo_rms_norm(x.data_ptr(), weight.data_ptr(), y.data_ptr(), m, d, eps)
    return y


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[M, 2N] fp32 (gate columns, then up columns) -> silu(gate) * up, [M, N]."""
    gate_up = gate_up.float().contiguous()
    m, n2 = gate_up.shape
    if n2 % 2:
        raise ValueError(f"silu_mul needs an even width, not {n2}")
    y = torch.empty(m, n2 // 2, dtype=torch.float32)
    library().fo_silu_mul(gate_up.data_ptr(), y.data_ptr(), m, n2 // 2)
    return y
