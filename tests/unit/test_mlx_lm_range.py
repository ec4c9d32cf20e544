"""mlx-lm pinned to the tested range, and a worker on another version says so (issue 41, item 7)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from worker_proc.model.mlx_lm_range import TESTED, outside_tested

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_pins_the_tested_range():
    pins = re.findall(r'"mlx-lm([^";]*)"', (ROOT / "pyproject.toml").read_text())
    assert pins == [TESTED]


def test_the_installed_mlx_lm_is_inside_the_range():
    assert outside_tested() is None


@pytest.mark.parametrize("version", ["0.28.0", "0.33.0", "1.0", "not-a-version"])
def test_another_version_is_named_with_the_tested_range(version):
    warning = outside_tested(version)
    assert warning is not None and version in warning and TESTED in warning


@pytest.mark.parametrize("version", ["0.32.2", "0.32.9"])
def test_versions_inside_the_range_pass(version):
    assert outside_tested(version) is None
