"""A release checked where it is served, before a pointer names it: every file against the
manifest, the key index against the answers root and the rows, every answer object present,
and objects read back (a sample, or all of them) against their digests.

The requests it makes grow with the release's files, not its answers: the rows are read once (a
column a batch at a time, never held), the key index's buckets once each, and every object's
presence is one listing of its folder (a request per 1,000 objects, ``concurrency`` folders at
once) rather than a request per object. Objects are read back in bulk (``Store.get_many``): a
sample by default (every reader checks each object it serves against its digest, so one that
does not match is a miss, never a wrong answer), all of them when asked.
"""

from __future__ import annotations

import hashlib
import json
import random
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from base.answer_objects import (
    KEY_DIGITS,
    MAX_BUCKET_BYTES,
    answer_object_problem,
    bucket_leaf,
    bucket_path,
    bucket_problem,
)
from base.manifest import Manifest, ShardEntry
from base.proofs import MerkleTree
from base.release import (
    MAX_ANSWER_OBJECT_BYTES,
    ReleaseError,
    _checked,
    _checked_file,
    _checked_index,
    _label,
    release_prefix,
    verified_manifest,
)
from base.store import ObjectNotFoundError, ObjectTooLargeError, StoreError, bounded_map
from base.store_base import Store

READBACK = 1024  # answer objects read back by default, chosen at random (None: every one)
_MOD = 1 << 256


def check_release(
    store: Store,
    profile: str,
    version: str,
    expected_manifest_sha256: str,
    public_keys: Iterable[str] = (),
    readback: int | None = READBACK,
) -> Manifest:
    """``ReleaseError`` naming what does not verify; the manifest when everything does: the
    signature (given ``public_keys``), every shard (its index parsed from a private temporary
    file, its rows a column a batch at a time), the embedder's files, the digests file, every
    bucket of the key index (its proof leads to the answers root; together they list exactly
    the rows' keys and objects), every object present, and ``readback`` objects (None: all)
    read back and checked."""
    manifest, _ = verified_manifest(store, profile, version, expected_manifest_sha256, public_keys)
    prefix = release_prefix(profile, manifest.version)
    rows, named = _Fold(), _Fold()  # the rows' (key, object) pairs; the objects they name
    sample: list[tuple[str, str]] = []
    chooser = random.Random(manifest.version)
    for entry in manifest.shards:
        for pair in _shard_pairs(store, prefix, entry):
            rows.add(pair)
            named.add(("", pair[1]))
            if readback is None or len(sample) < readback:
                sample.append(pair)
            elif (at := chooser.randrange(rows.count)) < readback:
                sample[at] = pair  # a uniform sample of every row so far (reservoir)
            if readback is None and len(sample) >= 8192:
                _read_back(store, profile, sample)
                sample = []
    for file in manifest.embedder.files:
        _checked(store, prefix, file)
    if rows.count != manifest.counts.rows or rows.count != manifest.objects.count:
        raise ReleaseError(f"{prefix}: the shards hold {rows.count} rows, not as the manifest says")
    index = _check_index(store, profile, manifest)
    if (index.count, index.total) != (rows.count, rows.total):
        raise ReleaseError(f"{prefix}: the key index does not list the rows' keys and objects")
    _check_present(store, profile, prefix, manifest, named)
    _read_back(store, profile, sample)
    return manifest


