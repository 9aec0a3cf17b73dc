"""A sentence-transformers folder embedded without sentence-transformers: ``LeanEmbedder``.

Importing sentence-transformers costs about 8 s of CPU (it imports scikit-learn, SciPy's
statistics, accelerate and torch's compiler stack), and building its ``BertModel`` through
transformers more: every process that embeds paid it (each edge and origin as it starts, each Ray
actor of the nightly job, the nightly driver), about 10 s from a fresh interpreter to a loaded
embedder. Both built-in embedders are a BERT with absolute positions, mean pooling and
``Normalize``, the layout the lean forward computes (``bert.py``). For such a folder on the
CPU, ``load_embedder`` reads what that forward needs directly: the weights (safetensors), the
config (JSON) and the tokenizer (``tokenizer.json`` through ``tokenizers``, the Rust library
transformers' fast tokenizers wrap): about 2.5 s, torch's import included. The vectors are the
same bits as before: the same weights, token ids and forward.

Any other folder (another architecture or pooling, a default prompt, no explicit
``max_seq_length``), a GPU, and fine-tuning (``loading.trainable``) load a ``SentenceTransformer``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semantic.batch import encode_many
from semantic.bert import BertParts

if TYPE_CHECKING:
    import numpy as np

# the modules of a classic sentence-transformers folder, by class name (sentence-transformers 2-5
# write ``sentence_transformers.models.<Name>``, 6 ``sentence_transformers.<...>.<name>.<Name>``)
_LAYOUT = ("Transformer", "Pooling")
_NORMALIZE = "Normalize"


def lean_settings(folder: Path) -> dict[str, Any] | None:
    """The window (``max_length``) and casing (``lower``) of ``folder`` when it is a
    sentence-transformers folder the lean forward computes exactly (a BERT at its root, mean
    pooling, an optional ``Normalize``, no default prompt, an explicit ``max_seq_length``, the
    weights in safetensors, a ``tokenizer.json``); else None."""
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
        names = [str(m["type"]).rsplit(".", 1)[-1] for m in modules]
        if tuple(names[:2]) != _LAYOUT or any(n != _NORMALIZE for n in names[2:]):
            return None
        if modules[0].get("path", "") != "":
            return None
        pooling = _json(folder / str(modules[1]["path"]) / "config.json")
        mean = pooling.get("pooling_mode") == "mean" or (
            pooling.get("pooling_mode_mean_tokens") is True
            and not any(
                value
                for name, value in pooling.items()
                if name.startswith("pooling_mode_") and name != "pooling_mode_mean_tokens"
            )
        )
        if not mean:
            return None
        if _json(folder / "config_sentence_transformers.json").get("default_prompt_name"):
            return None
        bert = _json(folder / "sentence_bert_config.json")
        if not isinstance(bert.get("max_seq_length"), int):
            return None
        if (
            not (folder / "model.safetensors").is_file()
            or not (folder / "tokenizer.json").is_file()
        ):
            return None
        config = _json(folder / "config.json")
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    limit = int(config.get("max_position_embeddings") or bert["max_seq_length"])
    return {
        "max_length": min(int(bert["max_seq_length"]), limit),
        "lower": bool(bert.get("do_lower_case", False)),
        "config": config,
    }


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not a JSON object")
    return value


class LeanEmbedder:
    """A sentence embedder read from a sentence-transformers folder of the lean layout
    (``lean_settings``), on the CPU: ``encode`` gives what ``SentenceTransformer.encode`` does
    (unit-length fp32 vectors, row for row) through the lean forward."""

    def __init__(self, folder: Path, settings: dict[str, Any]) -> None:
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        self.path = Path(folder)
        self.max_seq_length = int(settings["max_length"])
        self._lower = bool(settings["lower"])
        self._config = dict(settings["config"])
        self._weights = load_file(str(self.path / "model.safetensors"), device="cpu")
        self.tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.tokenizer.enable_truncation(self.max_seq_length)
        self.tokenizer.no_padding()
        self.parts = BertParts(self._weights, self._config, self._ids)
        if not self.parts.supported():
            raise ValueError(f"{self.path}: not a BERT the lean forward computes")

    def _ids(self, texts: list[str]) -> list[list[int]]:
        if self._lower:
            texts = [text.lower() for text in texts]
        return [encoding.ids for encoding in self.tokenizer.encode_batch(texts)]

    def get_embedding_dimension(self) -> int:
        return int(self._config["hidden_size"])

    def encode(
        self,
        sentences: str | list[str],
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        convert_to_numpy: bool = True,
        normalize_embeddings: bool = True,
        **_: Any,
    ) -> np.ndarray:
        """``SentenceTransformer.encode``'s common call: the vectors (unit length with or without
        ``normalize_embeddings``: the folder ends in ``Normalize`` or the lean forward adds it,
        as ``load_embedder`` does for every embedder), one row per text (a vector for one
        string)."""
        texts = [sentences] if isinstance(sentences, str) else list(sentences)
        vectors = encode_many(self, texts, progress=bool(show_progress_bar))
        return vectors[0] if isinstance(sentences, str) else vectors

    def __repr__(self) -> str:
        return f"LeanEmbedder({str(self.path)!r}, max_seq_length={self.max_seq_length})"
