"""Serving benchmark for any OpenAI-compatible server: N streamed requests, at most C in
flight, with synthetic prompts of about L tokens (optionally sharing a P-token prefix) or the
prompts of a JSONL file, each asking O tokens at temperature 0 (``ignore_eos`` too, which
lazyserve and vLLM honour and mlx_lm.server ignores). Writes the figures of
`bench.serving_metrics.summarize` as JSON.

    python -m bench.serving --url http://127.0.0.1:PORT [--model NAME] --num-prompts N
        --concurrency C --input-len L --output-len O [--shared-prefix-len P]
        [--dataset FILE.jsonl] [--endpoint chat|completions] [--tokenizer PATH|default]
        [--no-ignore-eos] --json OUT

Prompt lengths are exact by `--tokenizer` (a model directory or GGUF as lazyserve loads it,
or ``default``), else one common word per token; the chat template adds its own tokens, so
``mean_prompt_tokens`` (from the server's usage) is the length actually served.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.prompts import jsonl_prompts, load_tokenizer_for, synthetic_prompts  # noqa: E402
from bench.serving_metrics import summarize  # noqa: E402
from bench.sse import StreamRecord, record_stream  # noqa: E402

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def request_body(prompt: str, output_len: int, endpoint: str, model: str | None, ignore_eos: bool) -> dict:
    """The streamed greedy request for `prompt` on `endpoint` ("chat" or "completions")."""
    body = {"max_tokens": output_len, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    body.update({"messages": [{"role": "user", "content": prompt}]} if endpoint == "chat" else {"prompt": prompt})
    if model:
        body["model"] = model
    if ignore_eos:
        body["ignore_eos"] = True
    return body


async def run(url: str, bodies: list[dict], concurrency: int, endpoint: str = "chat",
              progress: bool = True) -> dict:
    """Send `bodies` to the server at `url` with at most `concurrency` in flight; returns
    `summarize`'s figures plus ``concurrency`` and ``num_prompts``. A request that fails
    (connection error, non-200, error event) is counted as failed, not raised."""
    import httpx
    from tqdm import tqdm

    records: list[StreamRecord] = []
    errors: list[str] = []
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(bodies), desc=f"c={concurrency}", disable=not progress, file=sys.stderr)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=60), limits=limits) as client:
        async def one(body: dict) -> None:
            async with gate:
                try:
                    records.append(await record_stream(client, url, body, ENDPOINTS[endpoint]))
                except (httpx.HTTPError, RuntimeError) as e:
                    errors.append(f"{type(e).__name__}: {e}"[:300])
                bar.update()

        t0 = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        duration = time.perf_counter() - t0
    bar.close()
    return {"concurrency": concurrency, "num_prompts": len(bodies), **summarize(records, errors, duration)}


def parser() -> argparse.ArgumentParser:
    """The command line (also the workload options `bench.compare` passes on)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="server root, e.g. http://127.0.0.1:30000")
    p.add_argument("--model", default=None, help="the request's model field (omitted when not given)")
    p.add_argument("--num-prompts", type=int, required=True)
    p.add_argument("--concurrency", type=int, required=True, help="requests in flight at most")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens (synthetic prompts)")
    p.add_argument("--output-len", type=int, required=True, help="max_tokens of every request")
    p.add_argument("--shared-prefix-len", type=int, default=0, help="leading prompt tokens all prompts share")
    p.add_argument("--dataset", default=None, help="JSONL file of {\"prompt\": ...} rows instead of synthetic prompts")
    p.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="chat")
    p.add_argument("--tokenizer", default=None, help="model dir/GGUF (or 'default') whose tokenizer sizes the prompts")
    p.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos (for servers that reject it)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic prompts")
    p.add_argument("--json", required=True, help="output file")
    return p


def main() -> None:
    a = parser().parse_args()
    if a.dataset:
        prompts = jsonl_prompts(a.dataset, a.num_prompts)
    else:
        tok = load_tokenizer_for(a.tokenizer) if a.tokenizer else None
        prompts = synthetic_prompts(a.num_prompts, a.input_len, a.shared_prefix_len, tok, a.seed)
    bodies = [request_body(p, a.output_len, a.endpoint, a.model, not a.no_ignore_eos) for p in prompts]
    result = asyncio.run(run(a.url.rstrip("/"), bodies, a.concurrency, a.endpoint))
    result["args"] = vars(a)
    Path(a.json).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("completed", "failed", "output_throughput", "ttft_ms", "itl_ms")}))


if __name__ == "__main__":
    main()
