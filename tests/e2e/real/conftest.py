"""Tests of the real default model (SmolLM2-135M-Instruct): its servers (`real_server`, or
their own), and the worker's model code run on it in this process (`loaded`), which is too
slow for the fast loop (tests/unit, tests/api, tests/sim)."""

from tests.support.real_clients import client, url  # noqa: F401  (fixtures)
from tests.support.worker_runs import prompt_ids  # noqa: F401  (fixture)
