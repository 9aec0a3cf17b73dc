"""Factories for engine tests: tiny random Llama-family models and real-model engines."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from origin.engine import Engine, EngineConfig, kernels
from origin.engine.scheduler import SchedulerOutput

ROOT = Path(__file__).resolve().parents[3]
# why the fixed-order kernels cannot run here (None: they can): the tests that need them skip
# with it, as the engine runs without them (on the library kernels) and says so
KERNELS_MISSING = kernels.unavailable_reason()
needs_kernels = pytest.mark.skipif(
    KERNELS_MISSING is not None,
    reason=f"the fixed-order kernels are unavailable: {KERNELS_MISSING}",
)


def tiny_model(model_type: str, **overrides: object):  # type: ignore[no-untyped-def]
    """A randomly initialized causal LM of the given family, small enough for exact checks."""
    from transformers import AutoConfig, AutoModelForCausalLM

    base: dict[str, object] = {
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
    }
    if model_type == "gpt2":
        base = {"vocab_size": 128, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 512}
    base.update(overrides)
    config = AutoConfig.for_model(model_type, **base)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if model_type == "qwen2":
        with torch.no_grad():  # random init leaves biases at zero: make them matter
            for layer in model.model.layers:
                for proj in (
                    layer.self_attn.q_proj,
                    layer.self_attn.k_proj,
                    layer.self_attn.v_proj,
                ):
                    proj.bias.normal_(0, 0.5)
    return model.eval()


def checked(engine: Engine) -> Engine:
    """Assert the scheduler's invariants after every step of ``engine``."""

    def check(out: SchedulerOutput) -> None:
        engine.scheduler.check_invariants(out)

    engine.step_hooks.append(check)
    return engine


@pytest.fixture(scope="session")
def engine_fp32(embedded_model):  # type: ignore[no-untyped-def]
    model, tokenizer = embedded_model
    return checked(Engine(model, tokenizer, EngineConfig(max_num_seqs=4, max_model_len=512)))


def package_copy(dest: Path, library: Path | None = None, name: str | None = None) -> Path:
    """The packages the engine imports (``origin``, ``edge_index``) copied into ``dest`` with
    ``library`` as the kernels' built library (None: none; ``name``: its file name there, by
    default the built one's), so a fresh interpreter can load what a test planted or changed.
    Returns the kernels' folder in the copy."""
    for package in ("origin", "edge_index"):
        shutil.copytree(
            ROOT / package,
            dest / package,
            ignore=shutil.ignore_patterns("__pycache__", "_fixed_order*"),
        )
    folder = dest / "origin" / "engine" / "kernels"
    if library is not None:
        built = kernels.library_path()
        shutil.copy2(library, folder / (name or (built.name if built else "_fixed_order.abi3.so")))
    return folder


def run_python(
    code: str, path: list[Path], cwd: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter importing from ``path`` first, with ``env`` set and no
    other EDGEQA_ variable."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("EDGEQA_")}
    environ.update(env, PYTHONPATH=os.pathsep.join(str(p) for p in path))
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
