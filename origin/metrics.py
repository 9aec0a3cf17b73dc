"""The origin's Prometheus metrics: vLLM's names where vLLM has the metric, so that existing
dashboards work, and ``edgeqa_*`` for the rest (the TTFT split, tiers, the online cache).

Histograms are observed by the server as requests finish; the engine's counters and gauges are
read from the engine at scrape time (``EngineCollector``), so they are never out of step with it.
The full list is in ``docs/origin.md``; ``docs/grafana-dashboard.json`` plots them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from origin.cache import OnlineCache
    from origin.engine import Engine

# vLLM's buckets for TTFT and e2e latency, so that the same dashboard queries read the same
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
NETWORK_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
REJECT_REASONS = (
    "queue_full", "queued_tokens_full", "user_limit", "unauthorized", "invalid", "too_large",
    "not_ready",
)  # fmt: skip
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class OriginMetrics:
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        r, m = self.registry, ["model_name"]
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token (generated requests)", m,
            buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end latency of generated requests", m,
            buckets=E2E_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue = Histogram(
            "vllm:request_queue_time_seconds", "Time waiting for a slot", m,
            buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.tpot = Histogram(
            "vllm:time_per_output_token_seconds", "Mean time per output token after the first",
            m, buckets=TPOT_BUCKETS, registry=r,
        )  # fmt: skip
        self.prompt_tokens = Histogram(
            "vllm:request_prompt_tokens", "Prompt tokens per request", m,
            buckets=TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self.generation_tokens = Histogram(
            "vllm:request_generation_tokens", "Generated tokens per request", m,
            buckets=TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self.success = Counter(
            "vllm:request_success", "Finished generated requests by finish reason",
            [*m, "finished_reason"], registry=r,
        )  # fmt: skip
        self.ttft_queue = Histogram(
            "edgeqa_ttft_queue_seconds", "TTFT part: arrival at the server -> scheduled", m,
            buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.ttft_compute = Histogram(
            "edgeqa_ttft_compute_seconds", "TTFT part: scheduled -> first token sampled", m,
            buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.ttft_network = Histogram(
            "edgeqa_ttft_network_seconds",
            "TTFT part: first token sampled -> its bytes handed to the socket (streaming)", m,
            buckets=NETWORK_BUCKETS, registry=r,
        )  # fmt: skip
        self.tier_ttft = Histogram(
            "edgeqa_origin_ttft_seconds", "Server-side time to the first answer byte, by tier",
            ["tier"], buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.requests = Counter(
            "edgeqa_origin_requests", "Requests by tier and HTTP status", ["tier", "status"],
            registry=r,
        )  # fmt: skip
        self.rejected = Counter(
            "edgeqa_origin_rejected", "Requests refused before generation, by reason", ["reason"],
            registry=r,
        )  # fmt: skip
        self.cancelled = Counter(
            "edgeqa_origin_cancelled", "Requests whose client went away, or that timed out",
            ["reason"], registry=r,
        )  # fmt: skip

        # every reason exported from the start (at 0), so that rates and alerts see them
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
        for reason in ("client", "timeout"):
            self.cancelled.labels(reason)

    def watch(
        self,
        engine: Callable[[], Engine | None],
        cache: OnlineCache,
        release: Callable[[], str | None],
    ) -> None:
        self.registry.register(EngineCollector(self.model_name, engine, cache, release))


class EngineCollector(Collector):
    """The engine's and the cache's state, read at scrape time."""

    def __init__(
        self,
        model_name: str,
        engine: Callable[[], Engine | None],
        cache: OnlineCache,
        release: Callable[[], str | None],
    ) -> None:
        self.model_name = model_name
        self.engine = engine
        self.cache = cache
        self.release = release

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=["model_name"])
        g.add_metric([self.model_name], value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=["model_name"])
        c.add_metric([self.model_name], value)
        return c

    def collect(self) -> Iterator[Metric]:
        yield from self._cache_metrics()
        version = self.release()
        info = GaugeMetricFamily(
            "edgeqa_origin_release_info", "The release the origin's tiers use", labels=["version"]
        )
        if version:
            info.add_metric([version], 1)
        yield info
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
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens by position",
            labels=["model_name", "position"],
        )  # fmt: skip
        for position, count in enumerate(spec["num_accepted_tokens_per_pos"]):
            per_pos.add_metric([self.model_name, str(position)], count)
        yield per_pos
        rate = GaugeMetricFamily(
            "edgeqa_spec_decode_acceptance_rate", "Accepted / proposed tokens by proposer",
            labels=["model_name", "proposer"],
        )  # fmt: skip
        for proposer, value in spec["acceptance_rate_by_proposer"].items():
            rate.add_metric([self.model_name, proposer], value)
        yield rate

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
