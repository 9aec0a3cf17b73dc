"""Embedding one query at a time as fast as the CPU allows: the semantic tier's hot path.

A query is a dozen tokens, so a BERT-style encoder's matrix products are tiny (all-MiniLM-L6-v2:
~0.3 GFLOP) and through ``transformers`` more than half the time is per-module overhead
(attention-mask building, dispatch, hooks): 12.4 ms a query there, 4.8 ms here on a 2-core Zen 4,
where three quarters of what is left is the 24 small matrix products. For the usual
sentence-transformers layout — a ``BertModel`` with absolute positions, mean pooling, optional
``Normalize``; both built-in embedders — ``QueryEncoder`` runs the same arithmetic as
``BertModel`` as a short list of torch functional calls: one fused QKV product,
``scaled_dot_product_attention``, the two feed-forward products, three layer norms per layer.
Any other layout goes through ``SentenceTransformer.encode``.

Which weights serve (fp32, or bf16 where the CPU has native bf16) is chosen by measuring both on
this CPU when the encoder is built: bf16 halves the bytes read per query (1.6x faster on Zen 4),
but where oneDNN's bf16 kernels are slow or emulated it is the slower choice. ``query_encoder``
builds one encoder per embedder per process, so a release swap does not measure again.
Vectors are unit length, float32; cosine to ``SentenceTransformer.encode``'s vector > 0.9999.

Many texts at once (``encode_many``: the nightly job's wordings and phrasings) go through the same
forward in fp32, texts of one token length at a time: no padding, no attention mask.
"""

from __future__ import annotations

import functools
import logging
import statistics
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from edge_index.embedder import Embedder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BertParts:
    """What the lean forward needs of a BERT-style sentence embedder: its weights (``BertModel``'s
    state dict), its config, and its tokenizer (token ids per text, truncated to its window)."""

    weights: Mapping[str, torch.Tensor]
    config: Mapping[str, Any]
    tokenize: Callable[[list[str]], list[list[int]]]

    def supported(self) -> bool:
        """A BERT with absolute positions and GELU, an encoder: what ``_LeanBert`` computes."""
        config = self.config
        return (
            config.get("model_type") == "bert"
            and config.get("position_embedding_type", "absolute") == "absolute"
            and config.get("hidden_act") == "gelu"
            and not config.get("is_decoder", False)
        )

    @functools.cached_property
    def fp32(self) -> _LeanBert:
        """The fp32 forward on these weights, built once (its QKV weights are fused copies):
        a ``LeanEmbedder``'s ``encode`` calls reuse it."""
        import torch

        return _LeanBert(self, torch.float32)


PROBE = "how do i reset the password of my online banking account"
PROBE_RUNS = 7


class _LeanBert:
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


def _lean_layout(model: Embedder) -> BertParts | None:
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


