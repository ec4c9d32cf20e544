"""`launch.py`'s checks in this process: the usage and --help, GGUF metadata read from the
header alone, context-length bounds under rope scaling, the state-snapshot interval's
default, and a corrupt tokenizer named by its model path. As a user runs it:
tests/e2e/test_launch.py."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import msgspec
import pytest


def test_a_corrupt_tokenizer_is_an_error_naming_the_model(tmp_path, tiny_model_dir, default_source):
    """The tokenizer and detokenizer processes load the tokenizer before the worker has read the
    weights, so theirs is often the error launch reports: it names the model path (a GGUF cut
    short raised gguf's bare ``struct.error``, a tokenizer.json cut short a bare JSONDecodeError)."""
    from protocol.config import ModelSource
    from text.hf_tokenizer import load_tokenizer

    cut = tmp_path / "cut.gguf"
    cut.write_bytes(open(default_source.path, "rb").read(100_000))
    d = tmp_path / "model"
    shutil.copytree(tiny_model_dir, d)
    (d / "tokenizer.json").write_bytes((d / "tokenizer.json").read_bytes()[:5000])
    for source in (ModelSource("gguf", str(cut), "cut"), ModelSource("hf", str(d), "model")):
        with pytest.raises(ValueError, match=f"^{source.path}: cannot load the tokenizer: "):
            load_tokenizer(source)


def test_gguf_metadata_reads_the_header_alone(default_source, tmp_path):
    """`gguf_metadata` reads the scalars of a GGUF header without the gguf package (seconds)
    or mx.load (every tensor); a header cut short is a ValueError naming the file."""
    from protocol.model_source import gguf_metadata

    t0 = time.monotonic()
    meta = gguf_metadata(Path(default_source.path))
    assert time.monotonic() - t0 < 1
    assert (
        meta["general.architecture"],
        meta["llama.context_length"],
        meta["llama.vocab_size"],
        meta["tokenizer.ggml.eos_token_id"],
        meta["llama.attention.head_count"],
    ) == ("llama", 8192, 49152, 2, 9)
    assert "tokenizer.ggml.tokens" not in meta  # arrays are skipped
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(open(default_source.path, "rb").read(2000))
    with pytest.raises(ValueError, match=f"^{cut}: cannot read the GGUF metadata: "):
        gguf_metadata(cut)


def test_context_length_bounds_follow_rope_scaling(tmp_path):
    """A yarn or linear RoPE scaling stretches the longest allowed --context-length by its
    factor; the default stays max_position_embeddings."""
    from types import SimpleNamespace

    from protocol.config import ModelSource
    from text.hf_tokenizer import model_facts

    tok = SimpleNamespace(eos_token_id=2, __len__=lambda: 100)
    for scaling, limit in [
        (None, 2048),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}, 4096),
        ({"type": "linear", "factor": 2.0}, 4096),
        ({"rope_type": "llama3", "factor": 8.0}, 2048),
    ]:
        (tmp_path / "config.json").write_text(
            json.dumps({"max_position_embeddings": 2048, "vocab_size": 100, "rope_scaling": scaling})
        )
        source = ModelSource("hf", str(tmp_path), "m")
        assert model_facts(source, tok).context_length == 2048
        assert model_facts(source, tok, limit).context_length == limit
        with pytest.raises(ValueError, match=f"--context-length {limit + 1} is longer than the {limit} tokens"):
            model_facts(source, tok, limit + 1)


def test_the_state_snapshot_interval_defaults_to_the_chunk_size():
    """``--mamba-cache-chunk-size`` is kept as given (0: not given, so the worker can tell);
    the interval in use falls back to the prefill chunk size, then 2048 (chunking off)."""
    from protocol.config import ModelSource, ServerArgs

    args = ServerArgs(model=ModelSource("gguf", "/m.gguf", "m"), run_dir="/x")
    assert (args.mamba_cache_chunk_size, args.state_interval) == (0, 2048)
    for fields, interval in (
        ({"chunked_prefill_size": 512}, 512),
        ({"chunked_prefill_size": 0}, 2048),
        ({"chunked_prefill_size": 512, "mamba_cache_chunk_size": 64}, 64),
    ):
        assert msgspec.structs.replace(args, **fields).state_interval == interval, fields


def test_help_shows_reasoning_parsers_without_the_empty_choice(capsys):
    """`--help` showed ``--reasoning-parser {,qwen3,...}``: the empty string that means off
    printed as a blank first choice. It lists the parsers only; "" still parses (off)."""
    import launcher.args

    with pytest.raises(SystemExit):
        launcher.args.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--reasoning-parser {qwen3,smollm3,deepseek_r1,think}" in out and "{," not in out
    assert launcher.args.parse_args(["--reasoning-parser", ""]).reasoning_parser == ""
    assert launcher.args.parse_args([]).reasoning_parser == ""
    assert launcher.args.parse_args(["--reasoning-parser", "qwen3"]).reasoning_parser == "qwen3"


@pytest.mark.parametrize("argv0, prog", [("/venv/bin/lazyserve", "lazyserve"), ("launch.py", "launch.py")])
def test_usage_names_the_command_as_invoked(monkeypatch, capsys, argv0, prog):
    """The `lazyserve` console script printed `usage: launch.py` (and `launch.py: error:`
    for a bad flag); usage and errors now name the command the user typed."""
    import launcher.args

    monkeypatch.setattr(sys, "argv", [argv0])
    with pytest.raises(SystemExit):
        launcher.args.parse_args(["--help"])
    assert capsys.readouterr().out.startswith(f"usage: {prog} [-h]")
    with pytest.raises(SystemExit):
        launcher.args.parse_args(["--port", "x"])
    assert f"{prog}: error: argument --port" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--speculative-algorithm", "STANDALONE"],
            "STANDALONE and --speculative-draft-model-path (a draft model) are not built yet",
        ),
        (
            ["--speculative-draft-model-path", "/m"],
            "are not built yet; --speculative-algorithm NGRAM (prompt lookup) is",
        ),
        (["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "0"], "must be at least 1"),
    ],
)
def test_speculative_flags_that_cannot_be_honoured_are_refused(argv, message, capsys):
    import launcher.args

    with pytest.raises(SystemExit):
        launcher.args.parse_args(argv)
    assert message in capsys.readouterr().err
    ns = launcher.args.parse_args(["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "3"])
    assert (ns.speculative_algorithm, ns.speculative_num_draft_tokens) == ("NGRAM", 3)
