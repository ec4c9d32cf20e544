"""The tokenizer hand-off for grammars: xgrammar's `TokenizerInfo` of the served model,
written into the run directory so the scheduler compiles grammars without loading the
tokenizer (or transformers) itself.

Special added tokens (SmolLM2: ids 0-16, ``<|endoftext|>``, ``<repo_name>``, ...) are
entered with an empty text, which xgrammar treats as special and never allows: as-is,
a byte-level vocabulary spells them as plain text that a JSON string or a regex such as
``.*`` would accept, while the detokenizer drops them from the output. The model's EOS ids
stay allowed once the grammar is complete (xgrammar's stop tokens).

For SmolLM2 (49152 tokens) it takes ~0.25 s; the file is ~1.6 MB.
"""

from __future__ import annotations

from pathlib import Path

import xgrammar

from protocol.endpoints import GRAMMAR_TOKENIZER_FILE, write_run_file
from text.hf_tokenizer import ModelFacts


def grammar_tokenizer_info(tokenizer, facts: ModelFacts) -> xgrammar.TokenizerInfo:
    """xgrammar's view of `tokenizer` (a transformers tokenizer): vocab_size is
    `facts.vocab_size` (the model's logit width; ids past the tokenizer's are never
    allowed), stop tokens are `facts.eos_token_ids`, special added tokens are never allowed.
    Vocabulary type and prefix-space handling are detected by xgrammar."""
    detected = xgrammar.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=facts.vocab_size, stop_token_ids=list(facts.eos_token_ids)
    )
    vocab = [""] * facts.vocab_size
    for text, token_id in tokenizer.get_vocab().items():
        if token_id < facts.vocab_size:
            vocab[token_id] = text
    for token_id, added in tokenizer.added_tokens_decoder.items():
        if added.special and token_id < facts.vocab_size:
            vocab[token_id] = ""
    return xgrammar.TokenizerInfo.from_vocab_and_metadata(vocab, detected.dump_metadata())


def write_grammar_tokenizer(run_dir: str | Path, tokenizer, facts: ModelFacts) -> Path:
    """Write `grammar_tokenizer_info` as ``run_dir / GRAMMAR_TOKENIZER_FILE`` (JSON from
    ``serialize_json()``) atomically (`write_run_file`); return the path. Raises `OSError`
    when the file cannot be written."""
    return write_run_file(run_dir, GRAMMAR_TOKENIZER_FILE, grammar_tokenizer_info(tokenizer, facts).serialize_json())
