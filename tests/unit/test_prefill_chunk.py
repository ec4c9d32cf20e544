"""The scheduler's prefill chunk: ``--chunked-prefill-size`` at most one model call of the
worker's prefills, so that a request cancelled after its launch costs the others at most
that call (issue 40, item 4)."""

from __future__ import annotations

import pytest

from protocol.messages import WorkerReady
from scheduler_proc.proc import prefill_chunk, resolved_settings


def ready(call: int) -> WorkerReady:
    return WorkerReady(1000, 64, 2048, prefill_call_tokens=call)


@pytest.mark.parametrize(
    "asked,call,chunk",
    [
        (2048, 512, 512),  # the CPU worker calls the model on 512 tokens at a time
        (2048, 2048, 2048),  # a GPU worker's call holds the whole chunk
        (256, 512, 256),  # a smaller chunk asked for stays
        (0, 512, 0),  # chunking off: prompts whole, as asked
        (2048, 0, 2048),  # a worker that does not say
    ],
)
def test_the_chunk_is_at_most_one_model_call(asked, call, chunk):
    assert prefill_chunk(asked, ready(call)) == chunk


def test_server_info_reports_the_chunk_and_the_call():
    values = resolved_settings(ready(512), 512).values
    assert values["chunked_prefill_size"] == 512 and values["prefill_call_tokens"] == 512
