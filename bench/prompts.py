"""Prompts for the serving benchmark: synthetic ones of a given token length (optionally
sharing a prefix), or the prompts of a JSONL file."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = [
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "community",
    "name",
    "president",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
]
"""Common English words, about one token each for most tokenizers."""


def load_tokenizer_for(model: str):
    """The Hugging Face tokenizer lazyserve would use for `model` (a model directory, a GGUF
    file, or ``default`` for lazyserve's default model). Raises `FileNotFoundError` /
    `ValueError` as `protocol.model_source.resolve_model` does."""
    from protocol.model_source import resolve_model
    from text.hf_tokenizer import load_tokenizer

    return load_tokenizer(resolve_model(None if model == "default" else model))


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """Token ids of `prompt` sent as one user message, rendered by `tokenizer`'s chat template
    with the generation prompt and encoded without added special tokens, as lazyserve's HTTP
    front does. Raises `ValueError` when the tokenizer has no chat template."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(text, add_special_tokens=False)


def _text(rng: random.Random, tokens: int, tokenizer) -> str:
    """Random words of about `tokens` tokens: exactly `tokens` by `tokenizer` before decoding
    (None: one word per token)."""
    words = " ".join(rng.choice(WORDS) for _ in range(tokens if tokenizer is None else 2 * tokens + 8))
    if tokenizer is None:
        return words
    return tokenizer.decode(tokenizer.encode(words, add_special_tokens=False)[:tokens])


def synthetic_prompts(n: int, input_len: int, shared_prefix_len: int = 0, tokenizer=None, seed: int = 0) -> list[str]:
    """`n` prompts of about `input_len` tokens each (before any chat template), the first
    `shared_prefix_len` of them the same in every prompt. Raises `ValueError` when
    shared_prefix_len > input_len or input_len < 1."""
    if input_len < 1 or not 0 <= shared_prefix_len <= input_len:
        raise ValueError(
            f"need 1 <= input_len and 0 <= shared_prefix_len <= input_len, got {input_len}, {shared_prefix_len}"
        )
    rng = random.Random(seed)
    prefix = _text(rng, shared_prefix_len, tokenizer) if shared_prefix_len else ""
    rest = input_len - shared_prefix_len
    return [" ".join(filter(None, (prefix, _text(rng, rest, tokenizer) if rest else ""))) for _ in range(n)]


def jsonl_prompts(path: str | Path, n: int) -> list[str]:
    """The first `n` prompts of a JSONL file, each line an object with a ``prompt`` (or
    ``text``) string, cycled when the file has fewer. Raises `ValueError` naming the file
    and line for a line without one, or for a file with no lines."""
    prompts = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        text = row.get("prompt", row.get("text")) if isinstance(row, dict) else None
        if not isinstance(text, str):
            raise ValueError(f"{path}:{i}: expected an object with a 'prompt' or 'text' string")
        prompts.append(text)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return [prompts[i % len(prompts)] for i in range(n)]
