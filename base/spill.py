"""The local folder request logs wait in while the store refuses them, and their shipping.

Files keep their store path (``logs/dt=YYYY-MM-DD/<name>.parquet``) under the folder, so shipping
one is a put of its bytes at its relative path. The folder is bounded (``max_bytes``). A file
being shipped is first claimed by an atomic rename (``.shipping``), so two writers sharing the
folder never ship it twice; a claim left by a process that died is released after ten minutes.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from base.store import Store

log = logging.getLogger(__name__)

_SHIPPING = ".shipping"
_STALE_CLAIM_S = 600.0
_FILES = "logs/dt=*/*.parquet"


class SpillFolder:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.rows_spilled = 0
        self.rows_shipped = 0
        self._lock = threading.Lock()
        self.bytes = self._recover()

    def _recover(self) -> int:
        """Bytes already waiting (a predecessor's); stale claims released."""
        for claimed in self.root.glob(_FILES + _SHIPPING):
            with contextlib.suppress(OSError):
                if time.time() - claimed.stat().st_mtime > _STALE_CLAIM_S:
                    claimed.rename(claimed.with_name(claimed.name.removesuffix(_SHIPPING)))
        total = 0
        for path in self.root.glob(_FILES):
            with contextlib.suppress(OSError):
                total += path.stat().st_size
        return total

    def put(self, path: str, data: bytes, rows: int) -> bool:
        """Keep one file of ``rows`` rows; False when it does not fit or cannot be written."""
        if self.bytes + len(data) > self.max_bytes:
            return False
        target = self.root / path
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            temp = target.with_name(f".{target.name}.tmp")
            temp.write_bytes(data)
            temp.rename(target)
        except OSError:
            log.warning("could not spill request logs to %s", target, exc_info=True)
            return False
        with self._lock:
            self.bytes += len(data)
            self.rows_spilled += rows
        return True

    def ship(self, store: Store) -> int:
        """Move the files to ``store``, oldest first; stops at the first failure (raised).
        Returns the number of rows shipped."""
        import pyarrow.parquet as pq

        if self.bytes <= 0:
            return 0
        shipped = 0
        for local in sorted(self.root.glob(_FILES)):
            claimed = local.with_name(local.name + _SHIPPING)
            try:
                local.rename(claimed)
            except OSError:  # another writer claimed it
                continue
            try:
                data = claimed.read_bytes()
                rows = pq.read_metadata(io.BytesIO(data)).num_rows
                store.put(local.relative_to(self.root).as_posix(), data)
            except BaseException:
                claimed.rename(local)
                raise
            claimed.unlink()
            with self._lock:
                self.bytes -= len(data)
                self.rows_shipped += rows
            shipped += rows
        if shipped:
            log.info("shipped %d spilled request-log rows to the store", shipped)
        return shipped
