"""Shared fixtures: the tokenizer, a tiny random-weight model directory, and servers started
through `launch.py` as a user would (a subprocess), checked for orphans at teardown."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from worker_proc.cpu.blas import reexec_env  # noqa: E402


def pytest_configure(config) -> None:
    """In-process MLX tests (the reference loops) run ~5x faster with an optimized BLAS,
    which must be preloaded before the process starts: re-run pytest once with LD_PRELOAD
    set, exactly as launch does for the worker."""
    env = reexec_env()
    if env is not None:
        capture = config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.stop_global_capturing()
        os.execve(sys.executable, [sys.executable, "-m", "pytest", *config.invocation_params.args], env)

def pytest_collection_modifyitems(items) -> None:
    """Mark `slow` (pyproject's marker: runs the real default model) every test that uses the
    default-model server, `real_server`, directly or through `tests.real_clients`; modules
    that start default-model servers of their own set ``pytestmark`` themselves.
    ``-m "not slow"`` then leaves them out."""
    for item in items:
        if "real_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


from protocol.model_source import resolve_model  # noqa: E402
from tests.launcher import Server, left_alive  # noqa: E402
from text.hf_tokenizer import load_tokenizer  # noqa: E402

TINY_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "eos_token_id": 2,
}


@pytest.fixture(scope="session")
def default_source():
    """The default model (SmolLM2-135M-Instruct GGUF)."""
    return resolve_model(None)


@pytest.fixture(scope="session")
def loaded(default_source):
    """The default model loaded in this process (`worker_proc.model.loader.load`): the
    reference of the in-process worker tests, shared by them (none changes it)."""
    from worker_proc.model.loader import load

    return load(default_source)


@pytest.fixture(scope="session")
def tokenizer(default_source):
    """The default model's transformers tokenizer."""
    return load_tokenizer(default_source)


def write_random_model(path: Path, tokenizer, config: dict = TINY_CONFIG) -> Path:
    """Write an MLX model directory to `path`: the mlx-lm architecture of `config` (its
    ``model_type``) with random weights (seed 0) and `tokenizer` (a transformers
    tokenizer); returns `path`."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    path.mkdir(parents=True, exist_ok=True)
    mx.random.seed(0)
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (path / "config.json").write_text(json.dumps(config))
    tokenizer.save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """An MLX model directory: a 2-layer llama with random weights and SmolLM2's tokenizer."""
    return write_random_model(tmp_path_factory.mktemp("tiny-llama"), tokenizer)


def stop_and_check(server: Server) -> None:
    """Stop `server` and assert it exited 0 leaving no child process behind."""
    code = server.stop()
    left = left_alive(server.children)
    assert code == 0, server.log()[-3000:]
    assert not left, f"orphan processes after SIGTERM: {left}"


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir, tmp_path_factory):
    """A server on the tiny random model, 2 detokenizer replicas, with the custom logit
    processors of `tests.processors` (forced and failing ones; requests that name none are
    served as without them)."""
    server = Server(["--model", str(tiny_model_dir), "--detokenizers", "2", "--enable-custom-logit-processor",
                     "--logit-processor-module", "tests.processors"], tmp_path_factory.mktemp("logs") / "tiny.log")
    yield server
    stop_and_check(server)


@pytest.fixture(scope="session")
def real_server(tmp_path_factory):
    """A server on the default model (SmolLM2-135M-Instruct), 2 detokenizer replicas (taken
    in turn when equally loaded, so consecutive requests exercise both)."""
    server = Server(["--detokenizers", "2"], tmp_path_factory.mktemp("logs") / "real.log")
    yield server
    stop_and_check(server)
