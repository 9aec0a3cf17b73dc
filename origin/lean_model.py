"""A Llama checkpoint read for the engine without transformers' model classes: ``LeanLlama``.

The engine never runs transformers' forward for a Llama-family model: ``LlamaRunner`` reads the
weights (fusing q/k/v and gate/up, packing or quantizing them) and the config, and computes every
step itself. Building ``LlamaForCausalLM`` to hand it those tensors cost more than the rest of a
start: importing ``modeling_llama`` pulls in torch's compiler and distributed stacks, SymPy and
SciPy (about 6 s of CPU from a fresh interpreter), and ``AutoTokenizer`` imports the table of
every architecture (2 s more). Every process that serves paid it: each origin as it starts,
``edgeqa ask``, each Ray actor of the nightly job and the nightly driver.

For a folder in the layout below, on the CPU, ``origin.model.load_engine_model`` reads the same
tensors from ``model.safetensors`` into modules with transformers' attribute names
(``model.layers[i].self_attn.q_proj.weight``, ``lm_head.weight``, ...) and the config from its JSON,
so the runner builds from it exactly as from ``LlamaForCausalLM``: the same bits (a test compares
every tensor and the engine's tokens). It has no forward of its own: what runs transformers'
forward (calibrating INT8 on a cache miss) asks ``with_forward`` for it, which loads transformers'
model of the same folder for that caller, who drops it after.

The layout: ``model_type`` ``llama`` (``LlamaForCausalLM``), SiLU, the default RoPE (no scaling),
no sliding window, ``pretraining_tp`` 1, no quantization config, one ``model.safetensors`` holding
exactly the tensors the config names, in the shapes it gives. Anything else loads through
transformers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def lean_config(folder: Path) -> SimpleNamespace | None:
    """``folder``'s config when ``LeanLlama`` reads it exactly (the module's layout), else None."""
    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or not (folder / "model.safetensors").is_file():
        return None
    rope = raw.get("rope_parameters") or {
        "rope_type": "default",
        "rope_theta": raw.get("rope_theta"),
    }
    if (
        raw.get("model_type") != "llama"
        or raw.get("architectures", ["LlamaForCausalLM"]) != ["LlamaForCausalLM"]
        or raw.get("hidden_act", "silu") != "silu"
        or raw.get("pretraining_tp", 1) not in (None, 1)
        or raw.get("rope_scaling")
        or raw.get("sliding_window")  # the runner leaves such a model to transformers' forward
        or "quantization_config" in raw
        or not isinstance(rope, dict)
        # transformers reads a legacy "type" where "rope_type" is missing
        or rope.get("rope_type", rope.get("type", "default")) != "default"
        or not isinstance(rope.get("rope_theta"), int | float)
    ):
        return None
    sizes = (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
    )
    if not all(_positive_int(raw.get(name)) for name in sizes) or not all(
        raw.get(name) is None or _positive_int(raw[name])
        for name in ("head_dim", "num_key_value_heads")
    ):
        return None
    if not isinstance(raw.get("rms_norm_eps"), float | int):
        return None
    config = SimpleNamespace(**raw)
    config.rope_parameters = {"rope_type": "default", "rope_theta": float(rope["rope_theta"])}
    config.head_dim = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
    config.num_key_value_heads = raw.get("num_key_value_heads") or raw["num_attention_heads"]
    config.tie_word_embeddings = bool(raw.get("tie_word_embeddings", False))
    config.attention_bias = bool(raw.get("attention_bias", False))
    config.mlp_bias = bool(raw.get("mlp_bias", False))
    return config


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def expected_tensors(config: SimpleNamespace) -> dict[str, tuple[int, ...]]:
    """The tensors ``model.safetensors`` holds for ``config``, no more, no fewer, each with the
    shape the config's sizes give it."""
    hidden, vocab, inter = config.hidden_size, config.vocab_size, config.intermediate_size
    q, k = (
        config.num_attention_heads * config.head_dim,
        config.num_key_value_heads * config.head_dim,
    )
    attention = dict(
        zip(_ATTENTION, ((q, hidden), (k, hidden), (k, hidden), (hidden, q)), strict=True)
    )
    mlp = dict(zip(_MLP, ((inter, hidden), (inter, hidden), (hidden, inter)), strict=True))
    tensors: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
    }
    if not config.tie_word_embeddings:
        tensors["lm_head.weight"] = (vocab, hidden)
    for i in range(config.num_hidden_layers):
        layer = f"model.layers.{i}"
        tensors[f"{layer}.input_layernorm.weight"] = (hidden,)
        tensors[f"{layer}.post_attention_layernorm.weight"] = (hidden,)
        for part, shapes, bias in (
            ("self_attn", attention, config.attention_bias),
            ("mlp", mlp, config.mlp_bias),
        ):
            for name, shape in shapes.items():
                tensors[f"{layer}.{part}.{name}.weight"] = shape
                if bias:
                    tensors[f"{layer}.{part}.{name}.bias"] = shape[:1]
    return tensors