class _Fold:
    """An order-free digest of (key, object sha256) pairs: their count and the sum of their
    SHA-256s modulo 2^256, so the rows (in release order) and the key index (in key order) are
    compared without sorting or holding either."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0

    def add(self, pair: tuple[str, str]) -> None:
        self.count += 1
        digest = hashlib.sha256(f"{pair[0]} {pair[1]}".encode()).digest()
        self.total = (self.total + int.from_bytes(digest, "big")) % _MOD


def _shard_pairs(store: Store, prefix: str, entry: ShardEntry) -> Iterator[tuple[str, str]]:
    """Shard ``entry`` checked (its files against the manifest, its index against its rows,
    every column decoded) and its rows' (key, object sha256), a batch at a time: neither the
    index nor the rows are held (a 471,859-row shard decoded whole was +460 MB)."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="edgeqa-shard-") as folder:
        local = Path(folder) / "rows.parquet"
        try:
            count = _checked_index(store, prefix, entry.index, mapped=True).ntotal
            _checked_file(store, prefix, entry.rows, local)
            with pq.ParquetFile(local) as rows:
                for name in rows.schema_arrow.names:  # each decodes, however many rows it has
                    decoded = sum(
                        b.num_rows
                        for b in rows.iter_batches(8192, columns=[name], use_threads=False)
                    )
                    if decoded != count or decoded != entry.count:
                        raise ReleaseError(
                            f"{prefix}: shard {_label(entry)} index and rows disagree"
                        )
                for batch in rows.iter_batches(
                    8192, columns=["key", "object_sha256"], use_threads=False
                ):
                    yield from zip(*(c.to_pylist() for c in batch.columns), strict=True)
        except (RuntimeError, OSError, ValueError, KeyError) as error:  # faiss / arrow refusing
            if isinstance(error, ReleaseError | StoreError):
                raise
            raise ReleaseError(f"{prefix}: shard {_label(entry)} does not parse: {error}") from None


def _check_index(store: Store, profile: str, manifest: Manifest) -> _Fold:
    """Every bucket of the key index read (``concurrency`` at a time) and checked: its fields,
    its entries sorted, unique and under its name; their leaves, in order, give the answers
    root. What they list, folded."""
    prefix = release_prefix(profile, manifest.version)
    objects = manifest.objects
    if objects.key_digits != KEY_DIGITS or objects.index != "k/":
        raise ReleaseError(
            f"{prefix}: a key index of {objects.key_digits} digits under {objects.index!r}"
        )
    names = [path.rsplit("/", 1)[-1] for path in store.list(f"{prefix}/k")]
    buckets = sorted(name.removesuffix(".json") for name in names)
    if len(buckets) != objects.buckets:
        raise ReleaseError(f"{prefix}: {len(buckets)} buckets in k/, not {objects.buckets}")
    fold = _Fold()
    leaves = []
    paths = (f"{prefix}/{bucket_path(b)}" for b in buckets)
    for bucket, (path, data) in zip(buckets, store.get_many(paths, MAX_BUCKET_BYTES), strict=True):
        if isinstance(data, ObjectNotFoundError | ObjectTooLargeError):
            raise ReleaseError(f"{path}: {data}")
        if isinstance(data, StoreError):
            raise data  # the store failed, not the release: the stage is retried, not refused
        try:
            found = json.loads(data)
        except ValueError:
            found = None
        problem = bucket_problem(found, bucket, profile, manifest.version, None)
        if problem is not None:
            raise ReleaseError(f"{path}: {problem}")
        assert isinstance(found, dict)
        entries = found["entries"]
        last = ""
        for line in entries.splitlines():
            key, _, digest = line.partition(" ")
            if not key.startswith(bucket) or key <= last or len(digest) != 64:
                raise ReleaseError(f"{path}: an entry out of order or out of place: {line[:80]!r}")
            fold.add((key, digest))
            last = key
        leaves.append(bucket_leaf(profile, manifest.version, bucket, entries))
    if MerkleTree(leaves).root != manifest.answers_root:
        raise ReleaseError(f"{prefix}: the key index does not lead to the answers root")
    return fold


def read_digests(local: Path) -> np.ndarray:
    """A digests file's ``sha256`` column, one row of 32 bytes each (not checked)."""
    import pyarrow.parquet as pq

    column = pq.read_table(local, use_threads=False).column("sha256").combine_chunks()
    if column.type.byte_width != 32 or column.null_count:
        raise ValueError(f"sha256 is {column.type}")
    return np.frombuffer(column.buffers()[1], np.uint8)[
        column.offset * 32 : (column.offset + len(column)) * 32
    ].reshape(-1, 32)


