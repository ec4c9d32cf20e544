"""``GET /health`` (and ``/ping``, vLLM's and SageMaker's name for it): whether every process
serves, and if not, why."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from protocol.enums import ReplicaState
from tokenizer_proc.errors import error_response
from tokenizer_proc.link.tokenizer_manager import TokenizerManager


async def health(manager: TokenizerManager) -> JSONResponse:
    """200 when every process serves; else a 503 saying why: shutting down, not ready yet,
    the scheduler's loop not answering its health probe (`SchedulerProbe`; this waits for
    the answer, up to --stall-timeout), the worker restarting or silent, no detokenizer
    replica live."""
    if manager.stopping:
        return error_response("server is shutting down", 503)
    if not manager.ready:
        return error_response("server is not ready", 503)
    stalled = await manager.probe.stalled()
    if stalled:
        return error_response(stalled, 503)
    if manager.worker_down:
        return error_response(f"recovering: {manager.worker_down}; requests wait until it is back", 503)
    st = manager.detok_status
    if st is not None and ReplicaState.LIVE not in st.states:
        return error_response(
            "no detokenizer replica is live: requests wait, then fail; attach one with "
            "python -m detokenizer_proc --attach RUN_DIR",
            503,
        )
    return JSONResponse({"status": "ok"})


def detokenizer_replicas(manager: TokenizerManager) -> JSONResponse:
    """The body of ``GET /v1/internal/detokenizers``: the detokenizer replicas as the
    scheduler last reported them (about every 0.5 s), or a 503 before its first report."""
    st = manager.detok_status
    if st is None:
        return error_response("the scheduler has not reported its detokenizer replicas yet", 503)
    replicas = [
        {
            "index": i,
            "pid": pid,
            "state": state.api_str,
            "attached": att,
            "load": load,
            "routed": routed,
            "reseeded": reseeded,
        }
        for i, pid, state, att, load, routed, reseeded in zip(
            st.indexes, st.pids, st.states, st.attached, st.loads, st.routed, st.reseeded
        )
    ]
    return JSONResponse({"replicas": replicas, "waiting": st.waiting, "failed": st.failed, "lost": st.lost})
