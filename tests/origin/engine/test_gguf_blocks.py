"""Precision ``gguf``: the GGUF file's own blocks as the weights, the fp32 model's logits bit for
bit, packed once and kept beside the conversion."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from origin.engine import gguf_blocks, kernels
from origin.engine.runner import LlamaRunner, Segment
from origin.model_folder import ModelFolder
from origin.precision import ForwardPath
from origin.runtime import auto_quantization
from tests.origin.engine.conftest import needs_kernels


def _logits(runner: LlamaRunner) -> list[torch.Tensor]:
    slot = runner.cache.allocate()
    prompt = runner.forward([Segment(slot, list(range(200, 240)), 0, all_logits=True)])[0]
    decode = runner.forward([Segment(slot, [17], 40)])[0]
    return [prompt, decode]


@needs_kernels  # GGUF blocks are read by the fixed-order kernels alone
def test_gguf_blocks_compute_the_fp32_models_logits_bit_for_bit(
    embedded_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    model, tokenizer = embedded_model
    # the CPU default for this model: times 8-bit activations where they run in SIMD
    assert auto_quantization("cpu", model, 512) == (
        "gguf" if kernels.a8_path() == "c" else "gguf-a8"
    )
    try:  # at the plain-C level (a CPU without AVX2): the fp32 activations
        kernels.set_isa("scalar")
        assert kernels.a8_path() == "c" and auto_quantization("cpu", model, 512) == "gguf"
    finally:
        kernels.set_isa(None)
    cache = tmp_path / gguf_blocks.BLOCKS_FILE
    monkeypatch.setattr(gguf_blocks, "_cache_file", lambda m: cache)
    fp32 = _logits(LlamaRunner(model, 2, 512, "none", tokenizer))
    # from the GGUF file, checked; read by the fixed-order kernels, the whole step in one call
    packed = LlamaRunner(model, 2, 512, "gguf", tokenizer, batch_invariant=False)
    assert packed.forward_path is ForwardPath.FUSED and packed.batch_invariant
    assert cache.is_file()
    assert packed.weight_bytes < 100e6 < LlamaRunner(model, 1, 64, "none").weight_bytes / 5
    from_cache = LlamaRunner(model, 2, 512, "gguf", tokenizer)  # the kept blocks
    for got in (_logits(packed), _logits(from_cache)):
        assert all(torch.equal(a, b) for a, b in zip(got, fp32, strict=True))
    # blocks kept for another file (another fingerprint) are not used: packed again, and kept
    folder = ModelFolder.of(model)
    _, fingerprint = gguf_blocks.source_gguf(folder)
    assert gguf_blocks._load_cached(folder, fingerprint) is not None
    assert gguf_blocks._load_cached(folder, "another file") is None


def test_a_model_not_converted_from_gguf_is_refused_with_the_reason(embedded_model) -> None:  # type: ignore[no-untyped-def]
    model, _ = embedded_model

    class Elsewhere:  # the same architecture, from a folder with no conversion marker
        name_or_path = "/nonexistent/model"
        config = model.config

    elsewhere = ModelFolder.of(Elsewhere())
    assert not gguf_blocks.servable(elsewhere)
    with pytest.raises(gguf_blocks.GGUFWeightsError, match="converted from a GGUF file"):
        gguf_blocks.gguf_linears(Elsewhere(), elsewhere, {}, torch.zeros(1, 1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not on CUDA"):
        LlamaRunner(_OnCuda(model), 1, 64, "gguf")  # type: ignore[arg-type]


class _OnCuda:
    """The model as the runner sees it on a CUDA device (refused before any weight is read)."""

    def __init__(self, model) -> None:  # type: ignore[no-untyped-def]
        self._model = model

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        if name == "device":
            return torch.device("cuda")
        return getattr(self._model, name)
