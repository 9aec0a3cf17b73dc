"""The lean BERT model: ``BertModel``'s forward as a short list of torch functional calls on its
own weights, for the sentence-transformers layout both built-in embedders have (a BERT with
absolute positions, mean pooling, optional ``Normalize``), as gpt-fast's ``model.py`` is one
model's forward and nothing else.

A query is a dozen tokens, so a BERT-style encoder's matrix products are tiny (all-MiniLM-L6-v2:
~0.3 GFLOP) and through ``transformers`` more than half the time is per-module overhead
(attention-mask building, dispatch, hooks): one fused QKV product,
``scaled_dot_product_attention``, the two feed-forward products and three layer norms per layer
are what is left. ``BertParts`` is what the forward needs of an embedder (``lean_layout``: a
``LeanEmbedder``'s, or a ``SentenceTransformer``'s when its layout is this one); ``LeanBert`` is
the forward in one precision. Query encoding (``query.py``) and batch encoding (``batch.py``) run
it; the vectors are ``SentenceTransformer.encode``'s (cosine > 0.9999).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer

    from semantic.embedder import Embedder


@dataclass(frozen=True)
class BertParts:
    """What the lean forward needs of a BERT-style sentence embedder: its weights (``BertModel``'s
    state dict), its config, and its tokenizer (token ids per text, truncated to its window)."""

    weights: Mapping[str, torch.Tensor]
    config: Mapping[str, Any]
    tokenize: Callable[[list[str]], list[list[int]]]

    def supported(self) -> bool:
        """A BERT with absolute positions and GELU, an encoder: what ``LeanBert`` computes."""
        config = self.config
        return (
            config.get("model_type") == "bert"
            and config.get("position_embedding_type", "absolute") == "absolute"
            and config.get("hidden_act") == "gelu"
            and not config.get("is_decoder", False)
        )

    @functools.cached_property
    def fp32(self) -> LeanBert:
        """The fp32 forward on these weights, built once (its QKV weights are fused copies):
        a ``LeanEmbedder``'s ``encode`` calls reuse it."""
        import torch

        return LeanBert(self, torch.float32)


class LeanBert:
    """``BertModel``'s forward for unpadded rows, as functional calls on its own weights."""

    def __init__(self, parts: BertParts, dtype: torch.dtype) -> None:
        import torch

        config = parts.config
        p = {name: t.detach() for name, t in parts.weights.items()}

        def w(name: str) -> torch.Tensor:
            return p[name].to(dtype).contiguous()

        self.heads = int(config["num_attention_heads"])
        self.eps = float(config["layer_norm_eps"])
        e = "embeddings."
        self.words = w(e + "word_embeddings.weight")
        # positions and the (single) token type folded into one table
        self.positions = (
            w(e + "position_embeddings.weight") + w(e + "token_type_embeddings.weight")[0]
        )
        self.norm = (w(e + "LayerNorm.weight"), w(e + "LayerNorm.bias"))
        self.layers = []
        for i in range(int(config["num_hidden_layers"])):
            a = f"encoder.layer.{i}.attention."
            f = f"encoder.layer.{i}."
            qkv = [a + f"self.{n}" for n in ("query", "key", "value")]
            self.layers.append(
                (
                    torch.cat([w(n + ".weight") for n in qkv]).contiguous(),
                    torch.cat([w(n + ".bias") for n in qkv]).contiguous(),
                    w(a + "output.dense.weight"),
                    w(a + "output.dense.bias"),
                    (w(a + "output.LayerNorm.weight"), w(a + "output.LayerNorm.bias")),
                    w(f + "intermediate.dense.weight"),
                    w(f + "intermediate.dense.bias"),
                    w(f + "output.dense.weight"),
                    w(f + "output.dense.bias"),
                    (w(f + "output.LayerNorm.weight"), w(f + "output.LayerNorm.bias")),
                )
            )

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """Mean-pooled, unit-length fp32 embeddings of rows of token ids of one length (B, T):
        unpadded, so no attention mask (``encode_many`` groups texts by length)."""
        import torch
        import torch.nn.functional as F

        rows, n = ids.shape
        width = self.words.shape[1]
        heads, size = self.heads, width // self.heads
        x = F.embedding(ids, self.words) + self.positions[:n]
        x = F.layer_norm(x, (width,), *self.norm, self.eps)
        for w_qkv, b_qkv, w_o, b_o, norm1, w_i, b_i, w_out, b_out, norm2 in self.layers:
            qkv = F.linear(x, w_qkv, b_qkv).view(rows, n, 3, heads, size)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
            attended = attended.reshape(rows, n, width)
            x = F.layer_norm(x + F.linear(attended, w_o, b_o), (width,), *norm1, self.eps)
            hidden = F.gelu(F.linear(x, w_i, b_i))
            x = F.layer_norm(x + F.linear(hidden, w_out, b_out), (width,), *norm2, self.eps)
        pooled = x.float().mean(dim=1)
        return torch.nn.functional.normalize(pooled, dim=-1)


def lean_layout(model: Embedder) -> BertParts | None:
    """What the lean forward needs of ``model`` when it computes what ``encode`` does (a BERT
    with absolute positions, mean pooling, no default prompt, on the CPU); else None."""
    parts = getattr(model, "parts", None)  # a ``LeanEmbedder``'s
    if isinstance(parts, BertParts):
        return parts
    return _sentence_transformer_parts(model)  # type: ignore[arg-type]


def _sentence_transformer_parts(model: SentenceTransformer) -> BertParts | None:
    modules: list[Any] = list(model)
    names = [type(m).__name__ for m in modules]
    if names[:2] != ["Transformer", "Pooling"] or any(n != "Normalize" for n in names[2:]):
        return None
    pooling = modules[1].get_config_dict()
    if pooling.get("pooling_mode") != "mean" or getattr(model, "default_prompt_name", None):
        return None  # ``encode`` adds a default prompt (and pools around it); the lean path not
    transformer = modules[0]
    device = next(model.parameters()).device
    bert = transformer.auto_model
    if device.type != "cpu" or type(bert).__name__ != "BertModel":
        return None
    max_length = int(transformer.max_seq_length or 512)
    lower = bool(getattr(transformer, "do_lower_case", False))

    def tokenize(texts: list[str]) -> list[list[int]]:
        texts = [text.lower() for text in texts] if lower else texts
        ids = transformer.tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
        return [list(row) for row in ids]

    found = BertParts(bert.state_dict(), bert.config.to_dict(), tokenize)
    return found if found.supported() else None
