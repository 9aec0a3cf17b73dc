"""Factories for engine tests: tiny random Llama-family models and real-model engines."""

from __future__ import annotations

import pytest
import torch

from origin.engine import Engine, EngineConfig
from origin.engine.scheduler import SchedulerOutput


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
