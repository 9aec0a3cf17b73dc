"""Embedding one query at a time as fast as the CPU allows: the semantic tier's hot path.

A query is a dozen tokens, so a BERT-style encoder's matrix products are tiny (all-MiniLM-L6-v2:
~0.3 GFLOP) and through ``transformers`` more than half the time is per-module overhead
(attention-mask building, dispatch, hooks): 12.4 ms a query there, 4.8 ms here on a 2-core Zen 4,
where three quarters of what is left is the 24 small matrix products. For the usual
sentence-transformers layout — a ``BertModel`` with absolute positions, mean pooling, optional
``Normalize``; both built-in embedders — ``QueryEncoder`` runs the same arithmetic as
``BertModel`` as a short list of torch functional calls (``bert.py``).
Any other layout goes through ``SentenceTransformer.encode``.

Which weights serve (fp32, or bf16 where the CPU has native bf16) is chosen by measuring both on
this CPU when the encoder is built: bf16 halves the bytes read per query (1.6x faster on Zen 4),
but where oneDNN's bf16 kernels are slow or emulated it is the slower choice. ``query_encoder``
builds one encoder per embedder per process, so a release swap does not measure again.
Vectors are unit length, float32; cosine to ``SentenceTransformer.encode``'s vector > 0.9999.

Many texts at once go through ``batch.py`` (the nightly job's wordings and phrasings).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from semantic.bert import LeanBert, lean_layout

if TYPE_CHECKING:
    import numpy as np

    from semantic.embedder import Embedder

log = logging.getLogger(__name__)


PROBE = "how do i reset the password of my online banking account"
PROBE_RUNS = 7


class QueryEncoder:
    """Embeds queries for the semantic tier: one query through the lean forward (``LeanBert``)
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
        self._lean: LeanBert | None = None
        parts = lean_layout(model)
        if parts is None:
            return
        self._tokenize = parts.tokenize
        candidates = {"fp32": torch.float32, "bf16": torch.bfloat16}
        if precision == "auto" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            precision = "fp32"
        if precision != "auto":
            candidates = {precision: candidates[precision]}
        with torch.inference_mode():
            leans = {name: LeanBert(parts, dtype) for name, dtype in candidates.items()}
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
