"""The command-line flags every in-process benchmark shares."""

from __future__ import annotations

import argparse
from pathlib import Path


def model_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by `doc`'s first line with ``--model PATH`` (default: the default
    model) and ``--load-format auto|dummy``."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    return p


def emit(lines: list[str], out: str | None) -> None:
    """Print a report's `lines` and, when `out` is given, write them to that file too."""
    text = "\n".join(lines)
    print(text)
    if out:
        Path(out).write_text(text + "\n")
