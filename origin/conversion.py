"""A GGUF file converted once into a safetensors folder under ``<cache_dir>/models/``.

Dequantizing the embedded GGUF takes ~10 s on every load, so the first load converts it and the
next ones read the folder (``origin/model.py``). The folder is named by the GGUF's content
(``converted_dir``) and written under a temporary name, then renamed into place, under a file
lock: a reader only ever sees a complete conversion; an interrupted or concurrent conversion
leaves either nothing or a whole folder, and a folder that later fails to load is moved aside
(``discard``) and converted again. Its marker (``origin/model_folder.py``) names the source file.

The conversion parses the GGUF once, from memory, by patching the ``gguf`` module for the length
of the conversion alone (``_gguf_parsed_once``), one conversion of the process at a time.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from origin.model_folder import MARKER, gguf_fingerprint

log = logging.getLogger(__name__)

_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer_config.json", MARKER)
_LOCK_TIMEOUT_S = 900.0


def converted_dir(gguf_path: Path, cache_dir: Path) -> Path:
    """Where ``gguf_path``'s conversion is kept in ``cache_dir``: named by its content."""
    stem = gguf_path.name.removesuffix(".gguf").lower()
    return cache_dir / "models" / f"{stem}-{gguf_fingerprint(gguf_path)}"


def is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in _REQUIRED_FILES)


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
                discard(final)
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


def discard(folder: Path) -> None:
    """Move a broken folder out of the way first, so its name is free at once."""
    if not folder.exists():
        return
    trash = folder.with_name(f".trash-{os.getpid()}-{time.time_ns()}-{folder.name}")
    try:
        os.rename(folder, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


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


# one conversion of the process patches ``gguf`` at a time: two interleaved would each restore
# what the other had patched, leaving it patched after both
_GGUF_PATCH = threading.Lock()


@contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """transformers reads a GGUF file three times (tokenizer, config, weights), each a slow parse
    of every metadata field, and rebuilds gguf's tensor-name table once per module: within this
    block the parse and the table are made once (the same objects; both are read-only), and the
    file is parsed from memory rather than through ``np.memmap``, whose Python-level indexing
    took a third of the conversion (the tokenizer's 100,000 strings are read a few bytes at a
    time: 15.2 s -> 10.0 s for the embedded model). transformers imports ``gguf.GGUFReader`` and
    ``gguf.get_tensor_name_map`` from the module at each call
    (``transformers.modeling_gguf_pytorch_utils``), so the module's own attributes are what is
    replaced, for this block only; nothing is patched at import."""
    import gguf
    import gguf.gguf_reader

    with _GGUF_PATCH:
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
