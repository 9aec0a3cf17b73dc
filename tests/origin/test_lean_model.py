"""An engine's Llama read without transformers' model classes (``origin/lean_model.py``): the same
tensors, tokenizer and tokens as transformers' model, in a process that never imports its
modeling code; any other layout loads through transformers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from origin.lean_model import LeanLlama, lean_config, read_llama, with_forward
from origin.model import load_engine_model, resolve_model_path

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "怎么冻结我的银行卡？"}],
]


@pytest.fixture(scope="module")
def lean(model_cache_dir: Path) -> tuple[Any, Any]:
    model, tokenizer = load_engine_model("embedded", "cpu", cache_dir=model_cache_dir)
    assert isinstance(model, LeanLlama)
    return model, tokenizer


def test_an_engine_process_never_imports_transformers_modeling_code(model_cache_dir: Path) -> None:
    """Importing ``modeling_llama`` and ``AutoTokenizer``'s table cost ~8 s of CPU in every
    process that served (each origin, ``edgeqa ask``, each nightly Ray actor): building and
    running an engine from the settings leaves them unimported."""
    script = (
        "import sys\n"
        "from origin.config import EngineSettings\n"
        "from origin.engine.offline import generate_many\n"
        "from origin.runtime import build_engine\n"
        "from origin.sampling import SamplingParams\n"
        f"env = {{'EDGEQA_CACHE_DIR': {str(model_cache_dir)!r}, 'EDGEQA_DEVICE': 'cpu'}}\n"
        "settings = EngineSettings.from_env(env)\n"
        "engine = build_engine(settings)\n"
        "done = generate_many(engine, ['Say hi.'], SamplingParams(max_tokens=4), progress=False)\n"
        "assert done[0].token_ids, done\n"
        "heavy = ('transformers.models.llama.modeling_llama', 'transformers.modeling_utils',\n"
        "    'transformers.models.auto.modeling_auto',\n"
        "    'transformers.models.auto.tokenization_auto')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_the_lean_model_is_transformers_model_tensor_for_tensor(
    lean: tuple[Any, Any], embedded_model: tuple[Any, Any]
) -> None:
    from transformers import AutoTokenizer

    model, tokenizer = lean
    full, full_tokenizer = embedded_model
    ours, theirs = dict(model.named_parameters()), dict(full.named_parameters())
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as transformers ties
    assert torch.equal(model.model.rotary_emb.inv_freq, full.model.rotary_emb.inv_freq)
    assert model.model.rotary_emb.attention_scaling == full.model.rotary_emb.attention_scaling
    for name in ("num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size"):
        assert getattr(model.config, name) == getattr(full.config, name), name
    assert model.config.rms_norm_eps == full.config.rms_norm_eps
    assert model.generation_config.eos_token_id == full.generation_config.eos_token_id
    assert (model.device, model.dtype, model.name_or_path) == (
        full.device,
        full.dtype,
        full.name_or_path,
    )
    # the tokenizer: the class AutoTokenizer picks, the same ids and chat template
    auto = AutoTokenizer.from_pretrained(model.name_or_path, local_files_only=True)
    texts = ["hello world", "怎么冻结我的银行卡？", " <|im_end|> x", "🍕" * 5]
    for other in (auto, full_tokenizer):
        assert type(tokenizer) is type(other)
        assert tokenizer(texts)["input_ids"] == other(texts)["input_ids"]
        assert tokenizer.chat_template == other.chat_template
        assert tokenizer.eos_token_id == other.eos_token_id


@pytest.mark.parametrize("quantization", ["auto", "int8"])
def test_an_engine_on_the_lean_model_answers_token_for_token(
    lean: tuple[Any, Any], embedded_model: tuple[Any, Any], quantization: str
) -> None:
    from origin.config import EngineSettings
    from origin.engine.offline import generate_many
    from origin.runtime import build_engine
    from origin.sampling import SamplingParams

    settings = EngineSettings.from_env({"EDGEQA_QUANTIZATION": quantization})
    answers = []
    for loaded in (lean, embedded_model):
        engine = build_engine(settings, loaded)
        done = generate_many(engine, PROMPTS, SamplingParams(max_tokens=16), progress=False)
        answers.append([c.token_ids for c in done])
    assert answers[0] == answers[1] and all(answers[0])


def test_what_needs_the_forward_gets_transformers_model(
    lean: tuple[Any, Any], embedded_model: tuple[Any, Any]
) -> None:
    """INT8 calibration records the activations of transformers' forward: a lean model hands
    it transformers' model of the same folder, whose recorded inputs are the same."""
    from origin.engine.calibration import collect_linear_inputs

    model, tokenizer = lean
    with pytest.raises(NotImplementedError):  # no forward of its own: never a silent stand-in
        model(input_ids=torch.tensor([[1, 2]]))
    from transformers import PreTrainedModel

    forward = with_forward(model)  # loaded for the caller, not kept beside the lean weights
    assert isinstance(forward, PreTrainedModel) and forward is not with_forward(model)
    assert forward.name_or_path == model.name_or_path and forward.dtype == model.dtype
    assert not any(isinstance(m, PreTrainedModel) for m in model.modules())
    del forward
    assert with_forward(embedded_model[0]) is embedded_model[0]
    ours = collect_linear_inputs(model, tokenizer)
    theirs = collect_linear_inputs(*embedded_model)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def _no_forward() -> Any:
    raise AssertionError("not asked for")


