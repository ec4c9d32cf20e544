"""Shared fixtures: the tokenizer, a tiny random-weight model directory, and servers started
through `launch.py` as a user would (a subprocess), checked for orphans at teardown.

The tests are in tiers by folder (each test is marked with its tier, see
`pytest_collection_modifyitems`): tests/unit/ (pure logic, and the worker's model code on
random weights in this process), tests/api/ (the app in-process against a fake manager, and
the SDKs against it),
tests/sim/ (the real scheduler driven by a fake worker), tests/e2e/ (servers started through
`launch.py` on the tiny random model) and tests/e2e/real/ (the default model: its servers,
and the worker's model code on it in this process).
``pytest tests/unit tests/api tests/sim`` is the fast loop. Shared doubles and helpers are in
tests/support/; no test module imports another."""

from __future__ import annotations

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


TIERS = ("unit", "api", "sim", "models", "e2e")
"""The tier folders of tests/; a test is marked with its folder's name (pyproject's markers)."""


def pytest_collection_modifyitems(items) -> None:
    """Mark each test with its tier by folder (``-m unit``, ``-m "not e2e"``...), `real` the
    tests of tests/e2e/real/ (the default model, served or in this process), and `slow`
    (pyproject's marker: runs the real default model) every test that uses the default-model
    server, `real_server`, directly or through `tests.support.real_clients`; modules that
    start default-model servers of their own set ``pytestmark`` themselves. ``-m "not slow"``
    then leaves them out."""
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        path = Path(str(item.path)).resolve()
        parts = path.relative_to(tests_dir).parts if path.is_relative_to(tests_dir) else ()
        if parts and parts[0] in TIERS:
            item.add_marker(getattr(pytest.mark, parts[0]))
        if parts[:2] == ("e2e", "real"):
            item.add_marker(pytest.mark.real)
        if "real_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


from protocol.model_source import resolve_model  # noqa: E402
from tests.support.launcher import Server, stop_and_check  # noqa: E402
from tests.support.tiny_model import write_random_model  # noqa: E402
from text.hf_tokenizer import load_tokenizer  # noqa: E402


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


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """An MLX model directory: a 2-layer llama with random weights and SmolLM2's tokenizer."""
    return write_random_model(tmp_path_factory.mktemp("tiny-llama"), tokenizer)


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir, tmp_path_factory):
    """A server on the tiny random model, 2 detokenizer replicas, with the custom logit
    processors of `tests.support.processors` (forced and failing ones; requests that name none are
    served as without them)."""
    server = Server(
        [
            "--model",
            str(tiny_model_dir),
            "--detokenizers",
            "2",
            "--enable-custom-logit-processor",
            "--logit-processor-module",
            "tests.support.processors",
        ],
        tmp_path_factory.mktemp("logs") / "tiny.log",
    )
    yield server
    stop_and_check(server)


@pytest.fixture(scope="session")
def real_server(tmp_path_factory):
    """A server on the default model (SmolLM2-135M-Instruct), 2 detokenizer replicas (taken
    in turn when equally loaded, so consecutive requests exercise both)."""
    server = Server(["--detokenizers", "2"], tmp_path_factory.mktemp("logs") / "real.log")
    yield server
    stop_and_check(server)
