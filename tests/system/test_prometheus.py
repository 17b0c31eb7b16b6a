"""A real Prometheus server scrapes the metrics view (served by Django's live server
over the test database) with the bearer token, and its HTTP API answers a query on a
gauge with the rows' value; a scrape without the token is refused (``up`` is 0).
Skipped, with the reason, where the ``prometheus`` binary is absent (Debian:
``apt-get install prometheus``)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from typing import Any

import pytest
from django.test import override_settings

from django_taskclaim.models import WorkerProcess
from tests.support.helpers import wait_for
from tests.support.testapp.models import Document

PROMETHEUS = shutil.which("prometheus")

pytestmark = [
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="the prometheus binary is not installed (Debian: apt-get install prometheus)",
    ),
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.support.metrics_urls"),
]

TOKEN = "prometheus-scrapes-with-this"
DOC = "testapp.Document"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(target: str) -> str:
    """Two jobs on the same view: one with the token, one without."""
    job = """
  - job_name: {name}
    scrape_interval: 1s
    scrape_timeout: 1s
    metrics_path: /metrics/taskclaim
{auth}    static_configs:
      - targets: ["{target}"]
"""
    auth = f"    authorization:\n      credentials: {TOKEN}\n"
    return (
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:"
        + job.format(name="taskclaim", auth=auth, target=target)
        + job.format(name="anonymous", auth="", target=target)
    )


@pytest.fixture
def prometheus(tmp_path, live_server):
    target = live_server.url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(config(target))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: ready(base), timeout=60, interval=0.2, what="prometheus to be ready")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        log.close()


def ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def query(base: str, promql: str) -> dict[str, Any]:
    """The instant-query result of ``promql``: labels -> value (floats)."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return {
        json.dumps(item["metric"], sort_keys=True): float(item["value"][1])
        for item in body["data"]["result"]
    }


def single(base: str, promql: str) -> float | None:
    found = query(base, promql)
    return next(iter(found.values())) if len(found) == 1 else None


@pytest.mark.slow
@override_settings(TASKCLAIM_METRICS_TOKEN=TOKEN)
def test_prometheus_scrapes_the_view_and_answers_a_query_on_a_gauge(prometheus):
    Document.objects.bulk_create(Document(title=f"t{i}") for i in range(5))
    WorkerProcess.objects.create(worker_id="w:1", hostname="h", pid=1, model_labels=[DOC])
    ready_rows = f'taskclaim_tasks{{job="taskclaim",model="{DOC}",state="ready"}}'
    wait_for(
        lambda: single(prometheus, ready_rows) == 5,
        timeout=60,
        interval=0.5,
        what="prometheus to scrape 5 ready rows",
    )
    assert single(prometheus, 'up{job="taskclaim"}') == 1
    assert single(prometheus, f'taskclaim_model_workers_live{{model="{DOC}"}}') == 1
    # a change of the rows reaches Prometheus with a later scrape
    Document.objects.filter(title__in=["t0", "t1"]).update(status="failed")
    wait_for(
        lambda: single(prometheus, ready_rows) == 3,
        timeout=60,
        interval=0.5,
        what="prometheus to scrape 3 ready rows",
    )
    failed = f'taskclaim_tasks{{job="taskclaim",model="{DOC}",state="failed"}}'
    assert single(prometheus, failed) == 2
    # the scrape without the token is refused: the job is down, none of its series exist
    wait_for(
        lambda: single(prometheus, 'up{job="anonymous"}') == 0,
        timeout=60,
        interval=0.5,
        what="the anonymous job's first scrape",
    )
    assert query(prometheus, 'taskclaim_tasks{job="anonymous"}') == {}
