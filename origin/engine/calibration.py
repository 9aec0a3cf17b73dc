"""Activation-aware INT8 calibration (AWQ-style scaling, Lin et al. 2023).

Weight-only INT8 error hurts most on the input channels that carry large activations. Scaling
those weight columns up by ``s`` before quantizing (and the activations down by ``1/s`` at run
time, one elementwise multiply) gives them more of the INT8 grid. For each linear layer ``s`` is
``mean|x|^alpha`` over calibration activations, with ``alpha`` picked from a small grid to
minimise the layer's output error; ``alpha = 0`` (no scaling) is always a candidate.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from filelock import FileLock, Timeout

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from origin.model_folder import ModelFolder

# Varied, generic prompts: only their activation statistics are used.
CALIBRATION_PROMPTS = (
    "What is the capital of France?",
    "Explain how a refrigerator keeps food cold.",
    "Write a short poem about the sea at night.",
    "How do I reset my online banking password?",
    "Give me three tips for a job interview.",
    "What is 17 multiplied by 23?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue?",
    "List the planets of the solar system in order.",
    "My card payment was declined, what should I do?",
    "Write a Python function that reverses a string.",
)

ALPHAS = (0.0, 0.25, 0.5, 0.75)
_MAX_ROWS = 512
# the chosen scales, kept beside a converted model (its ``ModelFolder``): collecting
# the activations and searching the alphas take seconds per engine built (7 s on 2 cores), which
# every INT8 origin start and every nightly actor would spend again on the same weights
CACHE_FILE = "edgeqa-int8-calibration.safetensors"
_METHOD = "awq-weight-error-1"  # bump when what is chosen, or how, changes
# how long an engine build waits for another's calibration of the same weights (seconds: 7 s
# on 2 cores, a minute on one busy thread) before it calibrates itself
_LOCK_TIMEOUT_S = 300.0

Quantize = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def awq_scales(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    weights: Mapping[tuple[int, str], torch.Tensor],
    quantize: Quantize,
    folder: ModelFolder,
) -> dict[tuple[int, str], torch.Tensor | None]:
    """Per linear (``weights``: (layer, name) -> [out, in]), the input-channel scales that
    ``activation_scales`` picks (None: scaling does not help it). A model converted into the
    cache (``folder``: the one it was read from, holding a conversion marker) keeps them beside
    its weights, keyed by its source file, this method, the calibration prompts and the CPU's
    kernels, so the next engine built on the same weights reads them back instead of
    calibrating again."""
    key = _cache_key(model, folder, quantize)
    if not key:
        return _calibrate(model, tokenizer, weights, quantize)
    cached = _read(folder, key, weights)
    if cached is not None:
        return cached
    # engines built at once on the same weights (a machine's Ray actors, origin workers) wait
    # for the first one's scales instead of each calibrating; a folder where no lock can be made
    # (read-only), or a holder stuck past the timeout, only costs the calibration here
    lock = FileLock(str(folder.file(f"{CACHE_FILE}.lock")), _LOCK_TIMEOUT_S)
    try:
        with lock:
            cached = _read(folder, key, weights)
            if cached is not None:
                return cached
            chosen = _calibrate(model, tokenizer, weights, quantize)
            _write(folder, key, chosen)
            return chosen
    except (OSError, Timeout):
        return _calibrate(model, tokenizer, weights, quantize)


def _calibrate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    weights: Mapping[tuple[int, str], torch.Tensor],
    quantize: Quantize,
) -> dict[tuple[int, str], torch.Tensor | None]:
    inputs = collect_linear_inputs(model, tokenizer)
    return {
        name: activation_scales(weight, inputs[name], quantize)[0]
        for name, weight in weights.items()
        if name in inputs
    }


def _cache_key(model: PreTrainedModel, folder: ModelFolder, quantize: Quantize) -> str | None:
    """What the chosen scales depend on, or None for a model not converted into the cache (a
    folder of the user's own: calibrated every time, nothing written into it)."""
    import transformers

    try:
        _, fingerprint = folder.source()
        weights = folder.file("model.safetensors").stat()  # the converted weights, as written
    except (OSError, ValueError, KeyError, TypeError):
        return None
    parts = {
        "method": _METHOD,
        "quantize": f"{quantize.__module__}.{quantize.__qualname__}",
        "weights": [fingerprint, weights.st_size, weights.st_mtime_ns],
        "dtype": str(model.dtype),
        "device": model.device.type,
        # the forward that records the activations is transformers' (``with_forward``), its
        # attention kernel the one this transformers and torch pick
        "transformers": transformers.__version__,
        "prompts": CALIBRATION_PROMPTS,
        "alphas": ALPHAS,
        "rows": _MAX_ROWS,
        # the activations are the forward's: its kernels' rounding differs by ISA and version
        "torch": torch.__version__,
        "isa": torch.backends.cpu.get_cpu_capability(),
        "onednn": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _read(
    folder: ModelFolder, key: str, weights: Mapping[tuple[int, str], torch.Tensor]
) -> dict[tuple[int, str], torch.Tensor | None] | None:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(folder.file(CACHE_FILE)), "pt") as f:
            meta = f.metadata() or {}
            if meta.get("key") != key:
                return None
            names = {f"{i}.{n}" for i, n in weights}
            if set(json.loads(meta["linears"])) != names:
                return None
            stored = set(f.keys())
            scales: dict[tuple[int, str], torch.Tensor | None] = {}
            for i, n in weights:
                name = f"{i}.{n}"
                value = f.get_tensor(name) if name in stored else None
                if value is not None and not _usable(value, weights[(i, n)].shape[1]):
                    return None
                scales[(i, n)] = value
            return scales
    except (OSError, SafetensorError, ValueError, KeyError, TypeError):
        return None


def _usable(scales: torch.Tensor, in_features: int) -> bool:
    """Scales a runner can divide by: one per input channel, finite and positive."""
    return (
        scales.dtype == torch.float32
        and scales.shape == (in_features,)
        and bool(torch.isfinite(scales).all())
        and bool((scales > 0).all())
    )


def _write(
    folder: ModelFolder, key: str, scales: Mapping[tuple[int, str], torch.Tensor | None]
) -> None:
    from origin.model_folder import keep_beside

    tensors = {f"{i}.{n}": s.float().contiguous() for (i, n), s in scales.items() if s is not None}
    meta = {"key": key, "linears": json.dumps(sorted(f"{i}.{n}" for i, n in scales))}
    keep_beside(folder.file(CACHE_FILE), tensors, meta, "the INT8 calibration")


def collect_linear_inputs(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, answer_tokens: int = 0
) -> dict[tuple[int, str], torch.Tensor]:
    """Inputs ([rows, in_features], fp32) of q_proj, o_proj, gate_proj and down_proj per layer,
    over the calibration prompts (and, with ``answer_tokens``, the model's greedy answers)."""
    from origin.chat import encode_chat
    from origin.lean_model import with_forward

    model = with_forward(model)
    captured: dict[tuple[int, str], list[torch.Tensor]] = {}
    handles = []
    layers: Any = model.model.layers  # type: ignore[union-attr]
    for index, layer in enumerate(layers):
        modules = {
            "qkv": layer.self_attn.q_proj,
            "o": layer.self_attn.o_proj,
            "gate_up": layer.mlp.gate_proj,
            "down": layer.mlp.down_proj,
        }
        for name, module in modules.items():
            handles.append(module.register_forward_pre_hook(_recorder(captured, (index, name))))
    try:
        with torch.inference_mode():
            for prompt in CALIBRATION_PROMPTS:
                ids = encode_chat(tokenizer, [{"role": "user", "content": prompt}])
                tensor = torch.tensor([ids], device=model.device)
                if answer_tokens > 0:
                    tensor = model.generate(  # type: ignore[operator]
                        tensor,
                        max_new_tokens=answer_tokens,
                        do_sample=False,
                        pad_token_id=tokenizer.pad_token_id or 0,
                    )
                model(input_ids=tensor)  # one pass over prompt + answer, recorded by the hooks
    finally:
        for handle in handles:
            handle.remove()
    result = {}
    for key, chunks in captured.items():
        rows = torch.cat(chunks)
        if rows.shape[0] > _MAX_ROWS:
            pick = torch.randperm(rows.shape[0], generator=torch.Generator().manual_seed(0))
            rows = rows[pick[:_MAX_ROWS]]
        result[key] = rows
    return result


def _recorder(
    store: dict[tuple[int, str], list[torch.Tensor]], key: tuple[int, str]
) -> Callable[..., None]:
    def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        x = args[0]
        if x.dim() == 3 and x.shape[1] > 1:  # full-sequence passes only, not generate's decode
            store.setdefault(key, []).append(x.reshape(-1, x.shape[-1]).float().cpu())

    return hook


def activation_scales(
    weight: torch.Tensor,
    inputs: torch.Tensor,
    quantize: Quantize,
    alphas: Sequence[float] = ALPHAS,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """The per-input-channel scales ``s`` ([in], or None for none) that minimise
    ||Q(W s)(x / s) - W x||, with the winner's ``quantize(W s)`` (INT8 weights, channel scales)."""
    w = weight.float().cpu()
    x = inputs.float()
    mean_abs = x.abs().mean(dim=0).clamp(min=1e-5)
    best: tuple[float, torch.Tensor | None, torch.Tensor, torch.Tensor] | None = None
    for alpha in alphas:
        scales = mean_abs.pow(alpha)
        scales = scales / (scales.max() * scales.min()).sqrt()
        scaled = w * scales[None, :]
        q, channel = quantize(scaled)
        # Q(W s)(x / s) - W x = (x / s)(Q(W s) - W s): the error with one GEMM
        residual = (q.float() * channel[:, None]).sub_(scaled)
        error = float(((x / scales) @ residual.T).pow_(2).mean())
        if best is None or error < best[0]:
            best = (error, None if alpha == 0.0 else scales, q, channel)
    assert best is not None
    return best[1], best[2], best[3]