class QueryEncoder:
    """Embeds queries for the semantic tier: one query through the lean forward (``_LeanBert``)
    in the precision measured fastest here, several through ``SentenceTransformer.encode``."""

    def __init__(self, model: Embedder, precision: str = "auto") -> None:
        """``precision``: ``auto`` (measure fp32 and, where the CPU has native bf16, bf16; keep
        the faster), ``fp32`` or ``bf16``."""
        import torch

        # weakly: ``query_encoder``'s cache is keyed weakly by the model, and a strong reference
        # back from its value would keep every swapped-out release's embedder alive
        self._model = weakref.ref(model)
        # one forward at a time: the encoder is shared by every release (and language) served
        # with this embedder, and two forwards on 2 cores only fight over them
        self._lock = threading.Lock()
        self.precision = "encode"
        self.probe_ms: dict[str, float] = {}
        self._lean: _LeanBert | None = None
        parts = _lean_layout(model)
        if parts is None:
            return
        self._tokenize = parts.tokenize
        candidates = {"fp32": torch.float32, "bf16": torch.bfloat16}
        if precision == "auto" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            precision = "fp32"
        if precision != "auto":
            candidates = {precision: candidates[precision]}
        with torch.inference_mode():
            leans = {name: _LeanBert(parts, dtype) for name, dtype in candidates.items()}
            for name, lean in leans.items():
                self._lean = lean
                self(["warm up"])
                self.probe_ms[name] = self._probe()
        self.precision = min(self.probe_ms, key=self.probe_ms.__getitem__)
        self._lean = leans[self.precision]
        log.info("query encoder: %s weights (ms per query: %s)", self.precision, self.probe_ms)

    def _probe(self) -> float:
        """Median milliseconds of one query."""
        times = []
        for _ in range(PROBE_RUNS):
            start = time.perf_counter()
            self([PROBE])
            times.append((time.perf_counter() - start) * 1000)
        return round(statistics.median(times), 3)

    def __call__(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            return self._embed(texts)

    def _embed(self, texts: list[str]) -> np.ndarray:
        import numpy as np

        if self._lean is None or len(texts) != 1:
            model = self._model()
            if model is None:
                raise RuntimeError("the embedder of this query encoder is gone")
            vectors = model.encode(
                texts,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
                batch_size=256,
            )
            return np.asarray(vectors, dtype=np.float32).reshape(len(texts), -1)
        import torch

        with torch.inference_mode():
            ids = torch.tensor(self._tokenize(texts), dtype=torch.long)
            return self._lean(ids).numpy()


_ENCODERS: weakref.WeakKeyDictionary[Any, QueryEncoder] = weakref.WeakKeyDictionary()
_ENCODERS_LOCK = threading.Lock()


def query_encoder(model: Embedder) -> QueryEncoder:
    """The ``QueryEncoder`` of ``model``, built (and its precision measured) once per process
    and kept while the model lives. The lean forward's weights are taken when it is built (bf16:
    a copy; fp32: the model's tensors, but QKV and the position table fused into new ones): a
    model changed in place afterwards (fine-tuned) needs ``QueryEncoder(model)``; ``finetune``
    users work on a copy, which is a new key."""
    with _ENCODERS_LOCK:
        encoder = _ENCODERS.get(model)
        if encoder is None:
            encoder = _ENCODERS[model] = QueryEncoder(model)
        return encoder


BATCH_TOKENS = 2048  # tokens per forward: the fastest measured on 2 cores (vs 8,192 and 32,768)
# texts tokenized (and held as ids) at a time: a chunk here, a block of the Ray job
# (``precompute/fleet/embedding.py``); 4,096 as fast as 16,384 in one process (462 vs 457
# wordings/s, 2 cores) and small enough to keep every Ray actor busy to the end
TOKENIZE_CHUNK = 4_096


def encode_many(model: Embedder, texts: Sequence[str], progress: bool = False) -> np.ndarray:
    """Unit-length fp32 embeddings of many texts, row for row (``encode_chunks``, joined)."""
    import numpy as np

    dim = int(model.get_embedding_dimension() or 0)
    chunks = list(encode_chunks(model, texts, progress))
    return np.concatenate(chunks) if chunks else np.zeros((0, dim), dtype=np.float32)


def encode_chunks(
    model: Embedder, texts: Sequence[str], progress: bool = False
) -> Iterator[np.ndarray]:
    """Unit-length fp32 embeddings of many texts, ``TOKENIZE_CHUNK`` rows at a time, in order:
    the night's wordings, a release's phrasings. The lean forward in fp32 (``encode``'s
    arithmetic: cosine to its vectors > 0.99999) on texts grouped by token length, so no row is
    padded and no attention mask is built: 777 wordings/s against ``encode``'s 430 on 2 cores
    (Xeon, AVX-512). Any other layout, or a model on a GPU, goes through ``encode`` (batches
    of 256)."""
    import numpy as np

    dim = int(model.get_embedding_dimension() or 0)
    parts = _lean_layout(model)
    lean = parts.fp32 if parts is not None else None
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(texts), desc="embedding", unit="text", leave=False)
    for start in range(0, len(texts), TOKENIZE_CHUNK):
        chunk = list(texts[start : start + TOKENIZE_CHUNK])
        if lean is None or parts is None:
            vectors = model.encode(
                chunk,
                batch_size=256,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            out = np.asarray(vectors, dtype=np.float32).reshape(len(chunk), dim)
        else:
            out = _encode_by_length(lean, parts, chunk, dim)
        if len(chunk) >= TRIM_AFTER:
            _return_freed_heap()
        if bar is not None:
            bar.update(len(chunk))
        yield out
    if bar is not None:
        bar.close()


# the heap is trimmed after a chunk of at least this many texts (the nightly job's), not after a
# few queries embedded at once on a service's request path, where it would walk a large heap
TRIM_AFTER = 1_024


def _return_freed_heap() -> None:
    """Hand the heap a chunk's forwards freed back to the system (glibc's ``malloc_trim``;
    elsewhere nothing). glibc keeps freed activations' pages for reuse, and the chunks' vectors
    land between them: measured, a million log rows' 402,732 wordings (618 MB of vectors) left
    the process 1.5 GB larger, not 0.6, for the index and the clusters to sit on top of. Dask
    trims its workers' heaps for the same reason; the next chunk allocates afresh at no
    measurable cost."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    import ctypes

    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim  # glibc's soname
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def _encode_by_length(lean: _LeanBert, parts: BertParts, texts: list[str], dim: int) -> np.ndarray:
    import numpy as np
    import torch

    ids = parts.tokenize(texts)
    lengths = np.fromiter((len(row) for row in ids), dtype=np.int64, count=len(ids))
    order = np.argsort(lengths, kind="stable")
    out = np.zeros((len(texts), dim), dtype=np.float32)
    with torch.inference_mode():
        i = 0
        while i < len(order):
            length = int(lengths[order[i]])
            rows = max(1, BATCH_TOKENS // length)
            j = i + 1
            while j < len(order) and j - i < rows and lengths[order[j]] == length:
                j += 1
            picked = order[i:j]
            batch = torch.tensor([ids[k] for k in picked], dtype=torch.long)
            out[picked] = lean(batch).numpy()
            i = j
    return out
