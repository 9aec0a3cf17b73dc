"""A model's folder as a value: where a loaded model was read from, and the files kept beside it.

A GGUF file converted into the cache (``origin/conversion.py``) is a folder whose marker
(``MARKER``) names its source file and that file's fingerprint. The engine keeps work it would
otherwise redo on every build beside those weights (the INT8 calibration, the packed GGUF blocks:
``origin/engine/calibration.py``, ``gguf_blocks.py``), each under a name and format of its own;
it is handed a ``ModelFolder`` (where the model was read from, what its marker records) and
writes its files with ``keep_beside``, never importing the loader or the conversion.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# the conversion's record, written last into its folder: what it was converted from, and when
MARKER = "edgeqa-conversion.json"


def gguf_fingerprint(gguf_path: Path) -> str:
    """A cheap identity of a GGUF file: its size and its first and last MiB."""
    size = gguf_path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with gguf_path.open("rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read(1 << 20))
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class ModelFolder:
    """The folder a model's weights were read from (``path``); a model from elsewhere (a Hugging
    Face id) has a path where no marker is, and nothing is kept for it."""

    path: Path

    @classmethod
    def of(cls, model: Any) -> ModelFolder:
        """The folder ``model`` was read from: its ``name_or_path``, as transformers and
        ``LeanLlama`` record it."""
        return cls(Path(str(getattr(model, "name_or_path", ""))))

    def file(self, name: str) -> Path:
        return self.path / name

    def source(self) -> tuple[Path, str]:
        """(the GGUF file this folder was converted from, its fingerprint then), as the marker
        records them; OSError, ValueError, KeyError or TypeError for a folder that is not a
        conversion (no marker, or one unreadable)."""
        record = json.loads(self.file(MARKER).read_text())
        return Path(record["source"]), str(record["fingerprint"])


def keep_beside(
    target: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str], what: str
) -> None:
    """Write ``tensors`` (safetensors, with ``metadata``) to ``target`` in a model's folder
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
