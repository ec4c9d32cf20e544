"""A running server's request and KV pool state as `/metrics` shows it, and waiting for it
to go idle. Used by the tests and by bench/load.py; imports nothing but httpx.

The scheduler reports its gauges about once a second while they change, so "idle within
2 s" allows one report to be in transit.
"""

from __future__ import annotations

import re
import time

import httpx

_SAMPLE = re.compile(r"^(lazyserve_\w+?)(?:_total)? ([0-9.e+-]+)$", re.M)


def metrics(url: str, headers: dict[str, str] | None = None) -> dict[str, float]:
    """The ``lazyserve_*`` samples of `url`/metrics by name (counters without ``_total``).
    Raises `httpx.HTTPError` when the server does not answer."""
    r = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
    r.raise_for_status()
    return {m.group(1): float(m.group(2)) for m in _SAMPLE.finditer(r.text)}


def is_idle(m: dict[str, float]) -> bool:
    """No request running, waiting or in flight in the HTTP process, no KV slot held by a
    request, and free + cached slots = the whole pool."""
    return (
        m.get("lazyserve_num_requests_running") == 0
        and m.get("lazyserve_num_requests_waiting") == 0
        and m.get("lazyserve_http_requests_in_flight") == 0
        and m.get("lazyserve_kv_request_tokens") == 0
        and m["lazyserve_kv_free_tokens"] + m["lazyserve_kv_cached_tokens"] == m["lazyserve_kv_pool_tokens"]
    )


def wait_idle(url: str, timeout: float = 2.0, headers: dict[str, str] | None = None) -> float:
    """Poll `url`/metrics until `is_idle`; returns the seconds it took. Raises
    `AssertionError` with the last sample when it is not idle within `timeout` s."""
    t0 = time.monotonic()
    while True:
        m = metrics(url, headers)
        if "lazyserve_kv_pool_tokens" in m and is_idle(m):
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not idle {timeout:g} s later: {m}")
        time.sleep(0.05)


def wait_metric(url: str, check, timeout: float = 10.0) -> dict[str, float]:
    """Poll `url`/metrics until ``check(sample)`` is true; returns that sample. Raises
    `AssertionError` with the last sample after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not check(m := metrics(url)):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout:g} s: {m}")
        time.sleep(0.05)
    return m
