"""The releases a service answers from: one ``ReleaseWatcher`` per language it serves, each
with its language's embedder, and the routing of a question to its language's watcher."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from base.languages import language_of
from base.pointers import PointerMemory
from edge_index.release_metrics import ReleaseMetrics
from edge_index.watcher import ReleaseWatcher

if TYPE_CHECKING:
    from base.config import SharedSettings
    from base.store import Store
    from semantic.embedder import Embedder

__all__ = ["Releases"]

log = logging.getLogger(__name__)


class Releases:
    """What an edge or an origin answers from: one ``ReleaseWatcher`` per language profile
    (``EDGEQA_LANGUAGES``), each with its language's embedder (``EDGEQA_EMBEDDER``, loaded when
    its first release is found), sharing one ``ReleaseMetrics``. A question goes to its
    language's watcher (``languages.language_of``), or to the one serving the profile it names."""

    def __init__(self, watchers: dict[str, ReleaseWatcher], metrics: ReleaseMetrics) -> None:
        if not watchers:
            raise ValueError("no language to serve")
        self.watchers = watchers
        self.metrics = metrics

    @classmethod
    def of(cls, watcher: ReleaseWatcher) -> Releases:
        """One watcher (a test's, a pinned profile's) as the releases of its language."""
        return cls({watcher.label: watcher}, watcher.metrics)

    @classmethod
    def from_settings(
        cls,
        settings: SharedSettings,
        metrics_prefix: str,
        embedders: dict[str, Embedder] | None = None,
        store: Store | None = None,
    ) -> Releases:
        """The releases ``settings`` name; ``embedders``: already loaded ones by spec (else each
        is loaded when its language's first release is found; ``load_embedder`` shares a
        built-in one within the process)."""
        from base.store import open_store
        from semantic.loading import load_embedder

        store = store or open_store(settings.store)
        languages = settings.language_list
        metrics = ReleaseMetrics(metrics_prefix, languages)
        given = embedders or {}
        # the newest pointers verified, kept across restarts (a rollback stays refused); the
        # highest ever signed, outside the store, for a reader with no memory yet
        memory = PointerMemory(settings.cache_dir / "pointers" / metrics_prefix)
        high_water = settings.high_water()
        floor = (lambda profile: high_water.read(profile).pointer) if high_water else None
        if high_water is not None and not settings.public_keys:
            log.warning("EDGEQA_HIGH_WATER_URI is set but no EDGEQA_RELEASE_PUBLIC_KEYS: unused")

        def loader(spec: str) -> Callable[[], Embedder]:
            return lambda: (
                given.get(spec) or load_embedder(spec, settings.device, settings.cache_dir)
            )

        watchers = {
            language: ReleaseWatcher(
                store,
                None,
                loader(settings.embedders[language]),
                settings.poll_s,
                metrics=metrics,
                language=language,
                candidates=settings.profile_names,
                embedder_spec=settings.embedders[language],
                public_keys=settings.public_keys,
                memory=memory,
                floor=floor,
            )
            for language in languages
        }
        return cls(watchers, metrics)

    def for_question(self, question: str, profile: str | None = None) -> ReleaseWatcher | None:
        """The watcher that answers ``question``: the one serving ``profile`` when named (None
        if none does), else its language's (None when that language is not served)."""
        if profile:
            return next((w for w in self.watchers.values() if w.profile == profile), None)
        return self.watchers.get(language_of(question))

    @property
    def primary(self) -> ReleaseWatcher:
        return next(iter(self.watchers.values()))

    def profiles(self) -> dict[str, str | None]:
        """The profile each language serves (None until one is found)."""
        return {language: w.profile for language, w in self.watchers.items()}

    def health(self) -> dict[str, object]:
        """One watcher's ``health()`` when one language is served; else ``ok`` while every
        language with a published release serves it (and one does), with each language's."""
        states = {language: w.health() for language, w in self.watchers.items()}
        if len(states) == 1:
            return next(iter(states.values()))
        serving = [s for s in states.values() if s["status"] == "ok"]
        failing = [
            s for s in states.values() if s["status"] != "ok" and s.get("reason") != "no_release"
        ]
        state: dict[str, object] = {"status": "ok" if serving and not failing else "degraded"}
        if state["status"] != "ok":
            state["reason"] = failing[0]["reason"] if failing else "no_release"
        state["languages"] = states
        return state

    def pointers(self) -> dict[str, dict[str, object]]:
        """Each language's served pointer (sequence, expiry, whether it is stale and why), for
        the languages whose pointer is signed."""
        found = {language: w.pointers.health() for language, w in self.watchers.items()}
        return {language: state for language, state in found.items() if state is not None}

    def observe_age(self) -> None:
        for watcher in self.watchers.values():
            watcher.observe_age()

    def set_on_revoked(self, listener: Callable[[frozenset[str]], None]) -> None:
        for watcher in self.watchers.values():
            watcher.on_revoked = listener

    def start(self) -> None:
        for watcher in self.watchers.values():
            watcher.start()

    def stop(self) -> None:
        for watcher in self.watchers.values():
            watcher.stop()
