"""The figures of a serving benchmark run, from its recorded streams (`bench.client.StreamRecord`)."""

from __future__ import annotations

import numpy as np

from bench.client import StreamRecord

PERCENTILES = (50, 90, 99)


def distribution(values_s: list[float]) -> dict | None:
    """{"mean", "p50", "p90", "p99"} of `values_s` (seconds) in milliseconds; None when empty."""
    if not values_s:
        return None
    v = np.asarray(values_s) * 1000.0
    return {"mean": float(v.mean()), **{f"p{q}": float(np.percentile(v, q)) for q in PERCENTILES}}


def output_tokens(rec: StreamRecord) -> int:
    """Completion tokens of `rec`: the server's usage, else its count of content chunks."""
    return rec.usage["completion_tokens"] if rec.usage else len(rec.chunk_times)


def steady_decode_rate(records: list[StreamRecord]) -> float | None:
    """Aggregate decode tok/s while every stream decodes: over the window from the last first
    content chunk to the first last one, each stream's content chunks inside the window
    scaled by its tokens per chunk ((tokens - 1) / (chunks - 1): a chunk may hold more than one
    token, or none) and summed, over the window's length. This is the decode rate at batch =
    the number of streams, without the prefill and ramp the aggregate rate includes; None when
    no window exists (some stream ended before another started) or a stream has < 2 chunks."""
    streams = [r for r in records if len(r.chunk_times) > 1]
    if not streams or len(streams) < len(records):
        return None
    start = max(r.chunk_times[0] for r in streams)
    end = min(r.chunk_times[-1] for r in streams)
    if end <= start:
        return None
    tokens = sum(
        sum(start <= t <= end for t in r.chunk_times) * (output_tokens(r) - 1) / (len(r.chunk_times) - 1)
        for r in streams
    )
    return tokens / (end - start)


def first_wave(records: list[StreamRecord], concurrency: int) -> dict | None:
    """How spread out the first wave was: of the `concurrency` requests sent first, the ms from
    the first send to the last (``send_spread_ms``) and from the first one's first content chunk
    to the last one's (``first_chunk_spread_ms``), with the earliest first chunk after the first
    send (``first_chunk_ms``). A wave whose first chunks spread over S ms decodes with fewer rows
    than it has for about S ms at each end, which the aggregate decode rate counts and the steady
    one does not. None when no request of the wave streamed."""
    wave = sorted(records, key=lambda r: r.start)[:concurrency]
    firsts = [r.chunk_times[0] for r in wave if r.chunk_times]
    if not firsts:
        return None
    t0 = wave[0].start
    return {
        "send_spread_ms": (wave[-1].start - t0) * 1000.0,
        "first_chunk_ms": (min(firsts) - t0) * 1000.0,
        "first_chunk_spread_ms": (max(firsts) - min(firsts)) * 1000.0,
    }


def summarize(records: list[StreamRecord], errors: list[str], duration_s: float) -> dict:
    """The run's figures: counts, throughputs (per second of `duration_s`, the wall time of the
    whole run), latency distributions in ms (TTFT: send to first content chunk; ITL: gaps
    between consecutive content chunks of a request, pooled; TPOT: (last - first content
    chunk) / (tokens - 1) per request; e2e: send to end of stream), per-stream decode rate
    ((tokens - 1) / (last - first chunk time), tok/s) and the aggregate decode rate (all
    tokens after each request's first / (last chunk of any - first chunk of any), tok/s; it
    includes the prefill and ramp) and the steady decode rate (`steady_decode_rate`).
    `errors`: one message per failed request. ``output_token_source`` says whether the tokens
    were counted from the server's usage, from content chunks, or mixed."""
    streamed = [r for r in records if r.chunk_times]
    tokens = [output_tokens(r) for r in records]
    with_usage = sum(r.usage is not None for r in records)
    source = "usage" if with_usage == len(records) else "content chunks" if not with_usage else "mixed"
    decoding = [(output_tokens(r), r.chunk_times[0], r.chunk_times[-1]) for r in streamed if output_tokens(r) > 1]
    per_stream = [(n - 1) / (last - first) for n, first, last in decoding if last > first]
    span = max((d[2] for d in decoding), default=0.0) - min((d[1] for d in decoding), default=0.0)
    prompt = [r.usage["prompt_tokens"] for r in records if r.usage and r.usage.get("prompt_tokens") is not None]
    return {
        "completed": len(records),
        "failed": len(errors),
        "errors": sorted(set(errors))[:5],
        "duration_s": duration_s,
        "output_token_source": source,
        "total_output_tokens": sum(tokens),
        "mean_output_tokens": float(np.mean(tokens)) if tokens else None,
        "mean_prompt_tokens": float(np.mean(prompt)) if prompt else None,
        "request_throughput": len(records) / duration_s if duration_s > 0 else None,
        "output_throughput": sum(tokens) / duration_s if duration_s > 0 else None,
        "decode_throughput": sum(n - 1 for n, _, _ in decoding) / span if span > 0 else None,
        "steady_decode_throughput": steady_decode_rate(records),
        "per_stream_decode_tok_s": {"median": float(np.median(per_stream)), "mean": float(np.mean(per_stream))}
        if per_stream
        else None,
        "ttft_ms": distribution([r.chunk_times[0] - r.start for r in streamed]),
        "itl_ms": distribution([b - a for r in streamed for a, b in zip(r.chunk_times, r.chunk_times[1:])]),
        "tpot_ms": distribution(
            [(r.chunk_times[-1] - r.chunk_times[0]) / (output_tokens(r) - 1) for r in streamed if output_tokens(r) > 1]
        ),
        "e2e_latency_ms": distribution([r.end - r.start for r in records]),
    }
