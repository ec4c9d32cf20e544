"""The command-line flags every in-process benchmark shares."""

from __future__ import annotations

import argparse


def model_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by `doc`'s first line with ``--model PATH`` (default: the default
    model) and ``--load-format auto|dummy``."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    return p
