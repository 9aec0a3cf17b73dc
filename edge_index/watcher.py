"""The served release and the poller that replaces it: what the edge service and the origin's
tiers both answer from.

A background thread polls ``<profile>/current.json`` every ``poll_s`` seconds. A new release is
loaded and verified (every sha256) beside the serving one, warmed up, and swapped in by one
reference assignment, so no lookup fails or waits during a swap; a corrupt release is refused,
counted (``ReleaseMetrics``, exported by whichever service owns the watcher) and logged, and the
previous one keeps serving. Only an integrity failure refuses a release (until the pointer
changes); a store that fails (throttling, an outage, a lost connection) is retried with backoff,
and ``health()`` says why nothing is served yet instead of looking dead.
"""

from __future__ import annotations

import gc
import logging
import tempfile
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from edge_index.errors import EdgeQAError
from edge_index.lookup import ReleaseIndex
from edge_index.release import LoadedRelease, load_release, read_pointer, verified_manifest
from edge_index.store import Store, StoreError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)


class NoProfileError(EdgeQAError, ValueError):
    """The store holds no profile yet, or several and none was named."""


EDGE_METRICS = "edgeqa_edge_release"  # the edge service's names
ORIGIN_METRICS = "edgeqa_origin_release"  # the origin's


class ReleaseMetrics:
    """The served release, and loads by result (``ok``, ``refused``, ``retry``), under
    ``<prefix>_*``, in a registry of their own that the owning service registers in its
    ``/metrics`` registry."""

    def __init__(self, prefix: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = registry = CollectorRegistry()
        self.info = Gauge(
            f"{prefix}_info", "The release being served (value 1)", ["version"], registry=registry
        )
        self.age = Gauge(
            f"{prefix}_age_seconds", "Seconds since the served release was built", registry=registry
        )
        self.entries = Gauge(
            f"{prefix}_entries", "Phrasings in the served release", registry=registry
        )
        self.semantic = Gauge(
            f"{prefix}_semantic_enabled",
            "1 when the served release's semantic tier serves (its calibration reached the "
            "target), 0 when it answers exact hits only",
            registry=registry,
        )
        self.loads = Counter(
            f"{prefix}_loads",
            "Release loads by result (ok, refused, retry)",
            ["result"],
            registry=registry,
        )
        for result in ("ok", "refused", "retry"):
            self.loads.labels(result)


class ReleaseWatcher:
    def __init__(
        self,
        store: Store,
        profile: str | None,
        embedder: SentenceTransformer,
        poll_s: float = 30.0,
        *,
        metrics_prefix: str,
        warm_up: int = 64,
        public_keys: tuple[str, ...] = (),
    ) -> None:
        """``metrics_prefix``: the names the owning service exports the release metrics under
        (``EDGE_METRICS``, ``ORIGIN_METRICS``); ``public_keys``: a release must be signed by one
        of them (``signing.py``), or is refused; () = signatures are not checked."""
        self.store = store
        self.public_keys = public_keys
        self.profile = profile or None  # None: the store's only profile, once one is published
        self.embedder = embedder
        self.poll_s = poll_s
        self.warm_up = warm_up  # semantic lookups run on a new release before it serves
        self.metrics = ReleaseMetrics(metrics_prefix)
        self.index: ReleaseIndex | None = None
        self.manifest_sha256: str | None = None
        self._refused: str | None = None  # manifest sha of a refused release: not retried
        self.failures = 0  # store failures in a row (retried with backoff)
        self.store_error: str | None = None  # the last store failure, while failing
        self.refusal: str | None = None  # why the pointer's release was refused
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._refresh_lock = threading.Lock()
        # called with the revoked phrasings' keys as soon as a release lists them (the origin
        # drops them from its online cache)
        self.on_revoked: Callable[[frozenset[str]], None] | None = None

    @property
    def version(self) -> str | None:
        index = self.index
        return index.version if index is not None else None

    def refresh(self) -> bool:
        """Load the pointer's release if it is new; True when a new one is now served."""
        with self._refresh_lock:
            if self.profile is None:
                try:
                    self.profile = resolve_profile(self.store, None)
                except NoProfileError as error:
                    log.info("%s", error)
                    return False
            pointer, _ = read_pointer(self.store, self.profile)
            if pointer is None:
                self.failures, self.store_error = 0, None
                return False
            # what the pointer names (a pointer without a manifest hash is refused, once)
            wanted = pointer.get("manifest_sha256") or f"version {pointer.get('version')}"
            if wanted in (self.manifest_sha256, self._refused):
                self.failures, self.store_error = 0, None  # the store answered; nothing new
                return False
            self._revoke_early(pointer)
            try:
                index = load_index(self.store, self.profile, self.embedder, self.public_keys)
            except StoreError as error:  # the store failed (throttling, an outage): try again
                self._failed(error)
                self.metrics.loads.labels("retry").inc()
                return False
            except Exception as error:  # the release itself is bad (or cannot be used here)
                self._refused = wanted
                self.refusal = f"release {pointer.get('version')}: {error}"
                self.metrics.loads.labels("refused").inc()
                log.error("refusing %s; still serving %s", self.refusal, self.version or "nothing")
                return False
            self.failures, self.store_error, self.refusal = 0, None, None
            self._serve(index, index.release.manifest_sha256)
            return True

    def _revoke_early(self, pointer: dict[str, object]) -> None:
        """Before a new release is loaded (seconds to minutes for a large one), apply the
        revocations its verified manifest lists to the release still served: a revoked answer
        stops within one poll. Any failure is left to the load that follows."""
        try:
            version, sha = pointer.get("version"), pointer.get("manifest_sha256")
            if not isinstance(version, str) or not isinstance(sha, str):
                return  # the load refuses it
            manifest, _ = verified_manifest(
                self.store, str(self.profile), version, sha, self.public_keys
            )
            keys = frozenset(manifest.get("revoked", {}).get("keys", ()))
        except Exception:
            return
        index = self.index
        if keys and index is not None and not keys <= index.revoked:
            index.revoke(keys)
            if self.on_revoked is not None:
                self.on_revoked(keys)
            log.info("%d revoked phrasings no longer served", len(keys))

    def _failed(self, error: Exception) -> None:
        self.failures += 1
        self.store_error = str(error)
        log.warning(
            "could not load the release of %s (%s); retrying in %.1f s, still serving %s",
            self.profile,
            error,
            self.next_poll_s(),
            self.version or "nothing",
        )

    def next_poll_s(self) -> float:
        """``poll_s``; sooner after store failures (1, 2, 4 ... seconds, up to ``poll_s``)."""
        if not self.failures:
            return self.poll_s
        return min(self.poll_s, 2.0 ** min(self.failures - 1, 10))

    def health(self) -> dict[str, object]:
        """``ok`` while a release is served, else ``degraded`` (alive, every lookup a miss) with
        the reason: ``no_release`` (nothing published), ``refused`` or ``store_unreachable``."""
        index = self.index
        state: dict[str, object] = {"profile": self.profile}
        if index is not None:
            state.update(
                status="ok",
                version=index.version,
                entries=len(index),
                semantic=index.semantic,
                age_s=round(self.age_s() or 0.0, 1),
            )
        elif self.failures:
            state.update(status="degraded", reason="store_unreachable")
        elif self.refusal is not None:
            state.update(status="degraded", reason="refused")
        else:
            state.update(status="degraded", reason="no_release")
        error = self.store_error or self.refusal
        if error is not None:
            state["error"] = error[:300]
        return state

    def _serve(self, index: ReleaseIndex, manifest_sha256: str) -> None:
        # warm it before it serves: oneDNN kernels, allocator, the index's pages
        for question in index.questions[: self.warm_up]:
            index.lookup_semantic(question)
        old = self.index
        self.index = index  # one reference assignment: lookups in flight keep the old one
        self.manifest_sha256 = manifest_sha256
        self.metrics.loads.labels("ok").inc()
        if old is not None:
            self.metrics.info.remove(old.version)
        self.metrics.info.labels(index.version).set(1)
        self.metrics.entries.set(len(index))
        self.metrics.semantic.set(int(index.semantic))
        if not index.semantic:
            reason = index.manifest.get("threshold", {}).get("semantic_off_reason")
            log.warning("release %s: semantic tier off (%s)", index.version, reason)
        # the release's millions of objects are long-lived: keep them out of GC passes, which
        # would otherwise scan them in the middle of lookups. Unfrozen first: the old release
        # was frozen at its own swap, and its embedder's reference cycles (a shipped, fine-tuned
        # one: ~90 MB) would never be collected
        del old
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        log.info("serving release %s of %s (%d entries)", index.version, self.profile, len(index))
        if self.on_revoked is not None:
            try:
                self.on_revoked(index.revoked)
            except Exception:  # the release serves whatever a listener makes of it
                log.exception("a listener failed on release %s", index.version)

    def age_s(self) -> float | None:
        index = self.index
        if index is None:
            return None
        created = datetime.fromisoformat(index.manifest["created_at"])
        return (datetime.now(UTC) - created).total_seconds()

    def observe_age(self) -> None:
        """Set the age gauge (called at scrape time)."""
        age = self.age_s()
        if age is not None:
            self.metrics.age.set(age)

    def _run(self) -> None:
        while not self._stop.wait(self.next_poll_s()):
            try:
                self.refresh()
            except (StoreError, OSError) as error:  # reading the pointer failed
                self._failed(error)
            except Exception:  # nothing must kill the poller
                log.exception("polling %s failed; will retry", self.profile)

    def start(self) -> None:
        try:
            self.refresh()
        except (StoreError, OSError) as error:
            self._failed(error)
        except Exception:
            log.exception("initial release load failed; polling")
        self._thread = threading.Thread(target=self._run, name="edgeqa-release-poll", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def load_index(
    store: Store,
    profile: str,
    embedder: SentenceTransformer,
    public_keys: tuple[str, ...] = (),
    version: str | None = None,
) -> ReleaseIndex:
    """A release (the pointer's when ``version`` is None), verified and ready for lookups, as
    the edge and the origin serve it (``edgeqa release explain`` uses the same)."""
    release = load_release(store, profile, version, public_keys=public_keys)
    return ReleaseIndex(release, embedder_for(release, embedder))


def embedder_for(release: LoadedRelease, default: SentenceTransformer) -> SentenceTransformer:
    """The release's own embedder when it ships one (fine-tuned), else ``default``, which must
    produce vectors of the release's dimension."""
    from edge_index.embedder import load_embedder

    # the files are read once, at load: the folder goes when the embedder is in memory
    with tempfile.TemporaryDirectory(prefix="edgeqa-embedder-") as scratch:
        folder = release.write_embedder(Path(scratch))
        embedder = load_embedder(str(folder)) if folder else default
    dim = embedder.get_embedding_dimension()
    if dim != release.manifest["embedder"]["dim"]:
        raise ValueError(
            f"the release was embedded with {release.manifest['embedder']['name']!r} "
            f"({release.manifest['embedder']['dim']}-d), the edge's embedder is {dim}-d"
        )
    return embedder


def resolve_profile(store: Store, profile: str | None) -> str:
    """The configured profile, or the store's only one."""
    if profile:
        return profile
    profiles = sorted({p.split("/", 1)[0] for p in store.list() if p.endswith("/current.json")})
    if len(profiles) == 1:
        return profiles[0]
    if not profiles:
        raise NoProfileError(
            f"no release published in {store.uri} yet: set EDGEQA_PROFILE (or --profile) to wait "
            "for one"
        )
    raise NoProfileError(f"{store.uri} holds several profiles {profiles}: set EDGEQA_PROFILE")
