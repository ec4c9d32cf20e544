"""The mlx-lm versions this server is tested with. mlx-lm supplies the model architectures
and their caches, and changes them between minor versions (0.32 changed the cache API that a
peer server relied on), so ``pyproject.toml`` pins `TESTED` and a worker started with another
version says so in its start-up log (`outside_tested`)."""

from __future__ import annotations

import importlib.metadata

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

TESTED = ">=0.32.2,<0.33"
"""The tested range, as pip writes it; ``pyproject.toml``'s mlx-lm requirement is the same."""


def outside_tested(version: str | None = None) -> str | None:
    """A warning naming `version` (default: the installed mlx-lm's) and `TESTED` when the
    version is outside it or unreadable; None inside it."""
    if version is None:
        try:
            version = importlib.metadata.version("mlx-lm")
        except importlib.metadata.PackageNotFoundError:
            return f"mlx-lm's version cannot be read; this server is tested with mlx-lm {TESTED}"
    try:
        inside = Version(version) in SpecifierSet(TESTED)
    except InvalidVersion:
        inside = False
    if inside:
        return None
    return (
        f"mlx-lm {version} is installed; this server is tested with mlx-lm {TESTED} (model "
        f"architectures and caches change between its versions): pip install 'mlx-lm{TESTED}'"
    )
