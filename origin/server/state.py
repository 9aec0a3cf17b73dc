"""What the origin server holds between requests: its settings, the runtime once loaded, the
online cache, admission, the tokenizer's queue, metrics and the request log.

The runtime (engine and release watcher) loads in a background thread so that the server answers
``/health`` ("loading") at once; requests that need it get 503 until it is ready.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from base.logs import LogWriter
from base.users import UserHasher, user_hasher
from origin.config import OriginSettings
from origin.runtime import Runtime
from origin.server import tiers
from origin.server.admission import Admission
from origin.server.cache import OnlineCache
from origin.server.metrics import OriginMetrics
from origin.server.prompts import TokenizeQueue
from origin.server.protocol import APIError

if TYPE_CHECKING:
    from edge_index.watcher import ReleaseWatcher

log = logging.getLogger(__name__)


class InFlight(Protocol):
    """A response the engine is generating (``generation.Generation``), as shutdown sees it."""

    def interrupt(self) -> None:
        """End the response now with a final error."""


class OriginServer:
    def __init__(
        self,
        settings: OriginSettings,
        load: Callable[[], Runtime],
        logs: LogWriter | None = None,
        cache: OnlineCache | None = None,
        users: UserHasher | None = None,
    ) -> None:
        # read on every request, so a test may swap them (``server.settings = ...``)
        self.settings = settings
        self.load = load
        self.model_name = settings.api_model_name
        self.logs = logs
        self.cache = cache or OnlineCache(
            settings.cache_ttl_s,
            settings.cache_jitter,
            settings.cache_max_bytes,
            min_users=settings.cache_min_users,
        )
        self.users = users or user_hasher(settings)
        self.admission = Admission()
        self.tokenizing = TokenizeQueue()  # prompts waiting for the tokenizer, bounded
        self.metrics = OriginMetrics(self.model_name)
        self.metrics.watch(lambda: self.runtime.engine if self.runtime else None, self.cache)
        if logs is not None:
            self.metrics.registry.register(logs.registry)
        self.runtime: Runtime | None = None
        self.load_error: BaseException | None = None
        self.draining = False
        self.in_flight: set[InFlight] = set()  # admitted to the engine, response not yet over
        self.created = int(time.time())

    # -- loading and state ------------------------------------------------------------------------

    def start_loading(self) -> threading.Thread:
        def run() -> None:
            try:
                runtime = self.load()
                if runtime.releases is not None:
                    self.metrics.registry.register(runtime.releases.metrics.registry)
                    runtime.releases.set_on_revoked(self.on_revoked)
                    for watcher in runtime.releases.watchers.values():
                        if watcher.index is not None:
                            self.on_revoked(watcher.index.revoked)
                    runtime.releases.start()
                self.runtime = runtime
                # the model, tokenizer and engine are long-lived (400,000 objects): out of GC
                # passes, where a full pass took ~100-200 ms in the middle of a step (a TTFT
                # tail); a release swap unfreezes, collects and freezes again (watcher.py)
                gc.collect()
                gc.freeze()
                log.info("origin ready: serving %s", self.model_name)
            except BaseException as error:
                self.load_error = error
                log.exception("loading the origin failed")

        thread = threading.Thread(target=run, name="edgeqa-origin-load", daemon=True)
        thread.start()
        return thread

    def on_revoked(self, keys: frozenset[str]) -> None:
        """A release lists these revoked phrasings: the online cache drops them too."""
        dropped = tiers.revoke_cached(self.cache, keys)
        if dropped:
            log.info("%d revoked online-cache entries dropped", dropped)

    def release_version(self) -> str | None:
        """The version the first language's release serves (``release_versions``: each)."""
        runtime = self.runtime
        if runtime is None or runtime.releases is None:
            return None
        return runtime.releases.primary.version

    def release_versions(self) -> dict[str, str | None]:
        runtime = self.runtime
        if runtime is None or runtime.releases is None:
            return {}
        return {language: w.version for language, w in runtime.releases.watchers.items()}

    def health(self) -> tuple[int, dict[str, Any]]:
        if self.load_error is not None:
            return 503, {"status": "failed", "error": repr(self.load_error)}
        runtime = self.runtime
        if runtime is None:
            return 503, {"status": "loading"}
        if not runtime.engine.alive:
            error = runtime.engine.loop_error
            return 503, {"status": "engine_dead", "error": repr(error) if error else None}
        if self.draining:
            return 503, {"status": "draining", "in_flight": len(self.in_flight)}
        waiting, tokens = runtime.engine.queue_load()
        body: dict[str, Any] = {
            "status": "ok",
            "model": self.model_name,
            "release": self.release_version(),
            "releases": self.release_versions(),
            "running": runtime.engine.num_running,
            "waiting": waiting,
            "queued_prompt_tokens": tokens,
        }
        if runtime.releases is not None and (pointers := runtime.releases.pointers()):
            body["pointers"] = pointers  # each language's signed pointer, stale or not
        return 200, body

    def ready_runtime(self) -> Runtime:
        status, body = self.health()
        if status != 200 or self.runtime is None:
            raise _not_ready(body["status"])
        return self.runtime

    def check_admitting(self) -> None:
        """Raise 503 once a drain has begun (cheap: no health body)."""
        if self.draining:
            raise _not_ready("draining")

    def served_profiles(self) -> dict[str, str | None]:
        """The profile each language's tier reads (None before one is known)."""
        runtime = self.runtime
        releases = runtime.releases if runtime else None
        return releases.profiles() if releases else {}

    def release_for(self, question: str) -> ReleaseWatcher | None:
        """The served release of ``question``'s language (None: no tiers, or not loaded yet)."""
        runtime = self.runtime
        releases = runtime.releases if runtime else None
        return releases.for_question(question) if releases else None

    def served_profile(self, question: str = "") -> str | None:
        """The profile ``question``'s tier reads (None before one is known)."""
        watcher = self.release_for(question)
        return watcher.profile if watcher else None

    def write_log(self, **row: Any) -> None:
        """One request-log row; never fails the request."""
        if self.logs is None:
            return
        try:
            row.setdefault("profile", self.served_profile(str(row.get("query") or "")) or "")
            self.logs.write(**row)
        except Exception:
            log.exception("could not log a request")

    async def drain(self, grace_s: float, settle_s: float = 5.0) -> None:
        """Stop admitting (new requests get 503, ``/health`` says "draining"), give the requests
        in flight ``grace_s`` to finish, then end the rest with a final error; returns once
        every response is over (or ``settle_s`` after the cut)."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self.in_flight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self.in_flight:
            log.warning("shutdown grace over: ending %d responses in flight", len(self.in_flight))
            for generation in list(self.in_flight):
                generation.interrupt()
        deadline = loop.time() + settle_s
        while self.in_flight and loop.time() < deadline:
            await asyncio.sleep(0.05)

    def shutdown(self) -> None:
        """Stop the engine and the release watcher, flush the logs."""
        runtime = self.runtime
        if runtime is not None:
            if runtime.releases is not None:
                runtime.releases.stop()
            runtime.engine.stop()
        if self.logs is not None:
            self.logs.close()


def _not_ready(status: str) -> APIError:
    return APIError(
        503,
        f"the origin is not ready: {status}",
        None,
        "service_unavailable",
        status,
        headers={"retry-after": "5"},
    )
