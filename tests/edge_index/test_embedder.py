from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from edge_index.embedder import (
    EMBEDDED_DIM,
    EmbedderNotFoundError,
    embedded_embedder_path,
    load_embedder,
)


def test_embedded_embedder_gives_unit_384d_vectors(embedder) -> None:  # type: ignore[no-untyped-def]
    vectors = embedder.encode(["How do I reset my password?", "I forgot my password", "", "🍕"])
    assert vectors.shape == (4, EMBEDDED_DIM)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert embedder.get_embedding_dimension() == EMBEDDED_DIM


def test_paraphrases_are_closer_than_unrelated_questions(embedder) -> None:  # type: ignore[no-untyped-def]
    a, b, c = embedder.encode(
        [
            "how do I reset my password",
            "I forgot my password, how can I change it",
            "what time does the train to Paris leave",
        ]
    )
    assert float(a @ b) > 0.6
    assert float(a @ c) < 0.3


def test_local_folder_spec_loads_the_same_model(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "copy"
    shutil.copytree(embedded_embedder_path(), folder)
    local = load_embedder(str(folder), device="cpu")
    text = ["is the bank open on sunday"]
    assert np.allclose(local.encode(text), embedder.encode(text), atol=1e-5)


def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EmbedderNotFoundError, match="neither 'embedded' nor a local"):
        load_embedder(str(tmp_path / "nope"))
