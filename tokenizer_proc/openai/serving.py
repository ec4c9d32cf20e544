"""Serving ``/v1/chat/completions`` and ``/v1/completions`` (`OpenAIServing`): a built
request run to its whole response or to its SSE stream, in OpenAI's shapes.

The shape of SGLang's ``OpenAIServingBase``: the route validates the body (pydantic), the
body is converted (`convert.build_chat` / `build_completion`, off the event loop),
and `OpenAIServing.serve` streams or returns it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from protocol.enums import FinishReason
from tokenizer_proc.errors import APIError
from tokenizer_proc.link.tokenizer_manager import TokenizerManager
from tokenizer_proc.openai.render import ChoiceView, Piece, ResponseShape, usage
from tokenizer_proc.output.chat_output import ChatOutput
from tokenizer_proc.request.builder import Built
from tokenizer_proc.request.choices import Totals, check_can_start, merged
from tokenizer_proc.request.fields import StreamOptions
from tokenizer_proc.request.route_run import collect, until_disconnect
from tokenizer_proc.web.sse import SseResponse, error_event, sse


class OpenAIServing:
    """Runs built chat and completions requests. manager: the link to the other processes;
    served_name: the model name responses carry; fingerprint: their ``system_fingerprint``
    (`render.system_fingerprint`); keepalive_s: seconds without an event after which a stream
    gets an SSE comment (`web.sse`; 0 for none)."""

    def __init__(self, manager: TokenizerManager, served_name: str, fingerprint: str, keepalive_s: float) -> None:
        self.manager, self.served_name = manager, served_name
        self.fingerprint, self.keepalive_s = fingerprint, keepalive_s

    async def serve(
        self, request: Request, kind: str, built: Built, stream: bool, options: StreamOptions | None
    ) -> Response:
        """The response to `built`, a request of `kind` ("chat" or "completion"): the whole
        body (a JSONResponse), or with `stream` an SSE stream of chunks ending in ``[DONE]``
        (options: ``stream_options``, whose include_usage adds the usage chunk and whose
        continuous_usage_stats puts usage in every chunk). Raises `APIError` (a 4xx/503)
        when the request cannot start, before a stream's 200."""
        shape = ResponseShape(kind, built.rid, self.served_name, self.fingerprint)
        wants = built.reqs[0].sampling.wants_logprobs
        views = [ChoiceView(kind, wants, built.echo(i), built.head(i)) for i in range(len(built.reqs))]
        outs = [ChatOutput(built.output) for _ in built.reqs] if built.output is not None else None
        totals = Totals(built.prompt_tokens, frozenset(built.leaders))
        if not stream:
            return await self._full(request, built, shape, views, outs, totals)
        return self._stream(kind, built, options, shape, views, outs, totals)

    async def _full(
        self,
        request: Request,
        built: Built,
        shape: ResponseShape,
        views: list[ChoiceView],
        outs: list[ChatOutput] | None,
        totals: Totals,
    ) -> JSONResponse:
        deltas = await until_disconnect(request, collect(self.manager, built))
        choices = []
        for i, (view, ds) in enumerate(zip(views, deltas)):
            pieces: list[Piece] = [view.step(d) for d in ds]
            totals.add(i, ds[-1])
            reason, message = ds[-1].finish_reason, None
            if outs is not None:  # chat: the same reader as the stream's, fed the same text
                for d in ds:
                    outs[i].step(d.text, d.finish_reason is not None, d.finish_reason == FinishReason.LENGTH)
                reason, message = outs[i].finish_reason(reason), outs[i].message()
            choices.append(
                shape.choice(
                    i, "".join(p.text for p in pieces), reason, ds[-1].matched_stop, view.join(pieces), message
                )
            )
        return JSONResponse(shape.full(choices, totals.prompt_tokens, totals.completion_tokens, totals.cached_tokens))

    def _stream(
        self,
        kind: str,
        built: Built,
        options: StreamOptions | None,
        shape: ResponseShape,
        views: list[ChoiceView],
        outs: list[ChatOutput] | None,
        totals: Totals,
    ) -> SseResponse:
        include_usage = bool(options and options.include_usage)
        continuous = include_usage and options.continuous_usage_stats
        hold = check_can_start(self.manager, built.reqs)  # a 4xx/503 status, before the stream's 200

        def event(body: dict, i: int, role: bool = False) -> str:
            """`body`, a chunk of choice `i`, as an SSE event; when continuous usage is asked
            for, with that choice's usage so far, as vLLM counts it: its prompt's tokens (and
            cached tokens) and its own completion tokens (0 in its `role` chunk; the final
            usage chunk sums them);
            else, with include_usage, with a null usage, as OpenAI sends every chunk but the
            usage chunk."""
            if continuous:
                body["usage"] = usage(
                    len(built.reqs[i].input_ids),
                    0 if role else totals.completion.get(i, 0),
                    totals.cached.get(built.leader(i), 0),
                )
            elif include_usage:
                body["usage"] = None
            return sse(body)

        async def events() -> AsyncIterator[str]:
            try:
                # each choice's role chunk; with continuous usage, just before its first delta, whose
                # cached tokens its usage reports (it read 0, and the chunks after it the hit)
                unsent_roles = set(range(len(built.reqs))) if kind == "chat" else set()
                if not continuous:
                    for i in sorted(unsent_roles):
                        yield event(shape.chunk(i, "", role=True), i, role=True)
                    unsent_roles.clear()
                async for i, d in merged(self.manager, built, hold):
                    totals.add(i, d)
                    if i in unsent_roles:
                        unsent_roles.discard(i)
                        yield event(shape.chunk(i, "", role=True), i, role=True)
                    piece, reason = views[i].step(d), d.finish_reason
                    if outs is not None:
                        shown = outs[i].step(d.text, reason is not None, reason == FinishReason.LENGTH)
                        if shown or piece.entries:
                            yield event(
                                shape.chunk(i, None, logprobs=piece.logprobs, delta=shown.delta() or {"content": ""}), i
                            )
                        reason = outs[i].finish_reason(reason)
                    elif piece.text or piece.entries:
                        yield event(shape.chunk(i, piece.text, logprobs=piece.logprobs), i)
                    if reason is not None:
                        yield event(shape.chunk(i, None if kind == "chat" else "", reason, d.matched_stop), i)
                if include_usage:
                    yield sse(shape.usage_chunk(totals.prompt_tokens, totals.completion_tokens, totals.cached_tokens))
            except APIError as e:
                yield error_event(e)
            yield sse("[DONE]")

        return SseResponse(events(), self.keepalive_s, hold)
