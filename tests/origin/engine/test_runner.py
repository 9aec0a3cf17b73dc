from __future__ import annotations

import pytest
import torch

from origin.engine import kernels
from origin.engine.linear import (
    Bf16Linear,
    DenseLinear,
    Int8WeightOnlyLinear,
    W8A8Linear,
)
from origin.engine.runner import HFRunner, LlamaRunner, Segment, make_runner
from origin.precision import REGISTRY, Backend, ForwardPath, LinearKind, lookup
from tests.origin.engine.conftest import needs_kernels, tiny_model


def _reference_logits(model, ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def _prompt(n: int, vocab: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


# batch-invariant: the fixed-order kernels; not: the library GEMMs and attention
@pytest.mark.parametrize("batch_invariant", [True, False])
def test_lean_runner_matches_transformers_on_the_embedded_model(
    embedded_model,  # type: ignore[no-untyped-def]
    batch_invariant: bool,
) -> None:
    model, tokenizer = embedded_model
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog because")
    ref = _reference_logits(model, ids)
    runner = LlamaRunner(model, num_slots=3, max_len=128, batch_invariant=batch_invariant)
    whole = runner.forward([Segment(2, ids, 0, all_logits=True)])[0]
    assert torch.allclose(whole, ref, atol=1e-3)
    # chunked prefill in slot 0 beside a batched decode in slot 1 and 2
    first = runner.forward([Segment(0, ids[:5], 0, all_logits=True)])[0]
    runner.forward([Segment(1, ids[:-1], 0)])
    mixed = runner.forward(
        [
            Segment(0, ids[5:], 5, all_logits=True),
            Segment(1, ids[-1:], len(ids) - 1),
            Segment(2, ids[-1:], len(ids) - 1),
        ]
    )
    assert torch.allclose(torch.cat([first, mixed[0]]), ref, atol=1e-3)
    assert torch.allclose(mixed[1][0], ref[-1], atol=1e-3)
    assert torch.allclose(mixed[2][0], ref[-1], atol=1e-3)


@pytest.mark.parametrize("batch_invariant", [True, False])
@pytest.mark.parametrize("model_type", ["llama", "qwen2", "mistral"])
def test_lean_runner_matches_each_llama_family_member(
    model_type: str, batch_invariant: bool
) -> None:
    model = tiny_model(model_type)
    runner = LlamaRunner(model, num_slots=4, max_len=64, batch_invariant=batch_invariant)
    prompts = [_prompt(n, 128, seed=n) for n in (9, 17, 4)]
    refs = [_reference_logits(model, p) for p in prompts]
    for slot, p in enumerate(prompts):
        runner.forward([Segment(slot, p[:-1], 0)])
    # one batched decode step: different lengths, slots 0..2
    out = runner.forward([Segment(s, p[-1:], len(p) - 1) for s, p in enumerate(prompts)])
    for logits, ref in zip(out, refs, strict=True):
        assert torch.allclose(logits[0], ref[-1], atol=1e-4)


# the class each kind of linear is on the CPU (origin/precision.py's LinearKind)
_CPU_LINEARS = {
    LinearKind.FIXED_ORDER: kernels.PackedLinear,
    LinearKind.DENSE: DenseLinear,
    LinearKind.BF16: Bf16Linear,
    LinearKind.INT8_WEIGHT_ONLY: Int8WeightOnlyLinear,
    LinearKind.W8A8: W8A8Linear,
}


# batch-invariant: the registry's fixed-order backend, which the kernels alone run
@pytest.mark.parametrize("batch_invariant", [pytest.param(True, marks=needs_kernels), False])
@pytest.mark.parametrize(
    "quantization",
    [p.name for p in REGISTRY if "cpu" in p.devices and not p.weights.from_gguf_file],
)
def test_a_runner_is_built_from_its_precisions_entry(
    quantization: str, batch_invariant: bool
) -> None:
    """The kernels, the forward path and every linear's class are the registry entry's (the
    GGUF entries: ``test_gguf_blocks.py``), and the step still computes the model's logits."""
    precision = lookup(quantization)
    model = tiny_model("qwen2")  # biases on q, k and v
    runner = LlamaRunner(model, 2, 64, quantization, batch_invariant=batch_invariant)
    backend = precision.backend("cpu", batch_invariant)
    assert runner.backend is backend and runner.forward_path is precision.forward_path(backend)
    assert runner.batch_invariant == (backend is Backend.FIXED_ORDER)
    assert (runner._fused is not None) == (runner.forward_path is ForwardPath.FUSED)
    linear = _CPU_LINEARS[precision.linears[backend]]
    assert all(
        isinstance(getattr(layer, name), linear)
        for layer in runner.layers
        for name in ("qkv", "o", "gate_up", "down")
    )
    assert isinstance(runner.lm_head, _CPU_LINEARS[lookup(precision.head).linears[backend]])
    ids = _prompt(12, 128)
    logits = runner.forward([Segment(0, ids, 0, all_logits=True)])[0]
    ref = _reference_logits(model, ids)
    assert (logits - ref).norm() / ref.norm() < 0.05


def test_rollback_is_a_position_move() -> None:
    model = tiny_model("llama")
    runner = LlamaRunner(model, num_slots=1, max_len=64)
    ids = _prompt(20, 128)
    runner.forward([Segment(0, ids, 0)])
    runner.cache.truncate(0, 12)  # reject the last 8 positions
    again = runner.forward([Segment(0, ids[12:], 12, all_logits=True)])[0]
    assert torch.allclose(again, _reference_logits(model, ids)[12:], atol=1e-4)


def test_other_architectures_use_the_generic_runner() -> None:
    model = tiny_model("gpt2")
    runner = make_runner(model, num_slots=2, max_len=64)
    assert isinstance(runner, HFRunner)
    ids = _prompt(10, 128)
    runner.forward([Segment(0, ids[:6], 0)])
    out = runner.forward([Segment(0, ids[6:], 6, all_logits=True), Segment(1, ids, 0)])
    ref = _reference_logits(model, ids)
    assert torch.allclose(out[0], ref[6:], atol=1e-4)
    assert torch.allclose(out[1][0], ref[-1], atol=1e-4)
    with pytest.raises(ValueError, match="needs a Llama-family model"):
        make_runner(model, 2, 64, quantization="int8")


def test_sliding_window_shorter_than_max_len_is_refused() -> None:
    model = tiny_model("mistral", sliding_window=16)
    with pytest.raises(ValueError, match="sliding_window 16"):
        LlamaRunner(model, num_slots=1, max_len=64)
    assert isinstance(make_runner(model, 1, 64), HFRunner)


def _int8_weights(runner: LlamaRunner) -> list[torch.Tensor]:
    return [
        t
        for layer in runner.layers
        for name in ("qkv", "o", "gate_up", "down")
        for t in (getattr(layer, name).packed, getattr(layer, name).in_scale)
        if t is not None
    ]


@pytest.fixture
def own_conversion(model_cache_dir, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The embedded model loaded from a conversion folder of this test's own (its files linked
    from the session's, what is kept beside them left out): the session's, shared by the suite's
    workers, is not damaged under them. Calibrated on one prompt: what is kept and read back is
    under test here, not how well the scales are chosen."""
    import os
    import shutil

    from origin.conversion import converted_dir
    from origin.engine import calibration
    from origin.model import embedded_gguf_path, load_model

    monkeypatch.setattr(calibration, "CALIBRATION_PROMPTS", calibration.CALIBRATION_PROMPTS[:1])
    folder = tmp_path / "models" / "converted"
    shutil.copytree(
        converted_dir(embedded_gguf_path(), model_cache_dir),
        folder,
        ignore=shutil.ignore_patterns(f"{calibration.CACHE_FILE}*", "edgeqa-gguf-blocks*"),
        copy_function=os.link,
    )
    return load_model(str(folder))


@needs_kernels  # the calibrated INT8 weights are read as the kernels pack them
def test_int8_calibration_is_kept_beside_the_conversion_and_read_back(
    own_conversion, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Activation-aware INT8 calibration runs once per converted model: the next runner built on
    the same weights reads the chosen scales back (the same INT8 weights) instead of running the
    calibration prompts again; a record made another way (here: another method) is not used."""
    from pathlib import Path

    from origin.engine import calibration

    model, tokenizer = own_conversion
    kept = Path(str(model.name_or_path)) / calibration.CACHE_FILE
    kept.unlink(missing_ok=True)
    first = _int8_weights(make_runner(model, 1, 64, "int8", tokenizer))
    assert kept.is_file()

    def no_calibration(*_: object, **__: object) -> None:
        raise AssertionError("calibrated again")

    with monkeypatch.context() as patched:
        patched.setattr(calibration, "collect_linear_inputs", no_calibration)
        again = _int8_weights(make_runner(model, 1, 64, "int8", tokenizer))
        assert len(again) == len(first) and any(t.dtype == torch.float32 for t in first)
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))

        patched.setattr(calibration, "_METHOD", "another-method")
        with pytest.raises(AssertionError, match="calibrated again"):
            make_runner(model, 1, 64, "int8", tokenizer)

    # a damaged record is not used, and a cache that cannot be written only costs the next
    # engine its calibration again (safetensors reports a failed write as its own error)
    from safetensors import SafetensorError

    kept.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")

    def unwritable(*_: object, **__: object) -> None:
        raise SafetensorError("Error while serializing: I/O error: Read-only file system")

    monkeypatch.setattr("safetensors.torch.save_file", unwritable)
    damaged = _int8_weights(make_runner(model, 1, 64, "int8", tokenizer))
    assert all(torch.equal(a, b) for a, b in zip(first, damaged, strict=True))
    assert kept.read_bytes().endswith(b"garbage")


@needs_kernels
def test_engines_built_at_once_wait_for_one_calibration(
    own_conversion, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Two engines built at once on the same weights (a machine's Ray actors): the second waits
    for the first's calibration, under a lock beside the weights, and reads it back instead of
    calibrating too. Here the test holds the lock as the first builder; the second must not
    calibrate once the scales are there when it gets the lock."""
    import threading
    from pathlib import Path

    from filelock import FileLock

    from origin.engine import calibration

    model, tokenizer = own_conversion
    kept = Path(str(model.name_or_path)) / calibration.CACHE_FILE
    first = _int8_weights(make_runner(model, 1, 64, "int8", tokenizer))
    record = kept.read_bytes()
    kept.unlink()

    looked = threading.Event()
    read = calibration._read

    def read_and_say(*args: object) -> object:
        found = read(*args)  # type: ignore[arg-type]
        looked.set()
        return found

    def no_calibration(*_: object, **__: object) -> None:
        raise AssertionError("calibrated again")

    monkeypatch.setattr(calibration, "_read", read_and_say)
    monkeypatch.setattr(calibration, "collect_linear_inputs", no_calibration)
    built: list[object] = []
    lock = FileLock(str(kept) + ".lock")
    with lock:
        second = threading.Thread(
            target=lambda: built.append(_int8_weights(make_runner(model, 1, 64, "int8", tokenizer)))
        )
        second.start()
        assert looked.wait(timeout=300)  # it found no scales: it now waits for the lock
        kept.write_bytes(record)  # the first builder's scales
    second.join(timeout=300)
    assert built, "the second build failed (see the thread's error above)"
    assert all(torch.equal(a, b) for a, b in zip(first, built[0], strict=True))  # type: ignore[call-overload]


def test_a_model_folder_of_the_users_own_gets_no_calibration_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Only a conversion in the cache (its marker beside the weights) keeps a calibration: a
    folder the user pointed at is never written into."""
    from types import SimpleNamespace

    from origin.engine import calibration
    from origin.engine.linear import quantize_per_channel_int8
    from origin.model_folder import ModelFolder

    mine = SimpleNamespace(name_or_path=str(tmp_path))
    folder = ModelFolder.of(mine)
    assert calibration._cache_key(mine, folder, quantize_per_channel_int8) is None  # type: ignore[arg-type]
