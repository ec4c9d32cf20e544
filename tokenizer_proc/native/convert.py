"""Native ``/generate`` bodies as `GenerateReq` messages (`build_native`): one prompt, or a
batch of them (`batch`), on the shared checks of `RequestBuilder`."""

from __future__ import annotations

from tokenizer_proc.errors import APIError
from tokenizer_proc.native.batch import at_prompt, check_single, error_at_prompt, listed, prompt_field, split
from tokenizer_proc.native.models import GenerateRequest, NativeSamplingParams
from tokenizer_proc.request.builder import Built, LogprobAsk, RequestBuilder, new_rid, request_fields
from tokenizer_proc.request.fan_out import choice_rid, fan_out
from tokenizer_proc.request.unsupported import MISPLACED, NATIVE, Refusal, refuse_unsupported
from tokenizer_proc.structured.check import NATIVE_FIELDS, from_native

NATIVE_MAX_NEW_TOKENS = 128
"""Native ``max_new_tokens`` when a request does not give it (SGLang's default), cut to the
room the context leaves (``--default-max-tokens`` replaces it)."""

REFUSED = {
    **NATIVE,
    **{
        name: Refusal("it is a sampling parameter: put it inside sampling_params", says=MISPLACED)
        for name in NativeSamplingParams.model_fields
        if name not in GenerateRequest.model_fields and name not in NATIVE
    },
}
"""The fields native ``/generate`` refuses at its top level: `unsupported.NATIVE`, and every
``sampling_params`` field given there (``{"text", "regex"}`` or ``{"text", "max_new_tokens"}``
would otherwise run unconstrained or with the default budget)."""


def _native_ask(req: GenerateRequest) -> LogprobAsk:
    """The logprob fields of a native request; they need return_logprob (else a 400), but
    ``logprob_start_len: 0`` beside ``return_logprob: false`` asks for nothing and is taken
    (SGLang's own clients send that pair on every request)."""
    if req.return_logprob:
        return LogprobAsk(req.top_logprobs_num, tuple(req.token_ids_logprob or ()), req.logprob_start_len)
    for field, unset in (
        ("top_logprobs_num", req.top_logprobs_num == 0),
        ("token_ids_logprob", not req.token_ids_logprob),
        ("logprob_start_len", req.logprob_start_len <= 0),
    ):
        if not unset:
            raise APIError(f"{field} needs return_logprob: true", 400, field)
    return LogprobAsk()


def build_native(b: RequestBuilder, req: GenerateRequest) -> Built:
    """Checks and tokenizes a native ``/generate`` request: one prompt, or a batch of
    them (`native.batch`), choice i of prompt p at index p * n + i. Every prompt is
    checked here, before anything is sent, so a bad one refuses the whole batch with a 400
    naming its index. Raises `APIError`."""
    refuse_unsupported(req.model_extra, REFUSED)
    if (req.text is None) == (req.input_ids is None):
        raise APIError("give exactly one of text and input_ids", 400, "text")
    if req.batch_size is None:
        check_single(req)
        return _native_prompt(b, req)
    parts = split(req)
    field, each, n = prompt_field(req), listed(req), parts[0].sampling_params.n
    b.check_batch(len(parts), n, field)
    reqs, heads, rids, fields = [], [], [], []
    for p, part in enumerate(parts):
        try:
            built = _native_prompt(b, part)
        except APIError as e:
            raise error_at_prompt(e, p, each, f"{field}.{p}") from None
        reqs += built.reqs
        heads += built.heads
        rids += built.client_rids
        fields += [{k: at_prompt(name, p, each) for k, name in f.items()} for f in built.fields]
    seen: set[str] = set()
    for i, rid in enumerate(rids):
        if rid in seen:
            param = at_prompt("rid", i // n, each)
            raise APIError(
                f"{param}: request id {rid!r} is given twice in this batch (choice i > 0 of a "
                f"prompt whose id is R is shown as R-i)",
                400,
                param,
            )
        seen.add(rid)
    return Built(reqs, (), tuple(heads), client_rids=tuple(rids), fields=tuple(fields))


def _native_prompt(b: RequestBuilder, req: GenerateRequest) -> Built:
    """Checks and tokenizes a native body of one prompt (a batch's: `native.batch.split`)."""
    if req.input_ids is not None:
        ids = list(req.input_ids)
        b.check_ids(ids, "input_ids")
    else:
        ids = b.encode(req.text, prompt_field(req)) if req.text else []
    field = prompt_field(req)
    if not ids:
        raise APIError(f"{field}: the prompt is empty (it has no tokens)", 400, field)
    p = req.sampling_params
    b.check_n(p.n, "sampling_params.n")
    max_new = b.max_new_tokens(
        p.max_new_tokens, len(ids), "sampling_params.max_new_tokens", field, NATIVE_MAX_NEW_TOKENS
    )
    gen = b.build(
        new_rid(f"{req.rid or 'gen'}-"),
        ids,
        max_new,
        p,
        logit_bias=b.logit_bias(p.logit_bias, "sampling_params.logit_bias"),
        min_tokens=p.min_new_tokens,
        min_tokens_param="sampling_params.min_new_tokens",
        ask=_native_ask(req),
        grammar=from_native(p.json_schema, p.regex, p.ebnf),
        processor=b.processor(req.custom_logit_processor, p.custom_params, "sampling_params.custom_params"),
        cache_salt=req.cache_salt,
        sampling_field="sampling_params.",
    )
    grammar = next(
        (NATIVE_FIELDS + name for name in ("json_schema", "regex", "ebnf") if getattr(p, name) is not None), None
    )
    fields = request_fields(field, grammar, rid="rid" if req.rid is not None else None)
    client_rids = tuple(choice_rid(req.rid, i) for i in range(p.n)) if req.rid else ()
    return Built(fan_out(gen, p.n), (), (b.head(gen),) * p.n, client_rids=client_rids, fields=(fields,) * p.n)
