"""SGLang's batch form of native ``POST /generate``: ``text`` as a list of prompts, or
``input_ids`` as a list of token-id lists. `split` turns a batch into one body per prompt,
each then checked, built and run as a single request is (`request.builder`); the route
answers a list of bodies, choice i of prompt p at index p * n + i (SGLang's order).

`PER_PROMPT` fields may each be one value for every prompt or a list of one value per
prompt, as in SGLang: a list of another length is a 400 naming the field, and so is a list
in a body of one prompt. As SGLang requires, every prompt asks for the same ``n``
(``sampling_params.n``). One ``rid`` for a batch names prompt p ``{rid}_{p}`` (SGLang's
expansion); a list gives each prompt its own.
"""

from __future__ import annotations

from tokenizer_proc.errors import APIError
from tokenizer_proc.native.models import GenerateRequest, given_per_prompt

PER_PROMPT = (
    "sampling_params",
    "rid",
    "return_logprob",
    "top_logprobs_num",
    "token_ids_logprob",
    "logprob_start_len",
    "custom_logit_processor",
)
"""The fields a batch may give per prompt (a list) or once for all prompts."""
NESTED = frozenset({"token_ids_logprob"})
"""`PER_PROMPT` fields whose single value is itself a list: their per-prompt form is a list of lists."""


def prompt_field(req: GenerateRequest) -> str:
    """The field that holds `req`'s prompt or prompts: ``text``, else ``input_ids``."""
    return "text" if req.text is not None else "input_ids"


def listed(req: GenerateRequest) -> frozenset[str]:
    """The fields that `req` gives as lists of per-prompt values: its prompt field when it
    is a batch, and the `PER_PROMPT` fields given as lists."""
    out = {name for name in PER_PROMPT if given_per_prompt(getattr(req, name), name in NESTED)}
    return frozenset(out | ({prompt_field(req)} if req.batch_size is not None else set()))


def check_single(req: GenerateRequest) -> None:
    """A 400 naming the first `PER_PROMPT` field that a body of one prompt gives as a list."""
    each = listed(req)
    many = [name for name in PER_PROMPT if name in each]
    if many:
        raise APIError(
            f"{many[0]}: a list of values is for a batch ({prompt_field(req)} as a list of prompts); a "
            f"single prompt takes one value",
            400,
            many[0],
        )


def split(req: GenerateRequest) -> list[GenerateRequest]:
    """The bodies of `req`'s prompts (`req` a batch: ``batch_size`` is not None), each with
    its own value of every `PER_PROMPT` field (see the module docstring). Raises a 400
    `APIError` for an empty batch, a per-prompt list of another length than the batch, or
    prompts that ask for different n."""
    field = prompt_field(req)
    prompts = getattr(req, field)
    if not prompts:
        raise APIError(f"{field} is an empty list: a batch needs at least one prompt", 400, field)
    each = listed(req)
    values: dict[str, list] = {}
    for name in PER_PROMPT:
        value = getattr(req, name)
        if name in each:
            if len(value) != len(prompts):
                raise APIError(
                    f"{name} is a list of length {len(value)} for a batch of {len(prompts)} prompts "
                    f"({field}): give one value per prompt, or one value for all",
                    400,
                    name,
                )
            values[name] = list(value)
        elif name == "rid" and value is not None:
            values[name] = [f"{value}_{p}" for p in range(len(prompts))]
        else:
            values[name] = [value] * len(prompts)
    ns = [params.n for params in values["sampling_params"]]
    for p, n in enumerate(ns):
        if n != ns[0]:
            raise APIError(
                f"sampling_params.{p}.n is {n} but sampling_params.0.n is {ns[0]}: every prompt of a batch "
                f"asks for the same n",
                400,
                f"sampling_params.{p}.n",
            )
    return [
        req.model_copy(update={field: prompt, **{name: v[p] for name, v in values.items()}})
        for p, prompt in enumerate(prompts)
    ]


def at_prompt(param: str, p: int, each: frozenset[str]) -> str:
    """`param`, a field path of prompt `p`'s own body (`split`), as the batch's body has it:
    with the prompt's index after the field's name when the batch gives that field per
    prompt (``sampling_params.max_new_tokens`` -> ``sampling_params.2.max_new_tokens``; the
    prompt's own field, ``text`` -> ``text.2``); else as it is. each: the fields the batch
    gives per prompt (`listed`), its prompt field among them."""
    head, dot, rest = param.partition(".")
    return f"{head}.{p}{dot}{rest}" if head in each else param


def error_at_prompt(e: APIError, p: int, each: frozenset[str], prompt: str) -> APIError:
    """`e`, raised for prompt `p`'s body (`split`), changed in place to name its field as
    the batch's body has it (`at_prompt`) in its param and message; an error about a field
    the prompts share (one value for all) keeps its param and its message is led by the
    prompt it failed for (`prompt`, e.g. ``text.2``), so that it names the index too."""
    param = e.param
    named = at_prompt(param, p, each) if param else None
    if param and named != param:
        e.param = named
        e.message = e.message.replace(param, named, 1) if param in e.message else f"{named}: {e.message}"
    else:
        e.message = f"{prompt}: {e.message}"
    return e
