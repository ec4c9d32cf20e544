"""The e2e tier: servers started through `launch.py` as a user would (subprocesses), on the
tiny random-weight model here and on the default model in tests/e2e/real/."""

from tests.support.tensor_parallel import tp1  # noqa: F401  (fixture)
