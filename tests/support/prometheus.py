"""A real Prometheus server (Debian's ``prometheus`` package) for the tests and the benchmarks:
scraping given targets every second and evaluating the repository's alert rules, in a folder of
its own, on a port of its own; stopped, and its data deleted with the folder, by the caller."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from .proxy import free_port

__all__ = ["ROOT", "Prometheus", "available"]

ROOT = Path(__file__).resolve().parents[2]
#: The repository's alert rules.
RULES = ROOT / "monitoring" / "alerts.yml"


def available() -> bool:
    return shutil.which("prometheus") is not None and shutil.which("promtool") is not None


class Prometheus:
    """``prometheus`` scraping ``targets`` (job name to ``host:port`` list) every
    ``interval`` seconds, rules evaluated as often. :meth:`stop` always; it is safe twice."""

    def __init__(self, folder: Path, targets: dict[str, list[str]], interval: int = 1) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.port = free_port()
        self.interval = interval
        config = {
            "global": {"scrape_interval": f"{interval}s", "evaluation_interval": f"{interval}s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": name, "static_configs": [{"targets": addresses}]} for name, addresses in targets.items()
            ],
        }
        (folder / "prometheus.yml").write_text(json.dumps(config))  # (JSON is YAML)
        self.log = folder / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"Prometheus not ready within {timeout}s:\n{self.log.read_text(errors='replace')[-3000:]}")

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of an API answer; AssertionError with Prometheus' error otherwise."""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        assert body.get("status") == "success", (path, params, body)
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's samples: each with its ``metric`` labels and ``value`` [time, text]."""
        data = self.api("query", query=expr)
        return data["result"] if data["resultType"] == "vector" else [{"metric": {}, "value": data["result"]}]

    def value(self, expr: str) -> float | None:
        """The one value of a query that sums to one sample (None: no sample)."""
        found = self.query(expr)
        return float(found[0]["value"][1]) if found else None

    def targets_up(self) -> bool:
        active = self.api("targets")["activeTargets"]
        return bool(active) and all(target["health"] == "up" for target in active)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
