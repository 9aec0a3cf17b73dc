"""A run's work area in the output store: what one stage leaves for the next.

    <profile>/work/<run>/hot.json              the mined questions (mine)
    <profile>/work/<run>/clusters.json         a row per cluster that reached k: askers, wordings
                                               published and held back, and why (mine)
    <profile>/work/<run>/profile.json          what the answers depend on (mine)
    <profile>/work/<run>/reused.parquet        the parent release's answers taken as they are (mine)
    <profile>/work/<run>/gen/<nnnnn>.parquet   one generated partition each (generate)
    <profile>/work/<run>/attempts/<nnnnn>-<worker>-<t>.json
                                               a worker started generating it (generate)
    <profile>/work/<run>/release/...           the built release, staged (build)

``run`` is a digest of the profile, the mined questions and the parent release, so the same input
always maps to the same work area: a rerun (an Airflow retry, the same night again before it is
published) finds what is done and reuses it.
Stages may run on different machines; the store is all they share.
"""

from __future__ import annotations

import io
import json
import re
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from base.errors import EdgeQAError
from base.manifest import Manifest
from base.store import Store, parquet_table

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class WorkArea:
    store: Store
    profile: str
    run: str

    @property
    def prefix(self) -> str:
        return work_prefix(self.profile, self.run)

    @property
    def release(self) -> str:
        """Where the built release is staged before it is published."""
        return f"{self.prefix}/release"

    @property
    def reused(self) -> str:
        """The parent release's answers this run takes instead of generating (``answer_schema``)."""
        return f"{self.prefix}/reused.parquet"

    def partition(self, index: int) -> str:
        return f"{self.prefix}/gen/{index:05d}.parquet"

    def attempt(self, index: int, worker: str) -> None:
        """Record that ``worker`` (``host:pid``) starts generating partition ``index``."""
        started = time.time()
        name = re.sub(r"[^A-Za-z0-9.-]+", "-", worker)
        record = {"partition": index, "worker": worker, "started": started}
        self.put_json(f"attempts/{index:05d}-{name}-{started:.6f}.json", record)

    def attempts(self) -> dict[int, list[dict[str, Any]]]:
        """Every recorded attempt, by partition (``attempt``)."""
        found: dict[int, list[dict[str, Any]]] = {}
        for path in self.store.list(f"{self.prefix}/attempts"):
            record = json.loads(self.store.get(path))
            found.setdefault(int(record["partition"]), []).append(record)
        return found

    def attempted(self) -> list[int]:
        """The partition of every recorded attempt, from the objects' names (one listing)."""
        return [
            int(path.rsplit("/", 1)[-1].split("-", 1)[0])
            for path in self.store.list(f"{self.prefix}/attempts")
        ]

    def put_json(self, name: str, value: Any) -> None:
        self.store.put(f"{self.prefix}/{name}", json.dumps(value, sort_keys=True).encode())

    def put_json_list(self, name: str, items: Iterable[Any]) -> None:
        """``put_json(name, list(items))``, the same bytes, written an item at a time through a
        private temporary file: a million log rows' ``hot.json`` is 180 MB of JSON, which as
        one string (and its dicts) held three times that."""
        with tempfile.TemporaryDirectory(prefix="edgeqa-work-") as tmp:
            local = Path(tmp) / "list.json"
            with local.open("wb") as f:
                f.write(b"[")
                for i, item in enumerate(items):
                    f.write(b", " if i else b"")
                    f.write(json.dumps(item, sort_keys=True).encode())
                f.write(b"]")
            self.store.put_file(f"{self.prefix}/{name}", local)

    def get_json(self, name: str) -> Any:
        return json.loads(self.store.get(f"{self.prefix}/{name}"))

    def put_table(self, path: str, table: pa.Table) -> None:
        import pyarrow.parquet as pq

        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        self.store.put(path, buffer.getvalue())

    def get_table(self, path: str) -> pa.Table:
        """Raises ``ObjectNotFoundError`` when ``path`` is not there."""

        return parquet_table(self.store.get(path))

    def stage_release(self, folder: Path) -> None:
        """Upload a built release folder to ``release/`` (replacing what was there)."""
        self.store.delete_prefix(self.release)
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                self.store.put_file(f"{self.release}/{path.relative_to(folder).as_posix()}", path)

    def staged_manifest(self) -> Manifest:
        return Manifest.from_json(self.store.get(f"{self.release}/manifest.json"))

    def staged_empty_answers(self, manifest: Manifest) -> int:
        """Rows of the staged release (``manifest``) whose answer is empty."""
        empty = 0
        for shard in manifest.shards:
            table = self.get_table(f"{self.release}/{shard.rows.path}")
            empty += sum(1 for a in table.column("answer").to_pylist() if not (a or "").strip())
        return empty

    @contextmanager
    def staged_release_folder(self) -> Iterator[Path]:
        """The staged release downloaded into a temporary folder (for ``publish``)."""
        prefix = f"{self.release}/"
        with tempfile.TemporaryDirectory(prefix="edgeqa-publish-") as tmp:
            for path in self.store.list(prefix):
                target = Path(tmp) / path[len(prefix) :]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(self.store.get(path))
            yield Path(tmp)


def work_prefix(profile: str, run: str) -> str:
    return f"{profile}/work/{run}"


# a run as the stages after mine are handed it on a command line: ``<profile>/<run>``
_RUN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,127})/([0-9a-f]{8,64})")


def parse_run(text: str) -> tuple[str, str]:
    """``(profile, run)`` of ``<profile>/<run>`` (what ``edgeqa precompute stage --run`` takes);
    ``EdgeQAError`` for anything else (a path that would leave the profile's work area)."""
    found = _RUN.fullmatch(text or "")
    if not found or ".." in found.group(1):
        raise EdgeQAError(f"{text!r} is not a run: <profile>/<run>, as the mine stage printed it")
    return found.group(1), found.group(2)
