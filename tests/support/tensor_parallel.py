"""Tensor-parallel test helpers: `tp1` (a fixture, registered by tests/e2e/conftest.py: the
unsharded tiny model in this process, the reference of the ``--tp`` servers), the prompts,
and native /generate bodies sent all at once."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from protocol.config import ModelSource
from protocol.messages import SamplingParams
from tests.support.worker_runs import run

MAX_TOKENS = 8
CHUNK = 16  # --chunked-prefill-size: the 40-token prompt is prefilled in 3 chunks


def prompt(n: int, salt: int = 0) -> list[int]:
    """`n` token ids spread over the vocabulary."""
    return [1 + (i * 7919 + salt * 104729) % 49000 for i in range(n)]


PROMPTS = [prompt(5), prompt(11, 1), prompt(40, 2)]


@pytest.fixture(scope="module")
def tp1(tiny_model_dir):
    """tp1(ids, params) -> the `MAX_TOKENS` tokens and logprobs of the unsharded model
    (`ModelRunner` in this process)."""
    from worker_proc.model.loader import load
    from worker_proc.model.runner import ModelRunner

    loaded = load(ModelSource("hf", str(tiny_model_dir), "tiny"))

    def reference(ids: list[int], params: SamplingParams) -> tuple[list[int], list]:
        toks, lps = run(ModelRunner(loaded), {"r": ids}, {"r": params}, MAX_TOKENS)
        return toks["r"], lps["r"]

    return reference


def native(ids: list[int], stream_: bool = False, **sampling) -> dict:
    """A /generate body for `ids`: `MAX_TOKENS` tokens, EOS ignored, logprobs returned."""
    return {
        "input_ids": ids,
        "stream": stream_,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0.0, **sampling},
    }


def ids_of(body: dict) -> list[int]:
    return [t for _, t, _ in body["meta_info"]["output_token_logprobs"]]


async def generate_all(url: str, bodies: list[dict]) -> list[dict]:
    """POST every body to /generate at once (they batch); their JSON answers."""
    async with httpx.AsyncClient(timeout=60) as c:
        answers = await asyncio.gather(*(c.post(f"{url}/generate", json=b) for b in bodies))
    for a in answers:
        assert a.status_code == 200, a.text
    return [a.json() for a in answers]
