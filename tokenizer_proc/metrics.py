"""``GET /metrics``: Prometheus text built from the scheduler's latest `SchedulerStats` and
the HTTP process's own count of requests in flight."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from protocol.messages import SchedulerStats

_GAUGES = {
    "num_running": ("lazyserve_num_requests_running", "Requests decoding or being prefilled"),
    "num_waiting": ("lazyserve_num_requests_waiting", "Requests waiting for admission"),
    "kv_total_tokens": ("lazyserve_kv_pool_tokens", "KV pool size in tokens"),
    "kv_free_tokens": ("lazyserve_kv_free_tokens", "Free KV slots"),
    "kv_cached_tokens": ("lazyserve_kv_cached_tokens", "KV slots held by the radix prefix cache"),
    "kv_held_tokens": ("lazyserve_kv_request_tokens", "KV slots held by live requests"),
}
_COUNTERS = {
    "prompt_tokens_total": ("lazyserve_prompt_tokens", "Prompt tokens admitted"),
    "cached_prompt_tokens_total": ("lazyserve_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache"),
    "retractions_total": ("lazyserve_retractions", "Requests retracted when the KV pool ran out"),
    "finished_total": ("lazyserve_requests_finished", "Requests that ended"),
}


class _StatsCollector:
    def __init__(self, get, in_flight: int) -> None:
        self.get, self.in_flight = get, in_flight

    def collect(self):
        yield GaugeMetricFamily("lazyserve_http_requests_in_flight",
                                "Choices the HTTP process has sent and not yet seen end (running or waiting)",
                                value=self.in_flight)
        stats: SchedulerStats | None = self.get()
        if stats is None:
            return
        for field, (name, doc) in _GAUGES.items():
            yield GaugeMetricFamily(name, doc, value=getattr(stats, field))
        for field, (name, doc) in _COUNTERS.items():
            yield CounterMetricFamily(name, doc, value=getattr(stats, field))
        hit = stats.cached_prompt_tokens_total / stats.prompt_tokens_total if stats.prompt_tokens_total else 0.0
        yield GaugeMetricFamily("lazyserve_prefix_cache_hit_rate", "Share of prompt tokens served from the cache",
                                value=hit)


def metrics_text(get_stats, in_flight: int) -> bytes:
    """Prometheus exposition of `get_stats()` (a `SchedulerStats` or None) and `in_flight`."""
    registry = CollectorRegistry()
    registry.register(_StatsCollector(get_stats, in_flight))
    return generate_latest(registry)
