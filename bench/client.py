"""The HTTP client side the benchmarks share: request bodies, an httpx client, reading and
timing SSE streams (chat or completions), small one-shot requests (``/health``,
``/v1/models``, native ``/generate``); and the servers' side: starting the servers compared
(lazyserve's ``launch.py`` and mlx_lm.server, through `tests.support.launcher`, which waits
for ``/health`` with a deadline and stops them), a tiny random model to serve, and the
memory and command line of their processes (/proc).

Needs httpx; the server helpers import `tests.support.launcher` and `bench.blas_env` when called.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from tests.support.launcher import HttpProcess, Server

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
ENDPOINTS = {"chat": CHAT, "completions": COMPLETIONS}


# ----------------------------------------------------------------------------- requests
def request_body(
    prompt: str | list[int],
    max_tokens: int,
    endpoint: str = "chat",
    model: str | None = None,
    ignore_eos: bool = True,
    stream: bool = True,
) -> dict:
    """The greedy request for `prompt` (text, or token ids for completions) on `endpoint`
    ("chat" or "completions"); when `stream`, streamed with ``stream_options.include_usage``.
    ``model`` only when given, ``ignore_eos`` only when asked."""
    body: dict = {"max_tokens": max_tokens, "temperature": 0}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    body.update({"messages": [{"role": "user", "content": prompt}]} if endpoint == "chat" else {"prompt": prompt})
    if model:
        body["model"] = model
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def async_client(
    timeout: float | None, connect: float | None = None, connections: int | None = None
) -> httpx.AsyncClient:
    """An httpx.AsyncClient: `timeout` seconds to read, write or wait for a connection (None:
    no limit), `connect` seconds to connect (default: `timeout`); with `connections`, at most
    that many connections, all kept alive (default: httpx's limits)."""
    limits = (
        {"limits": httpx.Limits(max_connections=connections, max_keepalive_connections=connections)}
        if connections
        else {}
    )
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=timeout if connect is None else connect), **limits)


async def sse_data(response: httpx.Response) -> AsyncIterator[str]:
    """The payload of each SSE data line of `response` (what follows ``data: ``; ``[DONE]``
    included), as it arrives."""
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            yield line[6:]


async def stream_chunks(client: httpx.AsyncClient, url: str, body: dict, path: str = CHAT) -> AsyncIterator[dict]:
    """POST the streamed request `body` to `url` + `path` and yield each JSON chunk as it
    arrives (not ``[DONE]``). Raises `RuntimeError` for a non-200 status or an error event,
    httpx errors for a failed connection."""
    async with client.stream("POST", f"{url}{path}", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for payload in sse_data(r):
            if payload.startswith("{"):
                chunk = json.loads(payload)
                if "error" in chunk:
                    raise RuntimeError(chunk["error"])
                yield chunk


def has_content(chunk: dict) -> bool:
    """Whether `chunk` carries content (chat ``delta.content``, completions ``text``) or logprobs."""
    choice = chunk["choices"][0] if chunk.get("choices") else {}
    return bool(choice.get("delta", {}).get("content") or choice.get("text") or choice.get("logprobs"))


@dataclass
class StreamRecord:
    """One streamed request. start, end: perf_counter seconds when it was sent and when its
    stream closed; chunk_times: perf_counter seconds of each chunk carrying content; usage:
    the server's usage dict (``prompt_tokens``, ``completion_tokens``) or None when it sent none."""

    start: float
    end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    usage: dict | None = None


async def record_stream(client: httpx.AsyncClient, url: str, body: dict, path: str = CHAT) -> StreamRecord:
    """Send `body` (a streamed request; ask ``stream_options.include_usage`` for usage) as
    `stream_chunks` does and record it. Raises as `stream_chunks`."""
    rec = StreamRecord(time.perf_counter())
    async for chunk in stream_chunks(client, url, body, path):
        if has_content(chunk):
            rec.chunk_times.append(time.perf_counter())
        rec.usage = chunk.get("usage") or rec.usage
    rec.end = time.perf_counter()
    return rec


async def timed_stream(client: httpx.AsyncClient, url: str, body: dict) -> tuple[int, float, float]:
    """`record_stream` of the chat request `body` summed up: (completion tokens (0 without
    usage), perf_counter seconds of the first and of the last content chunk; 0.0 when none came)."""
    rec = await record_stream(client, url, body)
    n = rec.usage["completion_tokens"] if rec.usage else 0
    times = rec.chunk_times or [0.0]
    return n, times[0], times[-1]


def greedy_ids(client: httpx.Client, url: str, input_ids: list[int], max_new_tokens: int) -> list[int]:
    """The token ids of the greedy answer (``ignore_eos``) of native ``/generate`` to
    `input_ids`. Raises `httpx.HTTPStatusError` for a non-2xx status."""
    r = client.post(
        f"{url}/generate",
        json={
            "input_ids": input_ids,
            "return_logprob": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        },
    )
    r.raise_for_status()
    return [e[1] for e in r.json()["meta_info"]["output_token_logprobs"]]


def served_model(url: str) -> str:
    """The id of the first model ``/v1/models`` of the server at `url` lists."""
    return httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]


