"""Loading the model's tokenizer and chat template through transformers (DESIGN.md §5).

A GGUF tokenizer is converted by transformers (``gguf_file=``, needs the `gguf` package),
which takes seconds; the result is saved once into lazyserve's cache directory, keyed by
the file's path, size and mtime, and loaded from there afterwards. A file lock makes the
tokenizer and detokenizer processes, which start together, convert only once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from protocol.config import ModelSource
from protocol.model_source import cache_dir


@dataclass(frozen=True)
class ModelFacts:
    """What the HTTP front needs to know about the model.

    context_length: max tokens (prompt + output); eos_token_ids: tokenizer EOS plus the
    generation config's EOS ids; vocab_size: number of token ids the model scores.
    """

    context_length: int
    eos_token_ids: tuple[int, ...]
    vocab_size: int


def _gguf_cache_key(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]


def load_tokenizer(source: ModelSource):
    """Return a transformers tokenizer for `source` (chat template included).

    Raises `ValueError` naming ``source.path`` when its files hold no readable tokenizer
    (missing, truncated or corrupt: transformers, tokenizers and gguf raise errors such as
    ``JSONDecodeError`` or ``struct.error`` that do not say which file they read).
    """
    try:
        return _load_tokenizer(source)
    except Exception as e:
        raise ValueError(f"{source.path}: cannot load the tokenizer: {type(e).__name__}: {e}") from e


def _load_tokenizer(source: ModelSource):
    from transformers import AutoTokenizer

    if source.kind == "hf":
        return AutoTokenizer.from_pretrained(source.path)
    path = Path(source.path)
    target = cache_dir() / "tokenizers" / _gguf_cache_key(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(str(target) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "tokenizer_config.json").exists():
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            tmp = Path(str(target) + f".tmp{os.getpid()}")
            tok.save_pretrained(str(tmp))
            (tmp / GGUF_FACTS).write_text(json.dumps(_read_gguf_facts(path)))
            os.replace(tmp, target)
    return AutoTokenizer.from_pretrained(str(target))


GGUF_FACTS = "lazyserve_gguf_facts.json"


def _read_gguf_facts(path: Path) -> dict:
    """context_length, vocab_size and eos id from GGUF metadata (the reader takes seconds,
    so this runs once, beside the tokenizer conversion)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    field = lambda k: reader.fields[k].contents() if k in reader.fields else None  # noqa: E731
    arch = field("general.architecture")
    return {
        "context_length": field(f"{arch}.context_length"),
        "vocab_size": field(f"{arch}.vocab_size"),
        "eos_token_id": field("tokenizer.ggml.eos_token_id"),
    }


def _ints(v: object) -> list[int]:
    if v is None:
        return []
    return [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)]


SCALED_ROPE_TYPES = ("linear", "dynamic", "yarn")
"""RoPE scalings whose ``factor`` stretches ``max_position_embeddings`` (as vLLM derives the
longest context); llama3 and longrope configs state their extended length there already."""


def _scaled_context(config: dict, ctx: int | None) -> int | None:
    """The longest context `config` supports: `ctx` (its ``max_position_embeddings``), times
    the ``factor`` of a `SCALED_ROPE_TYPES` ``rope_scaling`` (yarn from its
    ``original_max_position_embeddings`` when given); None when `ctx` is."""
    scaling = config.get("rope_scaling") or config.get("text_config", {}).get("rope_scaling") or {}
    kind = scaling.get("rope_type") or scaling.get("type")
    if not ctx or kind not in SCALED_ROPE_TYPES or not scaling.get("factor"):
        return ctx
    base = scaling.get("original_max_position_embeddings", ctx) if kind == "yarn" else ctx
    return max(ctx, int(base * float(scaling["factor"])))


def model_facts(source: ModelSource, tokenizer, context_length: int | None = None) -> ModelFacts:
    """Context length, EOS ids and vocab size of `source`; `context_length` (``--context-length``)
    overrides the model's own (``max_position_embeddings``), up to the longest its RoPE scaling
    allows (`_scaled_context`). Raises `ValueError` naming the file when they
    cannot be read, and naming the flag when `context_length` is longer than the model's
    (positions it was never trained on: vLLM and SGLang refuse that too)."""
    eos = set(_ints(tokenizer.eos_token_id))
    if source.kind == "gguf":
        facts = json.loads((Path(tokenizer.name_or_path) / GGUF_FACTS).read_text())
        ctx = limit = facts["context_length"]
        vocab = facts["vocab_size"] or len(tokenizer)
        eos.update(_ints(facts["eos_token_id"]))
    else:
        root = Path(source.path)
        config = json.loads((root / "config.json").read_text())
        ctx = config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings")
        limit = _scaled_context(config, ctx)
        vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size") or len(tokenizer)
        eos.update(_ints(config.get("eos_token_id")))
        gen = root / "generation_config.json"
        if gen.exists():
            eos.update(_ints(json.loads(gen.read_text()).get("eos_token_id")))
    if context_length and limit and context_length > int(limit):
        raise ValueError(f"--context-length {context_length} is longer than the {int(limit)} tokens this model "
                         f"supports ({source.path}): it was never trained on later positions; use at most "
                         f"{int(limit)}")
    ctx = context_length or ctx
    if not ctx:
        raise ValueError(f"{source.path}: the model states no context length; pass --context-length")
    return ModelFacts(int(ctx), tuple(sorted(eos)), int(vocab))
