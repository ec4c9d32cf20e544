"""A request's logprobs in the scheduler: kept until the request ends, so that a lost
detokenizer replica's requests are re-seeded with them, and forwarded as `BatchTokenOut`
columns (the worker computes them; see worker_proc/logits/logprobs.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.messages import TokenLogprobs


def join(parts: list[TokenLogprobs]) -> TokenLogprobs:
    """Consecutive positions' logprobs as one `TokenLogprobs` (parts in order)."""
    if len(parts) == 1:
        return parts[0]
    cols = ([], [], [], [], [])
    for p in parts:
        for col, values in zip(cols, (p.token_ids, p.logprobs, p.top_ids, p.top_logprobs, p.ids_logprobs)):
            col.extend(values)
    return TokenLogprobs(*cols)


def position(tl: TokenLogprobs, j: int) -> TokenLogprobs:
    """Position j of a several-position `TokenLogprobs`, alone."""
    return TokenLogprobs(
        [tl.token_ids[j]],
        [tl.logprobs[j]],
        [tl.top_ids[j]] if tl.top_ids else [],
        [tl.top_logprobs[j]] if tl.top_logprobs else [],
        [tl.ids_logprobs[j]] if tl.ids_logprobs else [],
    )


@dataclass
class ReqLogprobs:
    """output[j]: the logprobs of the request's j-th output token (an EOS or stop token that
    ends it too: it is not rendered, but usage counts it, and so it has an entry, as in vLLM
    and SGLang); prompt: the prompt's logprobs, in
    chunks, complete once the prompt is prefilled; prompt_sent: whether they went out."""

    output: list[TokenLogprobs] = field(default_factory=list)
    prompt: list[TokenLogprobs] = field(default_factory=list)
    prompt_sent: bool = False

    def columns(self, n_new: int, replay: bool) -> tuple[TokenLogprobs | None, int, TokenLogprobs | None]:
        """The `BatchTokenOut` columns of a row that carries the last `n_new` output tokens
        (an ending EOS or stop token counted, though not rendered; replay: every token from the first, for a re-seeded replica): (their logprobs or
        None, the index of the first, the prompt's logprobs when not sent yet or replaying)."""
        entries = self.output if replay else self.output[len(self.output) - n_new :] if n_new else []
        out = join(entries) if entries else None
        prompt = None
        if self.prompt and (replay or not self.prompt_sent):
            prompt, self.prompt_sent = join(self.prompt), True
        return out, len(self.output) - len(entries), prompt
