"""The origin's Prometheus metrics: vLLM's names where vLLM has the metric, so that existing
dashboards work, and ``edgeqa_*`` for the rest (the TTFT split, tiers, the online cache).

Histograms are observed as requests finish (``observe_*``, called by the request flow); the
engine's counters and gauges are read from the engine at scrape time (``EngineCollector``), so
they are never out of step with it. The served release's metrics (``edgeqa_origin_release_*``)
come from the release watcher's own registry, registered here once the runtime is loaded. The
full list is in ``docs/origin.md``; ``docs/grafana-dashboard.json`` plots them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from policy.answers import CACHE_SKIP_REASONS

if TYPE_CHECKING:
    from origin.engine import Engine
    from origin.engine.request import RequestTimes
    from origin.server.cache import OnlineCache

# vLLM's buckets for TTFT and e2e latency, so that the same dashboard queries read the same
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
NETWORK_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
REJECT_REASONS = (
    "queue_full",
    "queued_tokens_full",
    "user_limit",
    "user_tokens",
    "network_limit",
    "tokenize_queue_full",
    "tokenize_timeout",
    "unauthorized",
    "invalid",
    "too_large",
    "not_ready",
)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class OriginMetrics:
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        model = ["model_name"]

        def histogram(name: str, doc: str, buckets: tuple[float, ...], labels: list[str]) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

        def counter(name: str, doc: str, labels: list[str]) -> Any:
            return Counter(name, doc, labels, registry=self.registry)

        # vLLM's names
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token (generated requests)",
            TTFT_BUCKETS,
            model,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end latency of generated requests",
            E2E_BUCKETS,
            model,
        )
        self.queue = histogram(
            "vllm:request_queue_time_seconds", "Time waiting for a slot", TTFT_BUCKETS, model
        )
        self.tpot = histogram(
            "vllm:time_per_output_token_seconds",
            "Mean time per output token after the first",
            TPOT_BUCKETS,
            model,
        )
        self.prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Prompt tokens per request", TOKEN_BUCKETS, model
        )
        self.generation_tokens = histogram(
            "vllm:request_generation_tokens", "Generated tokens per request", TOKEN_BUCKETS, model
        )
        self.success = counter(
            "vllm:request_success",
            "Finished generated requests by finish reason",
            [*model, "finished_reason"],
        )
        # edgeqa's: the TTFT split, tiers, refusals
        self.ttft_queue = histogram(
            "edgeqa_ttft_queue_seconds",
            "TTFT part: arrival at the server -> scheduled",
            TTFT_BUCKETS,
            model,
        )
        self.ttft_compute = histogram(
            "edgeqa_ttft_compute_seconds",
            "TTFT part: scheduled -> first token sampled",
            TTFT_BUCKETS,
            model,
        )
        self.ttft_network = histogram(
            "edgeqa_ttft_network_seconds",
            "TTFT part: first token sampled -> its bytes handed to the socket (streaming)",
            NETWORK_BUCKETS,
            model,
        )
        self.tier_ttft = histogram(
            "edgeqa_origin_ttft_seconds",
            "Server-side time to the first answer byte, by tier",
            TTFT_BUCKETS,
            ["tier"],
        )
        self.requests = counter(
            "edgeqa_origin_requests", "Requests by tier and HTTP status", ["tier", "status"]
        )
        self.rejected = counter(
            "edgeqa_origin_rejected", "Requests refused before generation, by reason", ["reason"]
        )
        self.cancelled = counter(
            "edgeqa_origin_cancelled",
            "Requests whose client went away, or that timed out",
            ["reason"],
        )
        self.cache_skipped = counter(
            "edgeqa_origin_cache_skipped",
            "Generated answers never written to the online cache, by reason",
            ["reason"],
        )
        self.semantic = counter(
            "edgeqa_origin_semantic_lookups",
            "Lookups that reached the release's semantic tier: hit and miss embedded and searched "
            "the question, skipped did not (the client had just missed in that release)",
            ["outcome"],
        )
        self.missed_hints = counter(
            "edgeqa_origin_missed_hints",
            "Requests saying which release they had just missed in at the edge: honoured (the one "
            "served here) or other_release (ignored)",
            ["outcome"],
        )

        # every reason exported from the start (at 0), so that rates and alerts see them
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
        for reason in CACHE_SKIP_REASONS:
            self.cache_skipped.labels(reason)
        for reason in ("client", "timeout"):
            self.cancelled.labels(reason)
        for outcome in ("hit", "miss", "skipped"):
            self.semantic.labels(outcome)
        for outcome in ("honoured", "other_release"):
            self.missed_hints.labels(outcome)

    def watch(self, engine: Callable[[], Engine | None], cache: OnlineCache) -> None:
        self.registry.register(EngineCollector(self.model_name, engine, cache))

    # -- observing requests -----------------------------------------------------------------------

    def observe_rejected(self, status: int, reason: str) -> None:
        self.rejected.labels(reason).inc()
        self.requests.labels("rejected", str(status)).inc()

    def observe_cache_skipped(self, reason: str) -> None:
        self.cache_skipped.labels(reason).inc()

    def observe_semantic(self, outcome: str) -> None:
        self.semantic.labels(outcome).inc()

    def observe_missed_hint(self, honoured: bool) -> None:
        self.missed_hints.labels("honoured" if honoured else "other_release").inc()

    def observe_hit(self, tier: str, ttft_s: float) -> None:
        self.requests.labels(tier, "200").inc()
        self.tier_ttft.labels(tier).observe(ttft_s)

    def observe_generated(
        self,
        status: int,
        times: RequestTimes | None,
        finish_reason: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        first_sent: float | None,
    ) -> None:
        """One admitted request, however it ended (``status``: 200, 499 gone, 504 timed out,
        500 failed); ``first_sent``: when its first bytes were handed to the socket (streaming)."""
        name = self.model_name
        if status == 499:
            self.cancelled.labels("client").inc()
        elif status == 504:
            self.cancelled.labels("timeout").inc()
        self.requests.labels("error" if status == 500 else "generated", str(status)).inc()
        if times is None or times.first_token is None:
            return
        ttft = times.first_token - times.arrival
        self.ttft.labels(name).observe(ttft)
        self.tier_ttft.labels("generated").observe(ttft)
        if times.queue_s is not None and times.ttft_compute_s is not None:
            self.queue.labels(name).observe(times.queue_s)
            self.ttft_queue.labels(name).observe(times.queue_s)
            self.ttft_compute.labels(name).observe(times.ttft_compute_s)
        if first_sent is not None:
            self.ttft_network.labels(name).observe(max(0.0, first_sent - times.first_token))
        if status != 200 or times.finished is None:
            return
        self.e2e.labels(name).observe(times.finished - times.arrival)
        self.success.labels(name, finish_reason or "unknown").inc()
        self.prompt_tokens.labels(name).observe(prompt_tokens)
        self.generation_tokens.labels(name).observe(completion_tokens)
        if len(times.tokens) > 1:
            self.tpot.labels(name).observe(
                (times.tokens[-1] - times.tokens[0]) / (len(times.tokens) - 1)
            )


class EngineCollector(Collector):
    """The engine's and the cache's state, read at scrape time."""

    def __init__(
        self,
        model_name: str,
        engine: Callable[[], Engine | None],
        cache: OnlineCache,
    ) -> None:
        self.model_name = model_name
        self.engine = engine
        self.cache = cache

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=["model_name"])
        g.add_metric([self.model_name], value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=["model_name"])
        c.add_metric([self.model_name], value)
        return c

    def _by(
        self,
        family: type[CounterMetricFamily] | type[GaugeMetricFamily],
        name: str,
        doc: str,
        label: str,
        values: Mapping[Any, float] | Iterable[tuple[Any, float]],
    ) -> Metric:
        """One series per value, labelled with the model and ``label``."""
        metric = family(name, doc, labels=["model_name", label])
        for key, value in values.items() if isinstance(values, Mapping) else values:
            metric.add_metric([self.model_name, str(key)], value)
        return metric

    def collect(self) -> Iterator[Metric]:
        yield from self._cache_metrics()
        engine = self.engine()
        if engine is None:
            return
        m: dict[str, Any] = engine.metrics()
        yield self._gauge(
            "vllm:num_requests_running", "Requests in a slot", m["num_requests_running"]
        )
        yield self._gauge(
            "vllm:num_requests_waiting", "Requests waiting for a slot", m["num_requests_waiting"]
        )
        for name in ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"):
            yield self._gauge(name, "KV cache in use (fraction)", m["kv_cache_usage"])
        yield self._counter("vllm:prompt_tokens", "Prefilled tokens", m["prompt_tokens"])
        yield self._counter("vllm:generation_tokens", "Generated tokens", m["generation_tokens"])
        yield self._counter("vllm:num_preemptions", "Preemptions", m["preemptions"])
        yield self._counter(
            "vllm:prefix_cache_hits",
            "Prompt tokens started from a shared prefix instead of computed",
            m["prefix_tokens_shared"],
        )
        yield self._by(
            CounterMetricFamily,
            "edgeqa_engine_step_seconds",
            "The engine loop's busy seconds by part of the step",
            "phase",
            m["step_seconds"],
        )
        spec = m["spec_decode"]
        if not spec:
            return
        yield self._counter("vllm:spec_decode_num_drafts", "Proposals", spec["num_drafts"])
        yield self._counter(
            "vllm:spec_decode_num_draft_tokens", "Proposed tokens", spec["num_draft_tokens"]
        )
        yield self._counter(
            "vllm:spec_decode_num_accepted_tokens", "Accepted tokens", spec["num_accepted_tokens"]
        )
        yield self._by(
            CounterMetricFamily,
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens by position",
            "position",
            enumerate(spec["num_accepted_tokens_per_pos"]),
        )
        yield self._by(
            GaugeMetricFamily,
            "edgeqa_spec_decode_acceptance_rate",
            "Accepted / proposed tokens by proposer",
            "proposer",
            spec["acceptance_rate_by_proposer"],
        )

    def _cache_metrics(self) -> Iterator[Metric]:
        cache = self.cache
        entries = GaugeMetricFamily("edgeqa_origin_cache_entries", "Online cache entries")
        entries.add_metric([], len(cache))
        size = GaugeMetricFamily("edgeqa_origin_cache_bytes", "Online cache size (bytes)")
        size.add_metric([], cache.bytes)
        lookups = CounterMetricFamily(
            "edgeqa_origin_cache_lookups", "Online cache lookups", labels=["outcome"]
        )
        lookups.add_metric(["hit"], cache.hits)
        lookups.add_metric(["miss"], cache.misses)
        removed = CounterMetricFamily(
            "edgeqa_origin_cache_removed", "Entries removed, by cause", labels=["cause"]
        )
        removed.add_metric(["evicted"], cache.evictions)
        removed.add_metric(["expired"], cache.expirations)
        yield from (entries, size, lookups, removed)
