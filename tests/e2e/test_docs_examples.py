"""README.md's examples run as written: every ```python block, and every ```bash / ```sh block
that calls curl, against a server on the tiny random-weight model.

The examples name the default model and port 30000; they run against the session's tiny
server (`tiny_server`: default flags as the README starts it, plus replicas and test
processors that requests naming none never meet), each block with that server's base URL in
place of ``http://127.0.0.1:30000`` and its model name in place of the default model's (the
server refuses other names). A Python block runs in a subprocess of its own, a shell
block under ``bash -e -o pipefail``; each must exit 0 within its deadline. Curl blocks must use
``-f`` / ``--fail``, so that an HTTP error fails them."""

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.launcher import ROOT

README = ROOT / "README.md"
DEFAULT_URL = "http://127.0.0.1:30000"
MODEL = "SmolLM2-135M-Instruct"
BLOCK_TIMEOUT_S = 120

FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```\s*$", re.S | re.M)


def readme_blocks() -> list[tuple[str, str, int]]:
    """(language, code, line) of each README block this test runs: Python blocks, and shell
    blocks that call curl."""
    text = README.read_text()
    out = []
    for m in FENCE.finditer(text):
        lang, code = m.group(1).lower(), m.group(2)
        line = text.count("\n", 0, m.start()) + 1
        if lang == "python" or (lang in ("bash", "sh", "shell") and "curl " in code):
            out.append(("python" if lang == "python" else "bash", code, line))
    return out


BLOCKS = readme_blocks()


def test_the_readme_has_the_examples_this_test_expects():
    """Guards the extraction itself: a changed fence style would otherwise run nothing."""
    langs = [lang for lang, _, _ in BLOCKS]
    assert langs.count("python") >= 5 and langs.count("bash") >= 1, BLOCKS
    code = "\n".join(c for _, c, _ in BLOCKS)
    for needle in ("anthropic.Anthropic(", "client.responses.create(", "tools=", "response_format="):
        assert needle in code, needle


@pytest.fixture(scope="module")
def docs_server(tiny_server):
    """The session's tiny server, with the name it serves its model under (`served`)."""
    tiny_server.served = httpx.get(f"{tiny_server.base_url}/v1/models", timeout=10).json()["data"][0]["id"]
    return tiny_server


@pytest.mark.parametrize("lang,code,line", BLOCKS, ids=[f"README.md:{ln}-{lg}" for lg, _, ln in BLOCKS])
def test_readme_example_runs(docs_server, lang, code, line, tmp_path: Path):
    assert DEFAULT_URL in code, f"README.md:{line}: the example does not name {DEFAULT_URL}"
    assert MODEL in code, f"README.md:{line}: the example does not name the model {MODEL}"
    code = code.replace(DEFAULT_URL, docs_server.base_url).replace(MODEL, docs_server.served)
    if lang == "python":
        cmd = [sys.executable, "-c", code]
    else:
        for call in re.findall(r"curl [^\n]*", code):
            assert re.search(r"\s-\w*f\w*\s|--fail", call + " "), f"README.md:{line}: curl without -f: {call}"
        cmd = ["bash", "-e", "-o", "pipefail", "-c", code]
    try:
        done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"README.md:{line}: still running after {BLOCK_TIMEOUT_S} s\n{e.stdout}\n{e.stderr}\n"
            f"server log tail:\n{docs_server.log()[-3000:]}"
        )
    assert done.returncode == 0, (
        f"README.md:{line}: exit {done.returncode}\nstdout:\n{done.stdout}\n"
        f"stderr:\n{done.stderr}\nserver log tail:\n{docs_server.log()[-3000:]}"
    )