class _Weights(nn.Module):
    """A module holding a weight (and a bias) under transformers' names; no forward."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)


class _Rotary(nn.Module):
    """The default RoPE's inverse frequencies, computed as ``LlamaRotaryEmbedding`` does."""

    def __init__(self, config: SimpleNamespace) -> None:
        super().__init__()
        base, dim = config.rope_parameters["rope_theta"], config.head_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = 1.0


class LeanLlama(nn.Module):
    """A Llama checkpoint's weights under transformers' attribute names, its config and
    generation config: what ``LlamaRunner`` reads, without transformers' forward."""

    def __init__(
        self,
        folder: Path,
        config: SimpleNamespace,
        tensors: dict[str, torch.Tensor],
        load_full: Callable[[], PreTrainedModel],
    ) -> None:
        super().__init__()
        self._load_full = load_full
        self.name_or_path = str(folder)
        self.config = config
        self.generation_config = _generation_config(folder, config)

        def linear(prefix: str) -> _Weights:
            return _Weights(tensors[f"{prefix}.weight"], tensors.get(f"{prefix}.bias"))

        layers = nn.ModuleList()
        for i in range(config.num_hidden_layers):
            prefix = f"model.layers.{i}"
            layer = nn.Module()
            layer.self_attn = nn.Module()
            for name in _ATTENTION:
                setattr(layer.self_attn, name, linear(f"{prefix}.self_attn.{name}"))
            layer.mlp = nn.Module()
            for name in _MLP:
                setattr(layer.mlp, name, linear(f"{prefix}.mlp.{name}"))
            layer.input_layernorm = linear(f"{prefix}.input_layernorm")
            layer.post_attention_layernorm = linear(f"{prefix}.post_attention_layernorm")
            layers.append(layer)
        self.model = nn.Module()
        self.model.embed_tokens = linear("model.embed_tokens")
        self.model.layers = layers
        self.model.norm = linear("model.norm")
        self.model.rotary_emb = _Rotary(config)
        if config.tie_word_embeddings:  # one parameter, as transformers ties them
            self.lm_head = _Weights(self.model.embed_tokens.weight.data)
            self.lm_head.weight = self.model.embed_tokens.weight
        else:
            self.lm_head = linear("lm_head")

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "LeanLlama holds the weights the engine reads and has no forward: "
            "origin.lean_model.with_forward(model) gives transformers' model of its folder"
        )

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def load_transformers(self) -> PreTrainedModel:
        """transformers' model of the same folder, dtype and device, loaded now: for what runs
        its forward once (a calibration), dropped after it, not held beside these weights."""
        return self._load_full()


def read_llama(
    folder: Path, dtype: torch.dtype, load_full: Callable[[], PreTrainedModel]
) -> LeanLlama | None:
    """``folder``'s Llama as ``LeanLlama`` (CPU, ``dtype``), or None when its layout is not the
    one it reads exactly (``lean_config``; the file holds other tensors or shapes). ``load_full``:
    transformers' model of the same folder, for what needs its forward (``with_forward``)."""
    from safetensors import safe_open

    config = lean_config(folder)
    if config is None:
        return None
    path = str(folder / "model.safetensors")
    with safe_open(path, "pt") as f:
        found = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    if found != expected_tensors(config):
        return None  # other tensors, or other shapes: transformers says what does not fit
    from safetensors.torch import load_file

    tensors = {name: t.to(dtype) for name, t in load_file(path, device="cpu").items()}
    return LeanLlama(folder, config, tensors, load_full)


def with_forward(model: Any) -> Any:
    """``model`` as something with transformers' forward and ``generate``: itself, or for a
    ``LeanLlama`` transformers' model of its folder, loaded for the caller (who drops it)."""
    return model.load_transformers() if isinstance(model, LeanLlama) else model


def _generation_config(folder: Path, config: SimpleNamespace) -> SimpleNamespace:
    """The generation config's token ids (``generation_config.json``; else the config's), what
    the engine reads of it."""
    names = ("bos_token_id", "eos_token_id", "pad_token_id")
    try:
        raw = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none: transformers takes the config's
        return SimpleNamespace(**{n: getattr(config, n, None) for n in names})
    return SimpleNamespace(**{n: raw.get(n) if isinstance(raw, dict) else None for n in names})
