"""The alert rules and the Grafana dashboard in monitoring/: the rules' own unit tests run by
promtool; then a real Prometheus scraping two beats and a worker, which loads and evaluates the
rules, answers every query of the dashboard, and holds the counts the runs' history has (runs
sent, succeeded, and their lateness) once a scrape follows the last run."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from .support.processes import start_celery
from .support.prometheus import ROOT, Prometheus, available
from .support.proxy import free_port
from .support.stores import history_app_on
from .test_cli import celery
from .test_faults import APP, kill, start_beat, wait_for
from .test_health import _scrape, _total, _until

MONITORING = ROOT / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"

needs_prometheus = pytest.mark.skipif(
    not available() and not os.environ.get("CI"), reason="no prometheus here (apt-get install prometheus)"
)


def _panels() -> list[dict[str, Any]]:
    return [panel for panel in json.loads(DASHBOARD.read_text())["panels"] if panel["type"] != "row"]


def _exprs() -> list[str]:
    """Every query of the dashboard, its variables given their 'All' value."""
    return [target["expr"].replace("$job", ".*") for panel in _panels() for target in panel["targets"]]


def _rules() -> list[str]:
    return re.findall(r"^\s+- alert: (\w+)$", (MONITORING / "alerts.yml").read_text(), re.MULTILINE)


@needs_prometheus
def test_the_alert_rules_are_valid_and_pass_their_unit_tests() -> None:
    checked = subprocess.run(
        ["promtool", "check", "rules", "alerts.yml"], cwd=MONITORING, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0 and f"SUCCESS: {len(_rules())} rules found" in checked.stdout, checked
    tested = subprocess.run(
        ["promtool", "test", "rules", "alerts.test.yml"], cwd=MONITORING, capture_output=True, text=True, timeout=60
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every rule has a unit test.
    tests = (MONITORING / "alerts.test.yml").read_text()
    assert [rule for rule in _rules() if f"alertname: {rule}\n" not in tests] == []


def test_the_dashboard_is_grafana_json_with_a_query_in_every_panel() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["job"]["allValue"] == ".*"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in _panels():
        assert panel["targets"] and all(target["expr"] for target in panel["targets"]), panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        place = panel["gridPos"]
        assert place["x"] + place["w"] <= 24, panel["title"]


# -- a real Prometheus ----------------------------------------------------------------------------


def _history(env: dict[str, str]) -> list[Any]:
    """The runs of job ``every``, as `celery anarchon history --json` gives them."""
    done = celery(env, "anarchon", "history", "every", "-n", "1000", "--json")
    assert done.returncode == 0, done
    return json.loads(done.stdout)


def _rules_and_dashboard_answer(prometheus: Prometheus) -> None:
    """The rules are loaded and evaluated without error, none firing on a healthy deployment;
    every query of the dashboard is one Prometheus answers, the main ones with data."""
    groups = prometheus.api("rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert sorted(rule["name"] for rule in rules) == sorted(_rules())
    assert [(rule["name"], rule.get("lastError")) for rule in rules if rule["health"] != "ok"] == []
    firing = [alert for alert in prometheus.api("alerts")["alerts"] if alert["state"] == "firing"]
    assert firing == [], firing
    for expr in _exprs():
        prometheus.query(expr)
    for title in ("Beats ready", "Jobs", "Jobs: next run, period, last success", "Lateness p50 and p99, by job"):
        [panel] = [panel for panel in _panels() if panel["title"] == title]
        assert all(prometheus.query(t["expr"].replace("$job", ".*")) for t in panel["targets"]), title


def _pause(env: dict[str, str], logs: list[Path]) -> None:
    """Pause job ``every``; return once a beat has recorded a run of it paused."""
    offsets = [len(log.read_text()) for log in logs]
    paused = celery(env, "anarchon", "pause", "every")
    assert paused.returncode == 0, paused
    deadline = time.monotonic() + 30
    while not any(": paused" in log.read_text()[offset:] for log, offset in zip(logs, offsets)):
        assert time.monotonic() < deadline, "no run recorded paused"
        time.sleep(0.2)


def _same_counts(prometheus: Prometheus, env: dict[str, str], beat_ports: list[int]) -> list[dict[str, Any]]:
    """Wait until Prometheus' sums of runs sent and succeeded are the beats' own and history's;
    the runs of the schedule, as history has them."""
    deadline = time.monotonic() + 60
    while True:
        own = [_scrape(port) for port in beat_ports]
        sent_now = sum(_total(samples, "anarchon_runs_sent_total", anarchon_job="every") for samples in own)
        runs = [run for run in _history(env) if run["trigger"] == "schedule"]
        succeeded = [run for run in runs if run["status"] == "succeeded"]
        in_prometheus = prometheus.value('sum(anarchon_runs_sent_total{anarchon_job="every"})')
        done = prometheus.value('sum(anarchon_worker_runs_finished_total{anarchon_job="every",status="succeeded"})')
        if in_prometheus == sent_now == len(runs) == len(succeeded) == done:
            return runs
        assert time.monotonic() < deadline, (in_prometheus, sent_now, len(runs), len(succeeded), done)
        time.sleep(0.5)


@needs_prometheus
@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["rabbitmq", "redis", "postgres", "sqlite"])
def test_prometheus_evaluates_the_rules_answers_the_dashboard_and_holds_what_history_has(
    where: str, prefix: str, beat_env: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two beats share a job every second; a worker runs it. Once the job is paused and a scrape
    has followed, Prometheus' sums are the runs history has: each sent once, each succeeded, and
    their lateness the same to the millisecond."""
    env = history_app_on(where, beat_env, tmp_path, request)
    env.update(HISTORY_APP_EVERY="1", HISTORY_APP_HISTORY_SIZE="1000")
    beat_ports = [free_port() for _ in range(2)]
    worker_port = free_port()
    logs = [tmp_path / f"beat-{n}.log" for n in range(2)]
    procs: list[subprocess.Popen[bytes]] = []
    prometheus = None
    try:
        for port, log in zip(beat_ports, logs):
            procs.append(start_beat(dict(env, HISTORY_APP_METRICS_PORT=str(port)), log))
        worker_log = tmp_path / "worker.log"
        args = ["worker", "-P", "solo", "-l", "info", "-Q", f"{prefix}tasks", "-n", f"w-{prefix}@%h"]
        worker_env = dict(env, HISTORY_APP_WORKER_METRICS_PORT=str(worker_port))
        procs.append(start_celery(args, worker_log, worker_env, app=APP, cwd=ROOT))
        for port, proc, log in zip(beat_ports, procs, logs):
            _until(port, "/readyz", 200, proc, log)
        wait_for(worker_log, "worker metrics served", procs[-1])
        prometheus = Prometheus(
            tmp_path / "prometheus",
            {"beats": [f"127.0.0.1:{port}" for port in beat_ports], "workers": [f"127.0.0.1:{worker_port}"]},
        )
        prometheus.wait_ready()
        deadline = time.monotonic() + 60
        ran = "sum(anarchon_worker_runs_finished_total)"
        rated = "sum(rate(anarchon_lateness_seconds_count[5m]))"  # (two scrapes since a run was sent)
        while not (prometheus.targets_up() and (prometheus.value(ran) or 0) >= 3 and prometheus.value(rated)):
            assert time.monotonic() < deadline, prometheus.api("targets")
            time.sleep(0.5)
        _rules_and_dashboard_answer(prometheus)
        _pause(env, logs)
        runs = _same_counts(prometheus, env, beat_ports)
        assert len(runs) >= 3
        job = '{anarchon_job="every"}'
        # (--json gives the slot as an ISO time to the second: this job's slots are whole seconds)
        lateness = sum(run["sent_at_ms"] / 1000 - dt.datetime.fromisoformat(run["slot"]).timestamp() for run in runs)
        assert prometheus.value(f"sum(anarchon_lateness_seconds_count{job})") == len(runs)
        assert prometheus.value(f"sum(anarchon_lateness_seconds_sum{job})") == pytest.approx(lateness, abs=0.001)
        last = max(run["finished_at_ms"] for run in runs) / 1000
        success = prometheus.value(f"max(anarchon_worker_last_success_timestamp_seconds{job})")
        assert success is not None and abs(success - last) < 1.0
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            assert proc.wait(30) == 0
    finally:
        if prometheus is not None:
            prometheus.stop()
        for proc in procs:
            kill(proc)
