"""The served releases' metrics: one registry per service, shared by its language watchers
(``watcher.py``), registered in the service's ``/metrics`` under its own prefix."""

from __future__ import annotations

from base.languages import DEFAULT_LANGUAGE

EDGE_METRICS = "edgeqa_edge_release"  # the edge service's names
ORIGIN_METRICS = "edgeqa_origin_release"  # the origin's


class ReleaseMetrics:
    """The served release of each language profile, and loads by result (``ok``, ``refused``,
    ``retry``), under ``<prefix>_*`` with a ``language`` label, in a registry of their own that
    the owning service registers in its ``/metrics`` registry."""

    def __init__(self, prefix: str, languages: tuple[str, ...] = (DEFAULT_LANGUAGE,)) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = registry = CollectorRegistry()
        self.info = Gauge(
            f"{prefix}_info",
            "The release being served (value 1)",
            ["language", "version"],
            registry=registry,
        )
        self.age = Gauge(
            f"{prefix}_age_seconds",
            "Seconds since the served release was built",
            ["language"],
            registry=registry,
        )
        self.entries = Gauge(
            f"{prefix}_entries", "Phrasings in the served release", ["language"], registry=registry
        )
        self.semantic = Gauge(
            f"{prefix}_semantic_enabled",
            "1 when the served release's semantic tier serves (its calibration reached the "
            "target), 0 when it answers exact hits only",
            ["language"],
            registry=registry,
        )
        self.loads = Counter(
            f"{prefix}_loads",
            "Release loads by result (ok, refused, retry, rollback: an older signed pointer "
            "than one verified before, refused)",
            ["language", "result"],
            registry=registry,
        )
        self.sequence = Gauge(
            f"{prefix}_pointer_sequence",
            "Signed sequence of the served release's pointer (0: unsigned or signed before "
            "sequences)",
            ["language"],
            registry=registry,
        )
        self.expires = Gauge(
            f"{prefix}_pointer_expires_seconds",
            "Seconds until the served pointer goes stale (negative: stale that long)",
            ["language"],
            registry=registry,
        )
        self.stale = Gauge(
            f"{prefix}_pointer_stale",
            "1 while the served pointer is stale (expired, or never given an expiry) or the "
            "store's pointer is refused as a rollback",
            ["language"],
            registry=registry,
        )
        for language in languages:
            for result in ("ok", "refused", "retry", "rollback"):
                self.loads.labels(language, result)
