"""The GGUF file's own quantized blocks as the engine's weights (precision ``gguf``).

A model converted from a GGUF file (the embedded SmolLM2: Q4_1 layers, a Q8_0 embedding that is
also its LM head) holds in fp32 exactly what gguf's dequantization computes from the blocks. The
fixed-order kernels read the blocks themselves (``kernels.pack_q4_1``, ``pack_q8_0``) and
dequantize each weight with the same two rounded steps, so every product, and every logit, is
bitwise the fp32 model's, at a fifth of its bytes. Nothing is quantized a second time; each
layer's blocks are checked against the model's weights before use.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from origin.engine import kernels

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from origin.model_folder import ModelFolder

# GGUF names of a Llama layer's projections, in the runner's fused order
LAYER_GROUPS = {
    "qkv": ("attn_q", "attn_k", "attn_v"),
    "o": ("attn_output",),
    "gate_up": ("ffn_gate", "ffn_up"),
    "down": ("ffn_down",),
}


class GGUFWeightsError(ValueError):
    """The model's weights cannot be served from GGUF blocks (no source file, another block type,
    or blocks that do not reproduce the model's weights)."""


def source_gguf(folder: ModelFolder) -> tuple[Path, str]:
    """The GGUF file the model in ``folder`` was converted from (its conversion marker), if it
    is still the same file, and its fingerprint."""
    from origin.model_folder import MARKER, gguf_fingerprint

    try:
        source, fingerprint = folder.source()
        same = source.is_file() and gguf_fingerprint(source) == fingerprint
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise GGUFWeightsError(
            f"precision gguf needs a model converted from a GGUF file; "
            f"{folder.file(MARKER)}: {error}"
        ) from error
    if not same:
        raise GGUFWeightsError(f"{source} is gone or changed since the conversion")
    return source, fingerprint


# the packed blocks, kept beside the conversion: parsing the GGUF's metadata (its tokenizer) and
# checking every block against the model's weights take seconds, loading these a fraction of one
BLOCKS_FILE = "edgeqa-gguf-blocks.safetensors"
_LAYOUT = "panels-q4_1-row-pairs-1"  # kernels.pack_q4_1 / pack_q8_0's layout


def _cache_file(folder: ModelFolder) -> Path:
    return folder.file(BLOCKS_FILE)


