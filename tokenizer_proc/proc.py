"""The tokenizer process: loads the tokenizer and serves HTTP with uvicorn on uvloop.

Launch's `STOP_SIGNAL` (after the drain) stops uvicorn and fails the requests still in flight
with a 503; so does launch's `TokenizerShutdown` (the scheduler died), with its reason, and
the process then stops on its own (launch waits for that before its signals, so the reason,
not a generic one, reaches the streams in flight). A SIGTERM while launch lives asks launch to
drain, and SIGINT is ignored, as in the other children
(`protocol.process.install_stop_handlers`): launch alone decides how the server stops (it
drains first).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import uvicorn
import zmq

from protocol.config import ServerArgs
from protocol.enums import Role
from protocol.process import Handshake, configure_logging, exit_now, install_stop_handlers, start_child
from text.hf_tokenizer import load_tokenizer, model_facts, write_tokenizer_class
from tokenizer_proc.app import create_app
from tokenizer_proc.link.tokenizer_manager import TokenizerManager
from tokenizer_proc.request.builder import RequestBuilder
from tokenizer_proc.structured.tokenizer_info import write_grammar_tokenizer
from tokenizer_proc.tools.parsers import resolve


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handling, which `serve` does instead (see the module
    docstring). uvicorn raises a signal it caught again once it has shut down, and that SIGTERM
    killed this process before its clean-up (the sockets' close, the ``tokenizer stopped`` line
    every other child logs)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(args: ServerArgs, hs: Handshake, log) -> None:
    """Build the app, start uvicorn, report Ready once it listens, serve until signalled."""
    tokenizer = load_tokenizer(args.model)
    write_tokenizer_class(args.run_dir, tokenizer)  # the detokenizer replicas load this class
    facts = model_facts(args.model, tokenizer, args.context_length)
    write_grammar_tokenizer(args.run_dir, tokenizer, facts)  # ~0.25 s for SmolLM2; the scheduler reads it
    prompt_text = tokenizer.decode if args.log_requests else None  # request log lines hold text only if asked
    manager = TokenizerManager(
        args.run_dir, log, args.max_running_requests, args.max_queued_requests, prompt_text, args.stall_timeout
    )
    manager.start()
    names = (args.model.served_name, args.model.path)
    builder = RequestBuilder(
        tokenizer,
        facts,
        names,
        args.max_n,
        args.max_batch_choices,
        args.enable_custom_logit_processor,
        resolve(args.tool_call_parser, tokenizer.chat_template),
        args.reasoning_parser or None,
        args.default_max_tokens,
    )
    # the settings that change the answers (not ports, limits or logging), for system_fingerprint
    settings = (
        args.model,
        args.load_format,
        args.tp,
        args.tool_call_parser,
        args.reasoning_parser,
        args.logit_processor_module,
        args.default_max_tokens,
    )
    app = create_app(
        manager,
        builder,
        args.model.served_name,
        api_key=args.api_key,
        max_body_bytes=args.max_request_body_bytes,
        keepalive_s=args.sse_keepalive_s,
        log_requests=args.log_requests,
        settings=settings,
        server_args=args,
        allowed_origins=args.allowed_origins,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        loop="none",
        lifespan="off",
        timeout_graceful_shutdown=5,
    )
    server = _Server(config)
    install_stop_handlers(lambda: setattr(server, "should_exit", True), log)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # raises what uvicorn raised
            raise OSError(f"could not listen on {args.host}:{args.port} (is the port in use?)")
        await asyncio.sleep(0.05)
    hs.ready(f"context_length={facts.context_length} eos={list(facts.eos_token_ids)}")
    while not task.done() and not server.should_exit and manager.shutdown_reason is None:
        await asyncio.sleep(0.05)
    server.should_exit = True
    manager.fail_all(manager.shutdown_reason or "server is shutting down")  # a 503, not a dropped connection
    await task
    manager.close()


def main(run_dir: str) -> None:
    """Entry point: ``python -m tokenizer_proc RUN_DIR``."""
    start_child("lazyserve::tokenizer")
    args = ServerArgs.load(run_dir)
    log = configure_logging(args.log_level, args.log_format, proc="tokenizer")
    hs = Handshake(zmq.Context.instance(), run_dir, Role.TOKENIZER)
    try:
        import uvloop

        uvloop.run(serve(args, hs, log))
    except (Exception, SystemExit) as e:
        hs.failed(e if isinstance(e, Exception) else OSError(f"could not listen on {args.host}:{args.port}"))
        hs.close()
        raise SystemExit(1) from None
    hs.close()
    log.info("tokenizer stopped")
    exit_now(0)