def healthy(url: str) -> bool:
    """Whether the server at `url` answers ``GET /health`` with 200 (False when it cannot be reached)."""
    try:
        return httpx.get(f"{url}/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


# ----------------------------------------------------------------------------- servers
def start_lazyserve(model_dir: Path, log: Path, blas_threads: int, extra_flags: str, timeout: float) -> Server:
    """``launch.py --model model_dir --blas-threads N`` plus `extra_flags` (one string),
    once healthy. Raises `RuntimeError` with its log when it exits or is not healthy in `timeout` s."""
    from tests.support.launcher import Server

    return Server(["--model", str(model_dir), "--blas-threads", str(blas_threads), *extra_flags.split()], log, timeout)


def start_mlx_lm(
    model_dir: Path, log: Path, backlog: bool, blas_threads: int, timeout: float, flags: list[str] = ()
) -> HttpProcess:
    """mlx_lm.server on `model_dir` (through `bench.mlx_lm_server_backlog` when `backlog`) with
    `flags` (e.g. ``--decode-concurrency=64``) and the BLAS setup of lazyserve's worker
    (`bench.blas_env`), once healthy. Raises `RuntimeError` with its log when it exits or is
    not healthy in `timeout` s."""
    from bench.blas_env import mlx_process_env
    from tests.support.launcher import HttpProcess, free_port

    port = free_port()
    module = "bench.mlx_lm_server_backlog" if backlog else "mlx_lm.server"
    cmd = [sys.executable, "-m", module, "--model", str(model_dir), "--port", str(port), "--log-level", "WARNING"]
    cmd += list(flags)
    return HttpProcess(cmd, port, log, timeout, env=mlx_process_env(blas_threads))


def rss_kib(pid: int) -> int | None:
    """The resident memory (VmRSS) of process `pid` in KiB; None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def cmdline(pid: int) -> str:
    """The command line of process `pid` (60 characters at most); "?" when it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:60]
    except OSError:
        return "?"


def on_server(start: Callable[[], HttpProcess], work: Callable[[HttpProcess], dict]) -> dict:
    """``work(server)`` on the server ``start()`` returns once healthy (`start_lazyserve`,
    `start_mlx_lm`), stopped afterwards; {"error": the end of its log (2,000 characters)}
    when `start` raises `RuntimeError` (it exited or was not healthy in time)."""
    try:
        server = start()
    except RuntimeError as e:
        return {"error": str(e)[-2000:]}
    try:
        return work(server)
    finally:
        server.stop()


def tiny_model(out: Path, config: dict | None = None) -> str:
    """A random-weight model the tests use (`tests.support.tiny_model.write_random_model`: a tiny
    llama, or `config`) with the default model's tokenizer, written in `out`; its directory."""
    from protocol.model_source import resolve_model
    from tests.support.tiny_model import TINY_CONFIG, write_random_model
    from text.hf_tokenizer import load_tokenizer

    return str(write_random_model(out, load_tokenizer(resolve_model(None)), config or TINY_CONFIG))
