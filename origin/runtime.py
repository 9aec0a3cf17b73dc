"""The one place the origin's runtime is assembled from settings: the model, the engine, and (for
the server) the release watcher.

``build_engine(settings)`` is what the origin server, ``edgeqa ask``, the nightly generation and
the demo all call, so an engine is configured the same way wherever it runs; ``load_runtime``
adds what the server needs around it. ``engine_config``
turns settings into the engine's own config; ``"auto"`` quantization is decided here, for the
device the model landed on, and ``"auto"`` dtype (``load_dtype``) for the device it loads on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from origin.config import EngineSettings, OriginSettings
from origin.precision import AUTO, Needs, choose_auto, lookup

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from edge_index.releases import Releases
    from origin.engine import Engine, EngineConfig
    from origin.precision import EngineQuantization

LoadedModel = tuple["PreTrainedModel", "PreTrainedTokenizerBase"]

logger = logging.getLogger(__name__)


def load(settings: EngineSettings) -> LoadedModel:
    """The model and tokenizer the settings name, on their device and dtype (``load_dtype``), as
    an engine reads them (``origin.model.load_engine_model``)."""
    from origin.model import load_engine_model, resolve_device

    device = resolve_device(settings.device)
    dtype = load_dtype(settings, device)
    return load_engine_model(settings.model, device, dtype, settings.cache_dir)


def load_dtype(settings: EngineSettings, device: str) -> str:
    """The dtype ``settings``' weights are loaded in on ``device``: ``EDGEQA_DTYPE``, and for
    ``auto`` on CUDA the one the precision's linears take there (``Precision.cuda_dtype``: bf16;
    fp16 for LLM.int8), so the weights are read in it straight onto the device and never held in
    fp32 on the way (a 7B: 13.5 GB instead of 28); on a CPU ``auto`` stays ``origin.model``'s
    (fp32)."""
    if settings.dtype != "auto" or not device.startswith("cuda"):
        return settings.dtype
    from origin.engine.config import default_quantization

    quantization = settings.quantization
    return lookup(default_quantization(device) if quantization == AUTO else quantization).cuda_dtype


def engine_config(
    settings: EngineSettings, device: str, model: PreTrainedModel | None = None
) -> EngineConfig:
    """The engine's config for ``model`` (when given: ``auto`` weights depend on it) on
    ``device``."""
    from origin.engine import EngineConfig

    quantization = settings.quantization
    return EngineConfig(
        max_num_seqs=settings.max_num_seqs,
        token_budget=max(settings.token_budget, settings.max_num_seqs),
        prefill_chunk=settings.prefill_chunk,
        max_model_len=settings.max_model_len,
        kv_cache_tokens=settings.kv_cache_tokens or None,
        quantization=auto_quantization(device, model, settings.max_model_len)
        if quantization == AUTO
        else quantization,
        batch_invariant=settings.batch_invariant,
        prefix_caching=settings.prefix_caching,
        speculative=None if settings.speculative == "none" else settings.speculative,
        num_speculative_tokens=settings.num_speculative_tokens,
    )


def auto_quantization(
    device: str, model: PreTrainedModel | None, max_len: int
) -> EngineQuantization:
    """``auto``'s weights: the registry's choice for ``device`` (``origin/precision.py``,
    ``choose_auto``), with what each precision needs checked here. On a CPU, a model converted
    from a GGUF file with Q4_1/Q8_0 blocks runs on those blocks when the fixed-order kernels
    that read them load: times 8-bit activations (``gguf-a8``: the origin's tail under load,
    ``benchmarks/peers.py``) where their integer dot products run in SIMD, else ``gguf`` (the
    fp32 model's results at a fifth of the bytes); else the device's default
    (``default_quantization``)."""
    from origin.engine.config import device_meets

    no_kernels: list[str] = []

    def met(need: Needs) -> bool:
        if need not in (Needs.GGUF_BLOCKS, Needs.FAST_A8):
            return device_meets(need, device)
        from origin.engine import kernels

        if need is Needs.FAST_A8:  # what GGUF_BLOCKS says of the kernels is its own warning
            return kernels.unavailable_reason() is None and kernels.a8_path() != "c"
        from origin.engine.gguf_blocks import servable
        from origin.engine.runner import unsupported_reason
        from origin.model_folder import ModelFolder

        if model is None or unsupported_reason(model, max_len) is not None:
            return False
        if not servable(ModelFolder.of(model)):
            return False
        reason = kernels.unavailable_reason()
        if reason is not None:
            no_kernels.append(reason)
        return reason is None

    choice = choose_auto(device, met)
    for reason in dict.fromkeys(no_kernels):  # once, however many choices needed them
        logger.warning(
            "%s. The model's GGUF blocks are read by those kernels alone: serving %s weights "
            "instead (more memory, slower decode)",
            reason,
            "its own unquantized" if choice.name == "none" else choice.name,
        )
    return choice.name


def build_engine(
    settings: EngineSettings, model: LoadedModel | None = None, **engine_options: Any
) -> Engine:
    """An engine (not started) for ``settings``; ``model``: an already loaded (model, tokenizer)
    to reuse; ``engine_options``: passed to ``Engine`` (a custom ``runner``, a ``draft``)."""
    from origin.engine import Engine
    from origin.model_folder import ModelFolder

    weights, tokenizer = model or load(settings)
    config = engine_config(settings, str(weights.device), weights)
    options = {"folder": ModelFolder.of(weights), **engine_options}
    return Engine(weights, tokenizer, config, **options)


@dataclass
class Runtime:
    """What the origin serves with: a started engine, its request defaults, and the release
    watcher when the tiers are on."""

    engine: Engine
    default_max_tokens: int
    default_temperature: float
    releases: Releases | None = None

    def __post_init__(self) -> None:
        from edge_index.releases import Releases
        from edge_index.watcher import ReleaseWatcher

        if isinstance(self.releases, ReleaseWatcher):  # one profile's (a test's, a benchmark's)
            self.releases = Releases.of(self.releases)

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.config.max_model_len


def load_runtime(
    settings: OriginSettings,
    model: LoadedModel | None = None,
) -> Runtime:
    """The origin's runtime: the engine (started), and the release watcher (not started: the
    server starts it once its metrics are registered) when ``origin_tiers`` is on."""
    engine = build_engine(settings, model).start()
    releases = None
    if settings.origin_tiers:
        from edge_index.releases import Releases
        from edge_index.watcher import ORIGIN_METRICS

        releases = Releases.from_settings(settings, ORIGIN_METRICS)
    return Runtime(engine, settings.max_tokens, settings.temperature, releases)
