"""Fixed-order CPU kernels (``fixed_order.c``): the engine's batch-invariant GEMM, attention,
RMSNorm and SiLU, and ``Forward``: a Llama step composed of them in one call.

Library GEMMs choose their blocking, thread split and even instruction set by the row count, so a
row's result depends on its neighbours (measurements in ``docs/engine.md``). These kernels sum in
one written-down order instead, the same for every row count, chunking, thread count and ISA.

The C source is compiled on first use with the system's C compiler (``$CC``, else ``cc``) into
``<EDGEQA_CACHE_DIR>/kernels/`` (by default ``~/.cache/edgeqa/kernels/``; named by the source's
hash; written under a temporary name and renamed, so concurrent processes are safe) and loaded
with ctypes; the calls release the GIL.

Whoever can write that folder or the library in it can run code as this process, so both must be
this user's alone (owned by it, writable by neither group nor others): the folder is created
0700, and a library that is not private is never loaded but built again over; a folder that is
not private is made so (when this user owns it) and its library built again. There is no shared
fallback (no temporary directory): where no private folder can be had, ``library()`` raises
``KernelCacheError`` and the engine runs on the library kernels instead (``runner.py``).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import mmap
import os
import shutil
import stat
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from base.config import SharedSettings
from base.errors import EdgeQAError

PANEL = 16  # output columns per packed weight panel (fixed_order.c)
# GGUF block kinds (fixed_order.c): QK reduction rows per block, bytes per (panel, block); the
# _A8 kinds are the same blocks laid out for 8-bit activations (``with_8bit_activations``)
# (Q8_0_A16: the same as Q8_0_A8 with activations to ~16 bits in two 8-bit passes: the LM head)
Q4_1, Q8_0, Q4_1_A8, Q8_0_A8, Q8_0_A16, QK = 3, 4, 5, 6, 7, 32
_BLOCK_BYTES = {Q4_1: 4 * PANEL + QK * PANEL // 2, Q8_0: 2 * PANEL + QK * PANEL}
_BLOCK_BYTES |= {Q4_1_A8: _BLOCK_BYTES[Q4_1], Q8_0_A8: _BLOCK_BYTES[Q8_0]}
_BLOCK_BYTES[Q8_0_A16] = _BLOCK_BYTES[Q8_0]
_SOURCE = Path(__file__).with_name("fixed_order.c")
_FLAGS = ["-O2", "-shared", "-fPIC", "-fopenmp", "-std=c11", "-ffp-contract=off"]
_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}
_P = ctypes.c_void_p
_I = ctypes.c_int64
_PRIVATE = 0o700  # the kernel folder's mode, and the library's

logger = logging.getLogger(__name__)


class KernelBuildError(EdgeQAError, RuntimeError):
    """The fixed-order kernels could not be compiled (no C compiler, or it failed)."""


class KernelCacheError(KernelBuildError):
    """No folder of this user's alone to build the kernels in and load them from: a library
    there could be someone else's code."""


