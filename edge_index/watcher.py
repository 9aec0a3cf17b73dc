"""The served release and the poller that replaces it: what the edge service and the origin's
tiers both answer from.

A background thread polls ``<profile>/current.json`` every ``poll_s`` seconds. A new release is
loaded and verified (every sha256) beside the serving one, warmed up, and swapped in by one
reference assignment, so no lookup fails or waits during a swap; a corrupt release is refused,
counted (``ReleaseMetrics``, exported by whichever service owns the watcher) and logged, and the
previous one keeps serving. Only an integrity failure refuses a release (until the pointer
changes); a store that fails (throttling, an outage, a lost connection) is retried with backoff,
and ``health()`` says why nothing is served yet instead of looking dead.

With public keys, the pointer's own signature is checked first (``pointers.py``): a pointer older
than one already verified (in memory, or on local disk across restarts) is refused as a rollback
and the served release stays; a served pointer past its expiry keeps serving, reported stale.
With a high-water mark (``EDGEQA_HIGH_WATER_URI``), a watcher that serves nothing yet also
refuses a pointer below it, unsequenced or expired: it serves nothing (``/ready`` 503, reason
``rollback``) until the store's pointer is one it may trust.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from base.languages import DEFAULT_LANGUAGE
from base.pointers import (
    Pointer,
    PointerMemory,
    PointerState,
    RollbackError,
    SignedPointer,
)
from base.release import pointer_path, read_pointer, verified_manifest
from base.signing import SignatureError
from base.store import Store, StoreError
from edge_index.lookup import ReleaseIndex
from edge_index.profiles import NoProfileError, load_index, resolve_profile
from edge_index.release_metrics import EDGE_METRICS, ORIGIN_METRICS, ReleaseMetrics

if TYPE_CHECKING:
    from semantic.embedder import Embedder

log = logging.getLogger(__name__)


__all__ = ["EDGE_METRICS", "ORIGIN_METRICS", "ReleaseMetrics", "ReleaseWatcher"]


class ReleaseWatcher:
    """One profile's served release (see the module's docstring)."""

    def __init__(
        self,
        store: Store,
        profile: str | None,
        embedder: Embedder | Callable[[], Embedder],
        poll_s: float = 30.0,
        *,
        metrics_prefix: str = "",
        metrics: ReleaseMetrics | None = None,
        language: str | None = None,
        candidates: tuple[str, ...] = (),
        embedder_spec: str | None = None,
        warm_up: int = 64,
        public_keys: tuple[str, ...] = (),
        memory: PointerMemory | None = None,
        floor: Callable[[str], int] | None = None,
    ) -> None:
        """``profile``: the profile served; None: found in the store (``resolve_profile``: of
        ``language`` among ``candidates`` when given). ``embedder``: the model, or a function
        that loads it (called once, when the first release is found); ``embedder_spec``: what
        ``EDGEQA_EMBEDDER`` names for it (a release embedded with another is refused).
        ``metrics`` (shared by the watchers of one service) or ``metrics_prefix``: the names
        the owning service exports the release metrics under (``EDGE_METRICS``,
        ``ORIGIN_METRICS``); ``public_keys``: a release and its pointer must be signed by one of
        them (``signing.py``, ``pointers.py``), or are refused; () = signatures are not checked.
        ``memory``: the newest pointers verified (default: in this process only); ``floor``:
        the high-water mark a watcher that serves nothing yet checks (``PointerState``)."""
        self.store = store
        self.public_keys = public_keys
        self.profile = profile or None  # None: found in the store, once one is published
        self.language = language
        self.candidates = candidates
        self.embedder_spec = embedder_spec
        self._embedder = embedder
        self.poll_s = poll_s
        self.warm_up = warm_up  # semantic lookups run on a new release before it serves
        self.label = language or DEFAULT_LANGUAGE  # the metrics' language label
        self.metrics = metrics or ReleaseMetrics(metrics_prefix, (self.label,))
        self.index: ReleaseIndex | None = None
        self.manifest_sha256: str | None = None
        self._refused: str | None = None  # manifest sha of a refused release: not retried
        self.failures = 0  # store failures in a row (retried with backoff)
        self.store_error: str | None = None  # the last store failure, while failing
        self.refusal: str | None = None  # why the pointer's release was refused
        self.pointers = PointerState(public_keys, memory, floor)  # signed, newest, fresh
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

    @property
    def embedder(self) -> Embedder:
        """The query embedder (loaded on first use when given as a loader)."""
        if callable(self._embedder) and not hasattr(self._embedder, "encode"):
            self._embedder = self._embedder()
        return self._embedder  # type: ignore[return-value]

    def refresh(self) -> bool:
        """Load the pointer's release if it is new; True when a new one is now served."""
        with self._refresh_lock:
            if self.profile is None:
                try:
                    self.profile = resolve_profile(self.store, None, self.language, self.candidates)
                except NoProfileError as error:
                    log.info("%s", error)
                    return False
            pointer, _ = read_pointer(self.store, self.profile)
            self.failures, self.store_error = 0, None  # the store answered
            if pointer is None:
                return False
            sha = pointer.manifest_sha256
            # what the pointer names (a pointer without a manifest hash is refused, once)
            wanted = sha or f"version {pointer.version}"
            seen = self.pointers.rollback
            try:
                signed = self.pointers.verify(pointer, self.profile, self._where)
            except RollbackError as error:  # the served release stays, reported stale
                if seen != str(error):
                    self.metrics.loads.labels(self.label, "rollback").inc()
                    log.error("%s; still serving %s", error, self.version or "nothing")
                self.metrics.stale.labels(self.label).set(1)
                return False
            except SignatureError as error:
                if wanted != self._refused:
                    self._refuse(wanted, f"release {pointer.version}: {error}")
                return False
            if signed is not None:
                wanted = f"{wanted}#{signed.sequence}"
            if sha is not None and sha == self.manifest_sha256:
                if signed is not None and signed != self.pointers.served:  # renewed
                    self._remember(signed)
                return False
            if wanted == self._refused:
                return False
            self._revoke_early(pointer)
            try:
                index = load_index(
                    self.store,
                    self.profile,
                    self.embedder,
                    self.public_keys,
                    self.embedder_spec,
                    pointer.version,
                    sha or "",
                )
            except StoreError as error:  # the store failed (throttling, an outage): try again
                self._failed(error)
                self.metrics.loads.labels(self.label, "retry").inc()
                return False
            except Exception as error:  # the release itself is bad (or cannot be used here)
                self._refuse(wanted, f"release {pointer.version}: {error}")
                return False
            self.refusal = None
            self._serve(index, index.release.manifest_sha256)
            if signed is not None:
                self._remember(signed)
            return True

    @property
    def _where(self) -> str:
        return f"{self.store.uri}/{pointer_path(str(self.profile))}"

    def _remember(self, signed: SignedPointer) -> None:
        self.pointers.serve(self._where, signed)
        self.metrics.sequence.labels(self.label).set(signed.sequence)
        self.observe_age()

    def _refuse(self, wanted: str, why: str) -> None:
        self._refused = wanted
        self.refusal = why
        self.metrics.loads.labels(self.label, "refused").inc()
        log.error("refusing %s; still serving %s", why, self.version or "nothing")

    def _revoke_early(self, pointer: Pointer) -> None:
        """Before a new release is loaded (seconds to minutes for a large one), apply the
        revocations its verified manifest lists to the release still served: a revoked answer
        stops within one poll. Any failure is left to the load that follows."""
        try:
            if pointer.manifest_sha256 is None:
                return  # the load refuses it
            manifest, _ = verified_manifest(
                self.store,
                str(self.profile),
                pointer.version,
                pointer.manifest_sha256,
                self.public_keys,
            )
            keys = frozenset(manifest.revoked.keys if manifest.revoked else ())
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
        state: dict[str, object] = {"profile": self.profile, "language": self.label}
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
        elif self.pointers.rollback is not None:  # the store's pointer is older than one known
            state.update(status="degraded", reason="rollback")
        else:
            state.update(status="degraded", reason="no_release")
        pointer = self.pointers.health()
        if pointer is not None:
            state["pointer"] = pointer
        error = self.store_error or self.refusal or (None if index else self.pointers.rollback)
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
        self.metrics.loads.labels(self.label, "ok").inc()
        if old is not None:
            self.metrics.info.remove(self.label, old.version)
        self.metrics.info.labels(self.label, index.version).set(1)
        self.metrics.entries.labels(self.label).set(len(index))
        self.metrics.semantic.labels(self.label).set(int(index.semantic))
        if not index.semantic:
            reason = index.manifest.threshold.semantic_off_reason
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
        return (datetime.now(UTC) - index.manifest.created).total_seconds()

    def observe_age(self) -> None:
        """Set the age and the pointer's gauges (called at scrape time)."""
        age = self.age_s()
        if age is not None:
            self.metrics.age.labels(self.label).set(age)
        signed = self.pointers.served
        if signed is not None and signed.not_after is not None:
            left = (signed.not_after - datetime.now(UTC)).total_seconds()
            self.metrics.expires.labels(self.label).set(left)
        self.metrics.stale.labels(self.label).set(int(self.pointers.stale() is not None))

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
