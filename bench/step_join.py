"""Joining the per-process traces of `protocol.trace` into per-step components, for
`bench/step_profile.py`.

Records are joined by launch id (worker, scheduler) and by `protocol.trace.batch_key`
(scheduler -> detokenizer -> HTTP). All times are perf_counter seconds, comparable across
the processes of one machine; every component comes out in seconds per step.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

BLOCKED_S = 50e-6
"""A finalize that blocked longer than this found its launch still running on the device."""

COMPONENTS = [
    ("scheduler", "scheduler: scheduling, ChainDecode build, result processing (excl. messages)"),
    ("sched_messages", "scheduler: message encode + send (worker, detokenizers) + LaunchResult decode"),
    ("transit_launch", "transit scheduler → worker (ChainDecode/Launch, incl. inbox wait)"),
    ("transit_finalize", "transit scheduler → worker (Finalize, incl. inbox wait)"),
    ("build", "worker: graph build (message read → async_eval, excl. sampling)"),
    ("sampling", "worker: sampling ops build (logits pipeline)"),
    ("async_eval", "worker: mx.async_eval call"),
    ("device", "device time (launched → ready, blocked finalizes only)"),
    ("finalize_wait", "worker: finalize wait (blocked)"),
    ("result_send", "worker: LaunchResult build + encode + send call"),
    ("transit_result", "transit worker → scheduler (LaunchResult)"),
    ("transit_detok", "transit scheduler → detokenizer (BatchTokenOut)"),
    ("detok", "detokenizer: one step's token batch (decode, render, send)"),
    ("transit_http", "transit detokenizer → HTTP (BatchStrOut)"),
    ("fanout", "HTTP fan-out: batch read → last SSE chunk written"),
]
"""(key, label) of each table row, in step order."""


def load(trace_dir: Path) -> dict[str, list[dict]]:
    """Records of each process kind ("worker", "scheduler", "detokenizer", "http") found in
    `trace_dir` (files NAME-PID.jsonl)."""
    out: dict[str, list[dict]] = {"worker": [], "scheduler": [], "detokenizer": [], "http": []}
    for f in sorted(trace_dir.glob("*.jsonl")):
        kind = f.name.rsplit("-", 1)[0]
        if kind in out:
            out[kind] += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def steady_decodes(worker: list[dict], rows: int, skip: int) -> list[dict]:
    """The worker's DECODE records of exactly `rows` rows, by launch id, without the first `skip`."""
    dec = sorted((r for r in worker if r.get("mode") == "DECODE" and r.get("rows") == rows), key=lambda r: r["id"])
    return dec[skip:]


def served_steps(dec: list[dict]) -> list[float]:
    """Intervals (s) between the ready times of consecutive launch ids among `dec`."""
    return [b["ready"] - a["ready"] for a, b in zip(dec, dec[1:]) if b["id"] == a["id"] + 1]


def components(recs: dict[str, list[dict]], dec: list[dict]) -> dict[str, list[float]]:
    """Per-step samples (s) of each `COMPONENTS` key over the steady decodes `dec`. A step
    contributes to a component only when every record it needs was found."""
    sched = {r["id"]: r for r in recs["scheduler"]}
    launch_sent = {int(lid): t for r in recs["scheduler"] for lid, t in r.get("sent", {}).items()}
    detok = {r["key"]: r for r in recs["detokenizer"]}
    http = {r["key"]: r for r in recs["http"]}
    out: dict[str, list[float]] = {key: [] for key, _ in COMPONENTS}
    # transits run from the start of the send call to the read (the send call is also in the encode + send rows)
    for w in dec:
        lid = w["id"]
        if {"received", "built", "queueing", "launched"} <= w.keys():
            out["build"].append(min(w["built"], w["queueing"]) - w["received"] - w.get("sampling_s", 0.0))
            out["sampling"].append(w.get("sampling_s", 0.0))
            out["async_eval"].append(w["launched"] - w["queueing"])
        if "wait" in w:
            out["finalize_wait"].append(w["ready"] - w["wait"])
            if w["ready"] - w["wait"] > BLOCKED_S and "launched" in w:
                out["device"].append(w["ready"] - w["launched"])
        out["result_send"].append(w["result_sent"] - w["ready"])
        if lid in launch_sent and "received" in w:
            out["transit_launch"].append(w["received"] - launch_sent[lid])
        s = sched.get(lid)
        if s is None or not {"finalizing", "result_recv"} <= s.keys():
            continue
        if "fin_sent" in s and "fin_received" in w:
            out["transit_finalize"].append(w["fin_received"] - s["fin_sent"])
        out["transit_result"].append(s["result_recv"] - w["result_sending"])
        messages = sum(s.get(k, 0.0) for k in ("enc_worker", "send_worker", "enc_detok", "send_detok"))
        decode = s["result_decoded"] - s["result_recv"]
        out["sched_messages"].append(messages + decode)
        out["scheduler"].append(s["finalizing"] - s["start"] + s["end"] - s["result_decoded"] - messages)
        batches = [(detok.get(key), sent) for _, key, sent, _ in s.get("detok", [])]
        batches = [(d, sent) for d, sent in batches if d is not None]
        if not batches:
            continue
        out["transit_detok"].append(max(d["recv"] - sent for d, sent in batches))
        out["detok"].append(max(d["done"] - d["recv"] for d, _ in batches))
        texts = [(http.get(d.get("out_key")), d) for d, _ in batches]
        texts = [(h, d) for h, d in texts if h is not None and h.get("last_written") is not None]
        if texts:
            out["transit_http"].append(max(h["recv"] - d["sending"] for h, d in texts))
            out["fanout"].append(max(h["last_written"] for h, _ in texts) - min(h["recv"] for h, _ in texts))
    return out


def median_or_none(xs: list[float]) -> float | None:
    """The median of `xs`, or None when empty."""
    return statistics.median(xs) if xs else None
