"""Logprob entries (`LogprobEntries`, rendered by a detokenizer replica) in each API's shape.

- Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}``.
- Completions: ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``
  (each top_logprobs dict holds the top alternatives plus the chosen token, so up to k + 1,
  unless the chosen token shows no text yet and is one of them; keyed by text: tokens that render alike, such as byte tokens that each decode alone to
  U+FFFD, share one key, which holds the highest of their logprobs).
- Native (SGLang): ``[logprob, token_id, token_text]`` triples, per position a list of them
  for the top alternatives and for the requested ``token_ids_logprob``.

A *head* entry stands for the prompt's first token, which has no logprob: its logprob and
top alternatives are null. Logprobs below `LOGPROB_FLOOR` (a token masked to -inf by
logit_bias, min_tokens or a grammar) are reported as `LOGPROB_FLOOR`: JSON has no infinity
(vLLM does the same). Every function here is pure: a chunk's part is formatted from the
chunk's entries alone, so joining the streamed parts gives the non-streamed value.
"""

from __future__ import annotations

from protocol.messages import LogprobEntries
from text.token_pieces import TokenPieces

LOGPROB_FLOOR = -9999.0
"""The smallest logprob shown; -inf and anything below (or NaN) becomes this."""


def shown(logprob: float) -> float:
    """`logprob` as JSON can carry it (see `LOGPROB_FLOOR`)."""
    return logprob if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR


def _top(e: LogprobEntries, j: int) -> list[tuple[int, str, bytes, float]]:
    """Entry j's top alternatives as (id, text, bytes, logprob), most likely first."""
    if not e.top_ids:
        return []
    return list(zip(e.top_ids[j], e.top_tokens[j], e.top_bytes[j], e.top_logprobs[j]))


# --------------------------------------------------------------------------- chat
def chat_content(e: LogprobEntries) -> list[dict]:
    """The chat ``logprobs.content`` items of `e`'s entries."""
    return [
        {
            "token": e.tokens[j],
            "logprob": shown(e.logprobs[j]),
            "bytes": list(e.token_bytes[j]),
            "top_logprobs": [{"token": t, "logprob": shown(lp), "bytes": list(b)} for _, t, b, lp in _top(e, j)],
        }
        for j in range(len(e.token_ids))
    ]


# --------------------------------------------------------------------------- completions
COMPLETION_KEYS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


def completion_part(e: LogprobEntries, offset: int, head: bool = False) -> tuple[dict, int]:
    """`e`'s entries as completions logprobs lists, the first token at character `offset`
    of the returned text; returns them and the offset after the last. head: `e` is the
    prompt's first token (null logprob and top_logprobs). A top_logprobs key that several
    tokens render to holds the highest of their logprobs (see the module docstring)."""
    part: dict[str, list] = {k: [] for k in COMPLETION_KEYS}
    for j, token in enumerate(e.tokens):
        part["tokens"].append(token)
        part["text_offset"].append(offset)
        offset += len(token)
        if head:
            part["token_logprobs"].append(None)
            part["top_logprobs"].append(None)
            continue
        lp = shown(e.logprobs[j])
        top: dict[str, float] = {}
        alternatives = _top(e, j)
        # a chosen token that shows no text yet (a character's first bytes) and is listed
        # among the alternatives adds no "" key: that key would name no token
        listed = any(i == e.token_ids[j] for i, _, _, _ in alternatives)
        chosen = [] if listed and not token else [(token, lp)]
        for t, tlp in [(t, shown(tlp)) for _, t, _, tlp in alternatives] + chosen:
            if t not in top or tlp > top[t]:
                top[t] = tlp
        part["token_logprobs"].append(lp)
        part["top_logprobs"].append(top)
    return part, offset


def join_completion(parts: list[dict]) -> dict:
    """Completions logprobs parts (of chunks, in order) as one."""
    return {k: [x for p in parts for x in p[k]] for k in COMPLETION_KEYS}


# --------------------------------------------------------------------------- native
def native_tokens(e: LogprobEntries, head: bool = False) -> list[list]:
    """``[[logprob, token_id, token_text], ...]`` (logprob None for a head entry)."""
    return [[None if head else shown(e.logprobs[j]), t, e.tokens[j]] for j, t in enumerate(e.token_ids)]


def native_top(e: LogprobEntries, head: bool = False) -> list[list[list] | None]:
    """Per position, the top alternatives as ``[logprob, token_id, token_text]`` (None for a head entry)."""
    return [None if head else [[shown(lp), i, t] for i, t, _, lp in _top(e, j)] for j in range(len(e.token_ids))]


def native_ids(e: LogprobEntries, ids: list[int], pieces: TokenPieces, head: bool = False) -> list[list[list] | None]:
    """Per position, the logprobs of the requested `ids` as ``[logprob, token_id, token_text]``."""
    if head:
        return [None] * len(e.token_ids)
    return [
        [[shown(lp), i, pieces.text(i)] for i, lp in zip(ids, e.ids_logprobs[j])] if e.ids_logprobs else []
        for j in range(len(e.token_ids))
    ]