def _build(target: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise KernelBuildError(
            "batch-invariant kernels need a C compiler (cc or $CC; apt-get install gcc), "
            "or set EDGEQA_BATCH_INVARIANT=false"
        )
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so")
    except OSError as error:
        raise KernelCacheError(
            f"cannot write the batch-invariant kernels into {target.parent} "
            f"({error.strerror or error}): set EDGEQA_CACHE_DIR to a folder this user can write"
        ) from None
    os.close(fd)
    try:
        cmd = [compiler, *_FLAGS, str(_SOURCE), "-o", tmp, "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise KernelBuildError(f"compiling {_SOURCE.name} failed: {done.stderr.strip()}")
        os.chmod(tmp, _PRIVATE)  # the linker's mode follows the umask (0775 under umask 002)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _not_private(status: os.stat_result) -> str | None:
    """Why a file or folder with this status could hold another user's code, or None."""
    if status.st_uid != os.getuid():
        return f"it belongs to uid {status.st_uid}, not to this user (uid {os.getuid()})"
    if status.st_mode & 0o022:
        return f"group or others may write it (mode {stat.S_IMODE(status.st_mode):o})"
    return None


def _open_folder(directory: Path) -> tuple[int, bool]:
    """``directory`` (created 0700 when missing) open, and whether the libraries already in it
    may be loaded: False when group or others could write it until now (it is made 0700 here).
    ``KernelCacheError`` when it cannot be created or belongs to another user."""
    try:
        directory.mkdir(mode=_PRIVATE, parents=True, exist_ok=True)
        folder = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise KernelCacheError(
            f"no private folder for the batch-invariant kernels at {directory} "
            f"({error.strerror or error}): set EDGEQA_CACHE_DIR to a folder this user can write"
        ) from None
    status = os.fstat(folder)
    why = _not_private(status)
    if why and status.st_uid != os.getuid():
        os.close(folder)
        raise KernelCacheError(
            f"the batch-invariant kernels' folder {directory} is not this user's alone ({why}): "
            "set EDGEQA_CACHE_DIR to a folder only this user can write"
        )
    if why:
        logger.warning(
            "not loading the kernels already in %s: %s; made it private (mode 700), building "
            "them again",
            directory,
            why,
        )
        os.fchmod(folder, _PRIVATE)
    return folder, why is None


def _open_library(folder: int, path: Path) -> int | None:
    """The library ``path`` (in the open ``folder``) open, if it is a regular file of this user's
    alone; None when it is missing or refused (with a warning naming it and why)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path.name, flags, dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError as error:  # ELOOP: a symbolic link
        logger.warning("not loading %s: %s; building it again", path, error.strerror or error)
        return None
    status = os.fstat(fd)
    why = "not a regular file" if not stat.S_ISREG(status.st_mode) else _not_private(status)
    if why:
        os.close(fd)
        logger.warning("not loading %s: %s; building it again", path, why)
        return None
    return fd


def _load_private(target: Path) -> ctypes.CDLL:
    """``target`` loaded once it is checked to be this user's alone, in a folder of this user's
    alone; built (again) when it is missing or refused."""
    folder, trusted = _open_folder(target.parent)
    try:
        fd = _open_library(folder, target) if trusted else None
        if fd is None:
            _build(target)
            fd = _open_library(folder, target)
        if fd is None:
            raise KernelCacheError(f"the kernels just built at {target} are not private")
        try:
            # the very file checked, even if its path names another by now (Linux; else the path)
            by_fd = f"/proc/self/fd/{fd}"
            return ctypes.CDLL(by_fd if os.path.exists(by_fd) else str(target))
        finally:
            os.close(fd)
    finally:
        os.close(folder)


def kernel_dir() -> Path:
    """Where the kernels are built and loaded from: ``<EDGEQA_CACHE_DIR>/kernels``."""
    return SharedSettings.from_env().cache_dir / "kernels"


@cache
def library() -> ctypes.CDLL:
    """The compiled kernels, loaded once per process from ``kernel_dir()`` (built there on the
    first call in a fresh cache). ``KernelCacheError``: no folder of this user's alone there;
    ``KernelBuildError``: no C compiler, or it failed."""
    digest = hashlib.sha256(_SOURCE.read_bytes() + " ".join(_FLAGS).encode()).hexdigest()[:16]
    lib = _load_private(kernel_dir() / f"fixed_order-{digest}.so")
    lib.fo_gemm.argtypes = [_P, _I, _P, ctypes.c_int, _P, _I, _I, _I, _I]
    lib.fo_gemm.restype = ctypes.c_int
    lib.fo_attention.argtypes = [_P, _P, _P, _I, _P, _P, _I, _I, _I, _I, ctypes.c_float, _P]
    lib.fo_attention.restype = ctypes.c_int
    lib.fo_rms_norm.argtypes = [_P, _P, _P, _I, _I, ctypes.c_float]
    lib.fo_rms_norm.restype = ctypes.c_int
    lib.fo_silu_mul.argtypes = [_P, _P, _I, _I]
    lib.fo_silu_mul.restype = ctypes.c_int
    lib.fo_forward.argtypes = [_P, _P, _P, _P, _P, _I, _P, _P, _P, _P, _P, _P, _P, _I, _P]
    lib.fo_forward.restype = ctypes.c_int
    lib.fo_set_simd.argtypes = [ctypes.c_int]
    lib.fo_set_simd.restype = ctypes.c_int
    lib.fo_a8_path.argtypes = []
    lib.fo_a8_path.restype = ctypes.c_int
    return lib


def unavailable_reason() -> str | None:
    """Why the kernels cannot be loaded (no folder of this user's alone to keep them in), or None
    once they are: callers that can run without them (``runner.py``, ``auto`` weights) do."""
    try:
        library()
    except KernelCacheError as error:
        return str(error)
    return None


_HUGE_PAGE = 2 << 20


def huge_page_copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of ``tensors`` side by side in one anonymous mapping advised for transparent huge
    pages (Linux; elsewhere, or where THP is off, plain pages). A decode step streams every
    weight once: through 4 KiB pages the TLB misses cost a third of the step (6.0 ms with huge
    pages, 6.6-9.0 ms without, ``docs/engine.md``)."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + -(-size // 64) * 64)
    arena = mmap.mmap(-1, offsets[-1] + _HUGE_PAGE)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            arena.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the mapping is writable
        base = torch.frombuffer(arena, dtype=torch.uint8)
    start = -base.data_ptr() % _HUGE_PAGE
    copies = []
    for t, offset, size in zip(tensors, offsets, sizes, strict=False):
        view = base[start + offset : start + offset + size].view(t.dtype).view(t.shape)
        view.copy_(t)
        copies.append(view)
    return copies


def set_simd(on: bool | None) -> int:
    """Force the scalar path (False), the AVX2 one (True) or the CPU's best (None: AVX-512 for
    GGUF blocks where the CPU has it): tests use it to show all give the same bits. Returns the
    level in use: 0 scalar, 1 AVX2, 2 AVX-512."""
    return int(library().fo_set_simd(-1 if on is None else int(on)))


A8_PATHS = ("c", "avx2", "vnni")


def a8_path() -> str:
    """Where the 8-bit activation kernels' integer dot products (``gguf-a8``) run on this CPU, at
    the SIMD level in use: ``vnni`` (AVX-512 VNNI), ``avx2`` (VPMADDUBSW on 4-bit halves) or
    ``c`` (plain C, an order of magnitude slower). The same numbers on each."""
    return A8_PATHS[library().fo_a8_path()]


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


def weight_kind(packed: torch.Tensor, kind: int | None = None) -> tuple[int, int]:
    """(kind, reduction length K) of a packed weight: its dtype's, or a GGUF block kind's."""
    if kind is None:
        if packed.dtype not in _KINDS:
            raise TypeError(f"a {packed.dtype} packed weight needs its GGUF block kind")
        return _KINDS[packed.dtype], packed.shape[1]
    if kind not in _BLOCK_BYTES or packed.dtype != torch.uint8:
        raise TypeError(f"GGUF block kind {kind} is packed as uint8 blocks")
    if packed.shape[2] != _BLOCK_BYTES[kind]:
        raise ValueError(f"blocks of {packed.shape[2]} bytes are not kind {kind}'s")
    return kind, packed.shape[1] * QK


def gemm(
    x: torch.Tensor, packed: torch.Tensor, out_features: int, kind: int | None = None
) -> torch.Tensor:
    """x [M, in] float32 @ the packed weight -> [M, out_features] float32, in the fixed order;
    ``kind``: Q4_1 or Q8_0 for GGUF blocks (``pack_q4_1``, ``pack_q8_0``), Q4_1_A8, Q8_0_A8 or
    Q8_0_A16 for them with quantized activations (``with_8bit_activations``)."""
    x = x.float().contiguous()
    m, k = x.shape
    code_kind, packed_k = weight_kind(packed, kind)
    panels = packed.shape[0]
    y = torch.empty(m, panels * PANEL, dtype=torch.float32)
    code = -1
    if packed_k == k:
        code = library().fo_gemm(
            x.data_ptr(), k, packed.data_ptr(), code_kind, y.data_ptr(), y.shape[1], m, k,
            y.shape[1],
        )  # fmt: skip
    if code == -2:
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


class _Linear(ctypes.Structure):
    _fields_ = [("w", _P), ("in_scale", _P), ("scale", _P), ("bias", _P)] + [
        (name, _I) for name in ("K", "N", "out", "kind")
    ]


class _Layer(ctypes.Structure):
    _fields_ = [(name, _Linear) for name in ("qkv", "o", "gate_up", "down")] + [
        ("input_norm", _P),
        ("post_norm", _P),
    ]


class _Dims(ctypes.Structure):
    _fields_ = [
        (name, _I)
        for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "slots", "max_len")
    ] + [("eps", ctypes.c_float), ("scale", ctypes.c_float)]


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

    def spec(self) -> _Linear:
        def ptr(t: torch.Tensor | None) -> int | None:
            return None if t is None else t.data_ptr()

        for t in (self.in_scale, self.scale, self.bias):
            if t is not None and (t.dtype != torch.float32 or not t.is_contiguous()):
                raise TypeError("in_scale, scale and bias must be contiguous float32")
        kind, k = weight_kind(self.packed, self.kind)
        return _Linear(
            ptr(self.packed), ptr(self.in_scale), ptr(self.scale), ptr(self.bias),
            k, self.packed.shape[0] * PANEL, self.out_features, kind,
        )  # fmt: skip


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
    the kernels above composed with fp32 elementwise steps, bit for bit (``tests/origin/engine/
    test_kernels.py``), without a Python dispatch per operation."""

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
        n_layers, slots, _, max_len, _ = k_cache.shape
        hidden = final_norm.shape[0]
        self._keep = (layers, final_norm, head, k_cache, v_cache, cos, sin)
        self._layers = (_Layer * len(layers))(
            *(
                _Layer(w.qkv.spec(), w.o.spec(), w.gate_up.spec(), w.down.spec(),
                       w.input_norm.data_ptr(), w.post_norm.data_ptr())
                for w in layers
            )
        )  # fmt: skip
        ffn = layers[0].down.reduction
        self._dims = _Dims(
            n_layers, hidden, heads, kv_heads, head_dim, ffn, slots, max_len, eps, scale
        )
        self._head = head.spec()
        self.vocab = head.out_features
        self._args = (final_norm.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr())
        self._tables = (cos.data_ptr(), sin.data_ptr())

    def __call__(
        self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor
    ) -> torch.Tensor:
        """x [T, hidden] fp32 (the tokens' embeddings; overwritten), positions and slots [T],
        rows [R]: the tokens whose logits are wanted. Returns logits [R, vocab] fp32."""
        x = x.float().contiguous()
        positions = positions.to(torch.int64).contiguous()
        slots = slots.to(torch.int64).contiguous()
        rows = rows.to(torch.int64).contiguous()
        logits = torch.empty(len(rows), self._head.N, dtype=torch.float32)
        norm, k_cache, v_cache = self._args
        code = library().fo_forward(
            ctypes.byref(self._dims), self._layers, norm, ctypes.byref(self._head),
            x.data_ptr(), x.shape[0], positions.data_ptr(), slots.data_ptr(), k_cache, v_cache,
            *self._tables, rows.data_ptr(), len(rows), logits.data_ptr(),
        )  # fmt: skip
        if code == -2:
            raise MemoryError("fo_forward could not allocate its scratch buffers")
        if code:
            raise ValueError("fo_forward refused a position, slot or head shape")
        return logits if self._head.N == self.vocab else logits[:, : self.vocab]
