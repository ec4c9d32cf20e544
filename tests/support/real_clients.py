"""Module fixtures for tests against the session's default-model server (`real_server`),
which tests/e2e/real/conftest.py provides to its tests."""

from __future__ import annotations

import openai
import pytest


@pytest.fixture(scope="module")
def url(real_server):
    """The default-model server's root URL."""
    return real_server.base_url


@pytest.fixture(scope="module")
def client(url):
    """An `openai.OpenAI` client for the default-model server."""
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none")