def _folder(tmp_path: Path, model_cache_dir: Path, **config: Any) -> Path:
    """The embedded conversion's files linked into a folder of the test's (the session's are
    shared by the suite's workers: a file here is replaced, never written through the link),
    ``config`` changed."""
    source = resolve_model_path("embedded", model_cache_dir)
    assert isinstance(source, Path)
    folder = tmp_path / "model"
    shutil.copytree(source, folder, copy_function=os.link)
    raw = json.loads((folder / "config.json").read_text())
    raw.update(config)
    _replace(folder / "config.json", json.dumps(raw).encode())
    return folder


def _replace(path: Path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)


@pytest.mark.parametrize(
    "change",
    [
        {"model_type": "qwen2"},
        {"architectures": ["LlamaForSequenceClassification"]},
        {"hidden_act": "gelu"},
        {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e5, "factor": 8.0}},
        {"rope_scaling": {"type": "linear", "factor": 2.0}},
        {"rope_parameters": {"type": "linear", "factor": 2.0, "rope_theta": 1e5}},
        {"sliding_window": 256},
        {"pretraining_tp": 2},
        {"quantization_config": {"quant_method": "bitsandbytes"}},
        {"num_hidden_layers": None},
    ],
)
def test_any_other_layout_is_not_read_directly(
    change: dict[str, Any], tmp_path: Path, model_cache_dir: Path
) -> None:
    folder = _folder(tmp_path, model_cache_dir, **change)
    assert lean_config(folder) is None and read_llama(folder, torch.float32, _no_forward) is None


def test_weights_other_than_the_config_names_are_not_read_directly(
    tmp_path: Path, model_cache_dir: Path
) -> None:
    """A file holding a tensor the config does not name (or lacking one), or weights split over
    several files: transformers loads it (and says what is wrong with it)."""
    folder = _folder(tmp_path, model_cache_dir, num_hidden_layers=1)
    assert lean_config(folder) is not None
    assert read_llama(folder, torch.float32, _no_forward) is None  # the file holds 30 layers
    # the same names, other shapes than the config gives
    for sizes in ({"intermediate_size": 1024}, {"head_dim": 32}, {"num_key_value_heads": 9}):
        other = _folder(tmp_path / "-".join(sizes), model_cache_dir, **sizes)
        assert lean_config(other) is not None
        assert read_llama(other, torch.float32, _no_forward) is None, sizes
    (folder / "model.safetensors").unlink()
    save_file({"model.embed_tokens.weight": torch.zeros(2, 2)}, str(folder / "model.safetensors"))
    assert read_llama(folder, torch.float32, _no_forward) is None
    (folder / "model.safetensors").unlink()
    assert lean_config(folder) is None


def test_weights_that_do_not_read_go_to_transformers_which_says_why(
    tmp_path: Path, model_cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Truncated weights: the direct read fails and ``load_model`` takes over (in the cache it
    converts again; a folder of the user's is an error naming it)."""
    folder = _folder(tmp_path, model_cache_dir)
    weights = folder / "model.safetensors"
    with weights.open("rb") as whole:
        _replace(weights, whole.read(4096))
    with pytest.raises(Exception) as error:
        load_engine_model(str(folder), "cpu")
    assert "directly failed" in caplog.text and str(folder) in caplog.text
    assert not isinstance(error.value, NotImplementedError | AssertionError)
