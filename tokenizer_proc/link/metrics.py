"""``GET /metrics``: Prometheus text for one app, in a `CollectorRegistry` of its own (tests
build several apps in one process; the global registry would mix them).

Two sources:

- **Requests**, observed by the HTTP process as each request (each choice of an ``n`` > 1
  request) streams and ends (`tokenizer_proc.link.request_log`), with vLLM's metric names and
  buckets under ``lazyserve_``: prompt and generation token counters, requests ended by
  finish reason, failed requests by HTTP status, and histograms of time to first token,
  inter-token latency, end-to-end latency and the scheduler's queue, prefill and decode
  times.
- **The scheduler**: gauges and counters from its latest `SchedulerStats` (about once a
  second: running and waiting requests, the KV pool), and the HTTP process's count of
  requests in flight.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from protocol.messages import SchedulerStats

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
    160.0,
    640.0,
    2560.0,
)
"""Seconds; vLLM's buckets for ``time_to_first_token_seconds``."""
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
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
"""Seconds; vLLM's buckets for ``inter_token_latency_seconds``."""
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
"""Seconds; vLLM's buckets for end-to-end latency and the queue, prefill and decode times."""

_GAUGES = {
    "num_running": ("lazyserve_num_requests_running", "Requests decoding or being prefilled"),
    "num_waiting": ("lazyserve_num_requests_waiting", "Requests waiting for admission"),
    "kv_total_tokens": ("lazyserve_kv_pool_tokens", "KV pool size in tokens"),
    "kv_free_tokens": ("lazyserve_kv_free_tokens", "Free KV slots"),
    "kv_cached_tokens": ("lazyserve_kv_cached_tokens", "KV slots held by the radix prefix cache"),
    "kv_held_tokens": ("lazyserve_kv_request_tokens", "KV slots held by live requests"),
}
_COUNTERS = {
    "prompt_tokens_total": (
        "lazyserve_admitted_prompt_tokens",
        "Prompt tokens admitted into the KV cache (counted at each admission; a retracted request counts again)",
    ),
    "cached_prompt_tokens_total": (
        "lazyserve_prefix_cache_hit_tokens",
        "Admitted prompt tokens served from the prefix cache",
    ),
    "retractions_total": ("lazyserve_retractions", "Requests retracted when the KV pool ran out"),
    "finished_total": ("lazyserve_requests_finished", "Requests that ended"),
    "spec_drafts_total": (
        "lazyserve_spec_decode_num_drafts",
        "Speculative decoding: verified rows that carried a draft",
    ),
    "spec_draft_tokens_total": (
        "lazyserve_spec_decode_num_draft_tokens",
        "Speculative decoding: draft tokens verified",
    ),
    "spec_accepted_tokens_total": (
        "lazyserve_spec_decode_num_accepted_tokens",
        "Speculative decoding: draft tokens accepted",
    ),
}


class _StatsCollector:
    """The scheduler's latest `SchedulerStats` and the HTTP process's requests in flight."""

    def __init__(self, get_stats: Callable[[], SchedulerStats | None], get_in_flight: Callable[[], int]) -> None:
        self.get_stats, self.get_in_flight = get_stats, get_in_flight

    def collect(self):
        yield GaugeMetricFamily(
            "lazyserve_http_requests_in_flight",
            "Choices the HTTP process has sent and not yet seen end (running or waiting)",
            value=self.get_in_flight(),
        )
        stats = self.get_stats()
        if stats is None:
            return
        for field, (name, doc) in _GAUGES.items():
            yield GaugeMetricFamily(name, doc, value=getattr(stats, field))
        for field, (name, doc) in _COUNTERS.items():
            yield CounterMetricFamily(name, doc, value=getattr(stats, field))
        if stats.spec_accept_lengths:
            counts = stats.spec_accept_lengths
            yield HistogramMetricFamily(
                "lazyserve_spec_decode_acceptance_length",
                "Speculative decoding: draft tokens accepted per verified draft",
                buckets=[(str(j), sum(counts[: j + 1])) for j in range(len(counts))] + [("+Inf", sum(counts))],
                sum_value=sum(j * c for j, c in enumerate(counts)),
            )
        hit = stats.cached_prompt_tokens_total / stats.prompt_tokens_total if stats.prompt_tokens_total else 0.0
        yield GaugeMetricFamily(
            "lazyserve_prefix_cache_hit_rate", "Share of prompt tokens served from the cache", value=hit
        )


class RequestMetrics:
    """One app's metrics (see the module docstring). get_stats: the scheduler's latest
    `SchedulerStats` (None before the first); get_in_flight: requests in flight now.
    The request metrics are public attributes, observed by `request_log.RequestLog`."""

    def __init__(self, get_stats: Callable[[], SchedulerStats | None], get_in_flight: Callable[[], int]) -> None:
        self.registry = r = CollectorRegistry()
        self.prompt_tokens = Counter(
            "lazyserve_prompt_tokens", "Prompt tokens of requests that got their first token", registry=r
        )
        self.generation_tokens = Counter("lazyserve_generation_tokens", "Generated tokens (EOS included)", registry=r)
        self.request_success = Counter(
            "lazyserve_request_success",
            "Requests that ended, by finish reason (abort: the client left)",
            ["finished_reason"],
            registry=r,
        )
        self.request_errors = Counter(
            "lazyserve_request_errors", "Requests that failed with an error, by HTTP status", ["status"], registry=r
        )
        self.ttft = Histogram(
            "lazyserve_time_to_first_token_seconds",
            "Time from arrival to the first token",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "lazyserve_inter_token_latency_seconds",
            "Time between two consecutive output tokens",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "lazyserve_e2e_request_latency_seconds",
            "Time from arrival to the last token of requests that finished (stop or length)",
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            "lazyserve_request_queue_time_seconds",
            "Time a finished request waited for admission in the scheduler",
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        self.prefill = Histogram(
            "lazyserve_request_prefill_time_seconds",
            "Time from admission to the first token of a finished request",
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        self.decode = Histogram(
            "lazyserve_request_decode_time_seconds",
            "Time from the first to the last token of a finished request",
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        r.register(_StatsCollector(get_stats, get_in_flight))

    def text(self) -> bytes:
        """The Prometheus text exposition of everything above."""
        return generate_latest(self.registry)