def load_digests(store: Store, prefix: str, manifest: Manifest) -> np.ndarray:
    """The digests the release at ``prefix`` names (``objects/digests.parquet``, checked against
    the manifest, sorted and unique), one row of 32 bytes each (32 MB a million)."""
    if manifest.objects.digests is None:
        raise ReleaseError(f"{prefix}: a format-{manifest.format} release names no digests")
    with tempfile.TemporaryDirectory(prefix="edgeqa-digests-") as folder:
        local = Path(folder) / "digests.parquet"
        _checked_file(store, prefix, manifest.objects.digests, local)
        try:
            found = read_digests(local)
        except (OSError, ValueError, KeyError, AttributeError) as error:
            raise ReleaseError(f"{prefix}: objects/digests.parquet: {error}") from None
    keys = found.view("S32").ravel()
    if len(found) != manifest.objects.count or not bool(np.all(keys[1:] > keys[:-1])):
        raise ReleaseError(f"{prefix}: objects/digests.parquet: not the digests, sorted")
    return found


def digest_folders(digests: np.ndarray) -> Iterator[tuple[str, list[str]]]:
    """(``<2 hex>``, the hex digests in that folder of ``a/``) for each folder the sorted
    ``digests`` use, one folder's strings made at a time."""
    bounds = np.searchsorted(digests[:, 0], np.arange(257))
    for first in range(256):
        low, high = int(bounds[first]), int(bounds[first + 1])
        if low < high:
            text = digests[low:high].tobytes().hex()
            yield f"{first:02x}", [text[i : i + 64] for i in range(0, len(text), 64)]


def _check_present(
    store: Store, profile: str, prefix: str, manifest: Manifest, named: _Fold
) -> None:
    """The digests file names exactly the objects the rows name (``named``: what prune keeps
    rests on it), and every one of them is in the store: a listing of each of its folders
    (``a/<2 hex>/``), ``concurrency`` folders at once."""

    def missing(item: tuple[str, list[str]]) -> str | None:
        folder, wanted = item
        found = {p.rsplit("/", 1)[-1] for p in store.list(f"{profile}/a/{folder}")}
        lost = next((d for d in wanted if f"{d}.json" not in found), None)
        return None if lost is None else f"{profile}/a/{folder}/{lost}.json"

    digests = load_digests(store, prefix, manifest)
    listed = _Fold()
    for _, texts in digest_folders(digests):
        for text in texts:
            listed.add(("", text))
    if (listed.count, listed.total) != (named.count, named.total):
        raise ReleaseError(f"{prefix}: objects/digests.parquet does not name the rows' objects")
    folders = digest_folders(digests)
    for lost in bounded_map(missing, folders, store.concurrency, ahead=1):
        if lost is not None:
            raise ReleaseError(f"{prefix}: answer object {lost} is missing")


def _read_back(store: Store, profile: str, pairs: list[tuple[str, str]]) -> None:
    """Each (key, sha256)'s object read and checked as a client checks it (its digest, key and
    profile; an expired one still counts as whole)."""
    from base.answer_objects import object_path

    paths = (f"{profile}/{object_path(digest)}" for _, digest in pairs)
    fetched = store.get_many(paths, MAX_ANSWER_OBJECT_BYTES)
    for (key, digest), (path, data) in zip(pairs, fetched, strict=True):
        if isinstance(data, ObjectNotFoundError | ObjectTooLargeError):
            raise ReleaseError(f"answer object {path}: {data}")
        if isinstance(data, StoreError):
            raise data
        problem = answer_object_problem(data, key, profile, digest, now_s=float("-inf"))
        if problem is not None:
            raise ReleaseError(f"answer object {path}: {problem}")