def _load_cached(
    folder: ModelFolder, fingerprint: str, tensors: bool = True
) -> dict[str, kernels.PackedLinear] | None:
    """The packed blocks saved for this GGUF (checked when saved), or None."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(_cache_file(folder)), "pt") as f:
            meta = f.metadata() or {}
            if meta.get("fingerprint") != fingerprint or meta.get("layout") != _LAYOUT:
                return None
            shapes = json.loads(meta["linears"])
            if not tensors:
                return {}
            return {
                name: kernels.PackedLinear(f.get_tensor(name), out, kind=kind)
                for name, (out, kind) in shapes.items()
            }
    except (OSError, SafetensorError, ValueError, KeyError):
        return None


def _save_cached(
    folder: ModelFolder, fingerprint: str, linears: dict[str, kernels.PackedLinear]
) -> None:
    from origin.model_folder import keep_beside

    meta = {
        "fingerprint": fingerprint,
        "layout": _LAYOUT,
        "linears": json.dumps({n: (p.out_features, p.kind) for n, p in linears.items()}),
    }
    tensors = {n: p.packed.contiguous() for n, p in linears.items()}
    keep_beside(_cache_file(folder), tensors, meta, "the packed GGUF blocks")


@functools.cache
def _reader(path: Path) -> Any:
    import gguf

    return gguf.GGUFReader(str(path))


def servable(folder: ModelFolder) -> bool:
    """Whether the weights of the model in ``folder`` can be its GGUF file's blocks: converted
    from a GGUF file still in place, every matrix in Q4_1 or Q8_0 (the runner must support the
    architecture too)."""
    try:
        source, fingerprint = source_gguf(folder)
        if _load_cached(folder, fingerprint, tensors=False) is not None:
            return True
        tensors = _reader(source).tensors
    except (GGUFWeightsError, OSError, ValueError):
        return False
    matrices = [t for t in tensors if len(t.shape) == 2]
    return bool(matrices) and all(t.tensor_type.name in ("Q4_1", "Q8_0") for t in matrices)


def _rows(tensor: Any, config: Any, name: str) -> tuple[str, np.ndarray]:
    """(block type, raw blocks [rows, bytes per row]) with q and k rows in the model's order
    (llama.cpp permutes them for its rotary layout; transformers undoes it on load)."""
    kind = tensor.tensor_type.name
    data = np.asarray(tensor.data).reshape(tensor.data.shape[0], -1)
    if name in ("attn_q", "attn_k"):
        heads = config.num_attention_heads if name == "attn_q" else config.num_key_value_heads
        order = np.arange(data.shape[0])
        order = order.reshape(heads, 2, -1).swapaxes(1, 2).reshape(-1)
        data = data[np.argsort(order)]
    return kind, data


def _pack(
    parts: list[tuple[str, np.ndarray]], weight: torch.Tensor, what: str
) -> kernels.PackedLinear:
    kinds = {kind for kind, _ in parts}
    if len(kinds) != 1 or next(iter(kinds)) not in ("Q4_1", "Q8_0"):
        raise GGUFWeightsError(f"{what}: blocks {sorted(kinds)}; the kernels read Q4_1 and Q8_0")
    kind = kinds.pop()
    rows = np.concatenate([data for _, data in parts])
    out, k = weight.shape
    size = 20 if kind == "Q4_1" else 34
    blocks = torch.from_numpy(np.ascontiguousarray(rows)).reshape(out, k // 32, size)
    d = blocks[..., 0:2].contiguous().view(torch.float16)[..., 0]
    if kind == "Q4_1":
        m = blocks[..., 2:4].contiguous().view(torch.float16)[..., 0]
        nib = blocks[..., 4:]
        q = torch.cat([nib & 15, nib >> 4], dim=-1).reshape(out, k)
        values = d.float()[..., None] * q.reshape(out, -1, 32).float() + m.float()[..., None]
        packed = kernels.PackedLinear(kernels.pack_q4_1(d, m, q), out, kind=kernels.Q4_1)
    else:
        q = blocks[..., 2:].contiguous().view(torch.int8).reshape(out, k)
        values = d.float()[..., None] * q.reshape(out, -1, 32).float()
        packed = kernels.PackedLinear(kernels.pack_q8_0(d, q), out, kind=kernels.Q8_0)
    if not torch.equal(values.reshape(out, k), weight.float()):
        raise GGUFWeightsError(f"{what}: the GGUF blocks do not reproduce the model's weights")
    return packed


def gguf_linears(
    model: PreTrainedModel,
    folder: ModelFolder,
    weights: dict[tuple[int, str], torch.Tensor],
    head: torch.Tensor,
    activations_8bit: bool = False,
) -> tuple[dict[tuple[int, str], kernels.PackedLinear], kernels.PackedLinear]:
    """Packed blocks for every fused projection (``weights``: (layer, "qkv" | "o" | "gate_up" |
    "down") -> the runner's fused fp32 weight [out, in]) and the LM head (the output tensor, or
    the tied embedding) of ``model``, read from ``folder``. Packed once per GGUF file and kept
    beside the conversion; ``activations_8bit``: laid out for the kernels that quantize
    activations (``gguf-a8``)."""
    packed, head_packed = _gguf_linears(model, folder, weights, head)
    if not activations_8bit:
        return packed, head_packed

    def a8(linear: kernels.PackedLinear, residual: bool = False) -> kernels.PackedLinear:
        assert linear.kind is not None
        blocks, kind = kernels.with_8bit_activations(linear.packed, linear.kind, residual)
        return kernels.PackedLinear(blocks, linear.out_features, kind=kind, bias=linear.bias)

    # the LM head decides the argmax: its activations get a second 8-bit pass where it is Q8_0
    # (teacher-forced greedy agreement with fp32 0.963 -> 0.975 on 16 NQ-open questions)
    head_a8 = a8(head_packed, residual=head_packed.kind == kernels.Q8_0)
    return {key: a8(linear) for key, linear in packed.items()}, head_a8


def _gguf_linears(
    model: PreTrainedModel,
    folder: ModelFolder,
    weights: dict[tuple[int, str], torch.Tensor],
    head: torch.Tensor,
) -> tuple[dict[tuple[int, str], kernels.PackedLinear], kernels.PackedLinear]:
    source, fingerprint = source_gguf(folder)
    cached = _load_cached(folder, fingerprint)
    keys = {f"{layer}.{group}": (layer, group) for layer, group in weights}
    if cached is not None and set(cached) == {*keys, "head"}:
        return {keys[n]: p for n, p in cached.items() if n != "head"}, cached["head"]
    tensors = {t.name: t for t in _reader(source).tensors}
    config = model.config
    packed = {}
    for (layer, group), weight in weights.items():
        names = [f"blk.{layer}.{name}.weight" for name in LAYER_GROUPS[group]]
        missing = [n for n in names if n not in tensors]
        if missing:
            raise GGUFWeightsError(f"the GGUF file has no {', '.join(missing)}")
        parts = [_rows(tensors[n], config, n.split(".")[2]) for n in names]
        packed[(layer, group)] = _pack(parts, weight, f"layer {layer} {group}")
    name = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    head_packed = _pack([_rows(tensors[name], config, "output")], head, "LM head")
    by_name = {name: packed[key] for name, key in keys.items()}
    _save_cached(folder, fingerprint, {**by_name, "head": head_packed})
    return packed, head_packed
