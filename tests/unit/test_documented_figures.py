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


OBSERVABILITY = ROOT / "docs" / "observability.md"
#: The distribution that installs each module prefix an OpenTelemetry snippet imports.
OTEL_DISTRIBUTIONS = {
    "opentelemetry.exporter.otlp.proto.http": "opentelemetry-exporter-otlp-proto-http",
    "opentelemetry.exporter.otlp.proto.grpc": "opentelemetry-exporter-otlp-proto-grpc",
    "opentelemetry.exporter.prometheus": "opentelemetry-exporter-prometheus",
    "opentelemetry.sdk": "opentelemetry-sdk",
    "opentelemetry": "opentelemetry-api",
}


def test_the_otel_set_up_names_every_package_it_imports():
    """The ``[otel]`` extra installs the API only: each package the page's set-up
    imports (the SDK, an exporter) is named in the page's ``pip install`` line."""
    text = OBSERVABILITY.read_text()
    section = text.split("## Worker metrics (OpenTelemetry)", 1)[1].split("\n## ", 1)[0]
    installs = " ".join(re.findall(r"^pip install .*$", section, re.M))
    assert '"django-taskclaim[otel]"' in installs
    imported = set(re.findall(r"^from (opentelemetry[\w.]*) import", section, re.M))
    assert imported
    for module in imported:
        distribution = next(d for m, d in OTEL_DISTRIBUTIONS.items() if module.startswith(m))
        if distribution != "opentelemetry-api":  # the extra's
            assert distribution in installs.split(), module


def test_the_duration_buckets_listed_are_the_codes():
    from django_taskclaim.telemetry import DURATION_BUCKETS

    text = OBSERVABILITY.read_text()
    listed = " ".join(f"{b:g}" for b in DURATION_BUCKETS)
    assert f"```text\n{listed}\n```" in text


def test_the_readme_install_lines_work_whatever_the_checkout_is_called():
    """Each ``pip install -e`` line of the README, run from the checkout as the README
    says, names this checkout: no line assumes the directory is called
    ``django-taskclaim`` (a clone into ``taskclaim/`` or ``src/`` must work as written)."""
    text = (ROOT / "README.md").read_text()
    paths = re.findall(r'^pip install -e "([^"\[]+)\[', text, re.M)
    assert paths, "the README shows no editable install"
    for path in paths:
        assert ((ROOT / path) / "pyproject.toml").is_file(), path
        assert (ROOT / path).resolve() == ROOT, path
