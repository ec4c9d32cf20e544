"""Loading the model's tokenizer and chat template through transformers (DESIGN.md §5).

A GGUF tokenizer is converted by transformers (``gguf_file=``, needs the `gguf` package),
which takes seconds; the result is saved once into lazyserve's cache directory, keyed by
the file's path, size and mtime, and loaded from there afterwards. A file lock makes the
processes that load it convert only once.

The tokenizer process loads through ``AutoTokenizer`` and writes the class it chose into the
run directory (`write_tokenizer_class`); a detokenizer replica loads that class directly
(`load_resolved_tokenizer`). Importing ``AutoTokenizer`` imports transformers' model
configuration code and with it torch: 1.3 s and 125 MB for a replica that loads the class,
4.1 s and 312 MB through ``AutoTokenizer`` (SmolLM2's tokenizer on this 2-core machine).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from protocol.config import ModelSource
from protocol.endpoints import TOKENIZER_CLASS_FILE, write_run_file
from protocol.model_source import cache_dir, gguf_metadata

CLASS_WAIT_S = 120.0
"""How long a detokenizer replica waits for `TOKENIZER_CLASS_FILE` before it loads through
``AutoTokenizer`` itself (a replica attached to a running server finds the file at once)."""
CLASS_POLL_S = 0.05
"""How often it looks (seconds)."""


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


def load_tokenizer(source: ModelSource, cls: type | None = None):
    """Return a transformers tokenizer for `source` (chat template included), loaded through
    ``AutoTokenizer`` or, given `cls`, through that tokenizer class's ``from_pretrained``.

    Raises `ValueError` naming ``source.path`` when its files hold no readable tokenizer
    (missing, truncated or corrupt: transformers, tokenizers and gguf raise errors such as
    ``JSONDecodeError`` or ``struct.error`` that do not say which file they read).
    """
    try:
        if cls is None:
            from transformers import AutoTokenizer

            cls = AutoTokenizer
        return cls.from_pretrained(tokenizer_dir(source))
    except Exception as e:
        raise ValueError(f"{source.path}: cannot load the tokenizer: {type(e).__name__}: {e}") from e


def tokenizer_dir(source: ModelSource) -> str:
    """The directory the tokenizer of `source` loads from: the model directory, or for a GGUF
    file its converted copy in the cache (converted here, under the lock, when absent)."""
    if source.kind == "hf":
        return source.path
    path = Path(source.path)
    target = cache_dir() / "tokenizers" / _gguf_cache_key(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(str(target) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "tokenizer_config.json").exists():
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            tmp = Path(str(target) + f".tmp{os.getpid()}")
            tok.save_pretrained(str(tmp))
            os.replace(tmp, target)
    return str(target)


def write_tokenizer_class(run_dir: str | Path, tokenizer) -> None:
    """Write the class of `tokenizer` (loaded by `load_tokenizer`) as ``run_dir /
    TOKENIZER_CLASS_FILE``, atomically (`write_run_file`). Raises `OSError` when it cannot be
    written."""
    cls = type(tokenizer)
    write_run_file(run_dir, TOKENIZER_CLASS_FILE, json.dumps({"module": cls.__module__, "name": cls.__qualname__}))


def load_resolved_tokenizer(source: ModelSource, run_dir: str | Path, wait_s: float = CLASS_WAIT_S):
    """The tokenizer `load_tokenizer` gives, loaded as the class the tokenizer process wrote
    (`write_tokenizer_class`) with that class's own ``from_pretrained``, which is what
    ``AutoTokenizer.from_pretrained`` calls once it chose the class. Waits up to `wait_s`
    seconds for the file (the processes start together: the tokenizer process writes it a few
    seconds in), polling every `CLASS_POLL_S`; without it, or when the class cannot be
    imported, loads through `load_tokenizer`. Raises `ValueError` as `load_tokenizer` does."""
    path = Path(run_dir) / TOKENIZER_CLASS_FILE
    deadline = time.monotonic() + wait_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(CLASS_POLL_S)
    try:
        named = json.loads(path.read_text())
        cls = getattr(importlib.import_module(named["module"]), named["name"])
    except (OSError, ValueError, KeyError, TypeError, ImportError, AttributeError):
        return load_tokenizer(source)
    return load_tokenizer(source, cls)


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


def context_limits(source: ModelSource) -> tuple[int | None, int | None]:
    """The context length of `source` (``max_position_embeddings``, or the GGUF's
    ``ARCH.context_length``) and the longest ``--context-length`` it supports (stretched by its
    RoPE scaling, `_scaled_context`); None where the model does not say. Reads config.json or
    the GGUF header only (no weights, no tokenizer), so launch checks the flag in a moment.
    Raises `ValueError` naming the file when it cannot be read."""
    if source.kind == "gguf":
        metadata = gguf_metadata(Path(source.path))
        ctx = metadata.get(f"{metadata.get('general.architecture')}.context_length")
        return ctx, ctx
    config = json.loads((Path(source.path) / "config.json").read_text())
    ctx = config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings")
    return ctx, _scaled_context(config, ctx)


def served_context_length(source: ModelSource, requested: int | None = None) -> int:
    """The context length to serve: `requested` (``--context-length``) or the model's own
    (`context_limits`). Raises `ValueError` naming the flag and the model's limit when
    `requested` is longer (positions the model was never trained on: vLLM and SGLang refuse
    that too), and naming the model when it states no context length and none is requested."""
    ctx, limit = context_limits(source)
    if requested and limit and requested > int(limit):
        raise ValueError(
            f"--context-length {requested} is longer than the {int(limit)} tokens this model "
            f"supports ({source.path}): it was never trained on later positions; use at most "
            f"{int(limit)}"
        )
    ctx = requested or ctx
    if not ctx:
        raise ValueError(f"{source.path}: the model states no context length; pass --context-length")
    return int(ctx)


def model_facts(source: ModelSource, tokenizer, context_length: int | None = None) -> ModelFacts:
    """Context length (`served_context_length`: `context_length`, ``--context-length``, within
    the model's limit, else the model's own), EOS ids and vocab size of `source`. Raises
    `ValueError` naming the file when they cannot be read, and naming the flag when
    `context_length` is longer than the model supports."""
    ctx = served_context_length(source, context_length)
    eos = set(_ints(tokenizer.eos_token_id))
    if source.kind == "gguf":
        metadata = gguf_metadata(Path(source.path))
        vocab = metadata.get(f"{metadata.get('general.architecture')}.vocab_size") or len(tokenizer)
        eos.update(_ints(metadata.get("tokenizer.ggml.eos_token_id")))
    else:
        root = Path(source.path)
        config = json.loads((root / "config.json").read_text())
        vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size") or len(tokenizer)
        eos.update(_ints(config.get("eos_token_id")))
        gen = root / "generation_config.json"
        if gen.exists():
            eos.update(_ints(json.loads(gen.read_text()).get("eos_token_id")))
    return ModelFacts(ctx, tuple(sorted(eos)), int(vocab))
