"""Figures the docs and the CHANGELOG quote for a constant of the code are the code's.
Pure text: no database."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from django_taskclaim.model.unique_insert import KEY_WAIT_TIMEOUT

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("page", ["CHANGELOG.md", "docs/unique.md"])
def test_key_wait_timeout_figure_is_the_codes(page):
    """Each ``N s (`KEY_WAIT_TIMEOUT`)`` a page writes names the constant's value."""
    text = " ".join((ROOT / page).read_text().split())  # lines joined
    figures = re.findall(r"(\d+(?:\.\d+)?) s \(`KEY_WAIT_TIMEOUT`\)", text)
    assert figures, f"{page} quotes no figure for KEY_WAIT_TIMEOUT"
    assert {float(f) for f in figures} == {KEY_WAIT_TIMEOUT}
