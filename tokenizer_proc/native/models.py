"""Request body of SGLang's native ``POST /generate`` (pydantic), its ``sampling_params`` and
the per-prompt form of a batch; built from the shared field types of `request.fields`."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictStr,
    Tag,
    WithJsonSchema,
)

from tokenizer_proc.request.fields import (
    MAX_TOKEN_IDS_LOGPROB,
    TEXT_SCHEMA,
    TOKEN_IDS_SCHEMA,
    Body,
    CacheSalt,
    ClientRid,
    Count,
    Int,
    LogitBias,
    MinP,
    N,
    Penalty,
    RepetitionPenalty,
    Seed,
    StopFields,
    TokenBudget,
    TopK,
    TopLogprobs,
    integer,
)


class NativeSamplingParams(StopFields):
    """``sampling_params`` of the native ``POST /generate`` (SGLang's names; min_new_tokens
    is OpenAI's min_tokens). Unknown keys are a 400 naming the key. json_schema / regex /
    ebnf: structured-output constraints (at most one); custom_params: the JSON arguments of
    the request's custom logit processor; speculative: false opts the request out of the
    server's speculative decoding (``--speculative-algorithm``)."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: TokenBudget | None = None
    min_new_tokens: Count = 0
    temperature: StrictFloat = Field(default=1.0, ge=0)
    top_p: StrictFloat = Field(default=1.0, gt=0, le=1)
    top_k: TopK = -1
    min_p: MinP = 0.0
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    repetition_penalty: RepetitionPenalty = 1.0
    seed: Seed | None = None
    n: N = 1
    logit_bias: LogitBias | None = None
    json_schema: StrictStr | None = None
    regex: StrictStr | None = None
    ebnf: StrictStr | None = None
    custom_params: dict[str, Any] | None = None
    speculative: StrictBool = True


def given_per_prompt(value: Any, nested: bool = False) -> bool:
    """Whether `value`, of a `per_prompt` field, is a list of per-prompt values: an array;
    nested (a field whose single value is itself an array, such as token ids): an array
    whose first item is an array (``[]`` is one empty value)."""
    return isinstance(value, list) and (not nested or (bool(value) and isinstance(value[0], list)))


def per_prompt(one: Any, *, nested: bool = False, item: Any = None) -> Any:
    """The type of a native field that a batch may give per prompt (SGLang's form): `one`
    value, or a list of such values (of `item`, default `one`), one per prompt (their count
    is checked by `native.batch`). A list (`given_per_prompt`) is checked against the list
    member alone, anything else against `one` alone, so an error names the item at fault
    (``sampling_params.1.max_new_tokens``) rather than saying the value is not an object.
    The members' tags, ``one`` and ``list``, are labels that error paths leave out."""
    return Annotated[
        Annotated[one, Tag("one")] | Annotated[list[item or one], Tag("list")],
        Discriminator(lambda value: "list" if given_per_prompt(value, nested) else "one"),
    ]


def _one_or_list(one: dict, *extra: dict) -> Any:
    """The JSON schema of a `per_prompt` field whose items have no schema of their own to
    build it from: `one`, or a non-empty array of it (or one of `extra`)."""
    return WithJsonSchema({"anyOf": [one, {"type": "array", "items": one, "minItems": 1}, *extra]})


_PROMPT_IDS = {**TOKEN_IDS_SCHEMA, "minItems": 1}
_IDS_LOGPROB = {**TOKEN_IDS_SCHEMA, "maxItems": MAX_TOKEN_IDS_LOGPROB}


class GenerateRequest(Body):
    """``POST /generate``: ``text`` or ``input_ids``, ``sampling_params``, ``stream``, and
    SGLang's logprob fields: return_logprob (output logprobs in ``meta_info``),
    top_logprobs_num (top alternatives per token, 0..20), token_ids_logprob (also these ids'
    logprobs at each position), logprob_start_len (-1: no prompt logprobs; s >= 0: the
    prompt's from position s on). The last three need return_logprob. custom_logit_processor:
    the name of an operator-installed processor (needs ``--enable-custom-logit-processor``).

    A batch (SGLang's form): ``text`` as a list of prompts or ``input_ids`` as a list of
    token-id lists; then sampling_params, rid, the logprob fields and custom_logit_processor
    may each be one value for all prompts or a list of one per prompt (see `native.batch`).
    A single prompt takes one value of each."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["text"]}, {"required": ["input_ids"]}]})

    text: Annotated[per_prompt(StrictStr) | None, _one_or_list(TEXT_SCHEMA)] = None
    input_ids: Annotated[per_prompt(list[Int], nested=True) | None, _one_or_list(_PROMPT_IDS)] = None
    sampling_params: per_prompt(NativeSamplingParams) = NativeSamplingParams()
    stream: StrictBool = False
    rid: per_prompt(ClientRid) | None = None
    return_logprob: per_prompt(StrictBool) = False
    top_logprobs_num: per_prompt(TopLogprobs) = 0
    token_ids_logprob: Annotated[
        per_prompt(Annotated[list[Int], Field(max_length=MAX_TOKEN_IDS_LOGPROB)], nested=True) | None,
        _one_or_list(_IDS_LOGPROB, {"type": "null"}),
    ] = None
    logprob_start_len: per_prompt(integer(ge=-1)) = -1
    custom_logit_processor: per_prompt(StrictStr, item=StrictStr | None) | None = None
    cache_salt: CacheSalt | None = None

    @property
    def batch_size(self) -> int | None:
        """How many prompts the body holds when it is a batch (``text`` a list, or
        ``input_ids`` a list of lists); None for a single prompt."""
        if given_per_prompt(self.text):
            return len(self.text)
        if given_per_prompt(self.input_ids, nested=True):
            return len(self.input_ids)
        return None
