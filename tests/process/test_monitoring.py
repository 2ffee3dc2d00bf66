"""What docs/monitoring/ ships works against the real tools: promtool checks
the alert rules and runs their unit tests (tests/monitoring_alerts_test.yml),
every metric the rules, the dashboard and docs/monitoring.md name is one
spoolctl exports, and a real Prometheus (Debian's, on loopback, started
here) scrapes `spoolctl web` behind its token while a real worker drains
jobs, and gives the values back through its HTTP API."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from spoolctl.services.metrics import DURATION_BUCKETS_S
from tests.helpers import REPO, add_job, child_env, start_worker, wait_for
from tests.populated import run_quiet

pytestmark = pytest.mark.subprocess

MONITORING = REPO / "docs" / "monitoring"
ALERTS = MONITORING / "alerts.yml"
DASHBOARD = MONITORING / "grafana.json"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
METRIC = re.compile(r"\bspoolctl_[a-z_]+[a-z]\b")
SUFFIXES = ("_bucket", "_gsum", "_gcount", "_total")
POSTGRESQL_ONLY = {
    "spoolctl_ledger_unnumbered_events",
    "spoolctl_ledger_lag_seconds",
    "spoolctl_ledger_oldest_writer_seconds",
}
TOKEN = "prometheus-scrapes-with-this-token"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=REPO)


def test_promtool_checks_the_rules_and_their_unit_tests_pass() -> None:
    checked = promtool("check", "rules", *map(str, sorted(MONITORING.glob("*.yml"))))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 6 rules found" in checked.stdout
    tested = promtool("test", "rules", str(REPO / "tests" / "monitoring_alerts_test.yml"))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def exported_names(tmp_path: Path) -> set[str]:
    """The family names an exposition of a small queue holds (SQLite), with
    the ones PostgreSQL adds."""
    db = tmp_path / "spool" / "queue.db"
    add_job(db, "true")
    result = run_quiet("metrics", "--db", str(db))
    assert result.exit_code == 0, result.stdout + result.stderr
    names = {line.split()[2] for line in result.stdout.splitlines() if line.startswith("# TYPE")}
    return names | POSTGRESQL_ONLY


def base_name(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


@pytest.mark.parametrize(
    "path",
    [ALERTS, DASHBOARD, REPO / "docs" / "monitoring.md"],
    ids=lambda p: str(Path(p).relative_to(REPO)),
)
def test_every_metric_named_is_one_spoolctl_exports(path: Path, tmp_path: Path) -> None:
    exported = {base_name(n) for n in exported_names(tmp_path)}
    named = {base_name(n) for n in METRIC.findall(path.read_text())}
    assert named, "names no metric"
    assert named <= exported, sorted(named - exported)


def test_the_dashboard_queries_prometheus_for_every_panel() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len(panels) >= 8
    for panel in panels:
        assert panel["targets"] and all(METRIC.search(t["expr"]) for t in panel["targets"])
        assert panel["datasource"]["uid"] == "${datasource}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Prometheus:
    """A Prometheus on loopback scraping one target every second, its storage
    in a temporary folder."""

    def __init__(self, folder: Path, target: str) -> None:
        self.port = free_port()
        config = folder / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: spoolctl\n    metrics_path: /metrics\n"
            f"    authorization:\n      credentials: {TOKEN}\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        self.log = folder / "prometheus.log"
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
            stdin=subprocess.DEVNULL,
        )

    def get(self, path: str) -> dict[str, object]:
        url = f"http://127.0.0.1:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=5) as response:
            return dict(json.loads(response.read()))

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                return True
        except OSError:
            return False

    def query(self, expr: str) -> dict[str, float]:
        """An instant query: each series' value by its `queue` (or "" without one)."""
        found = self.get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert found["status"] == "success", found
        result = found["data"]["result"]  # type: ignore[index]
        return {r["metric"].get("queue", ""): float(r["value"][1]) for r in result}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Web:
    """`spoolctl web` with a token, on a free loopback port."""

    def __init__(self, db: Path) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spoolctl",
                "web",
                "--db",
                str(db),
                "--token",
                TOKEN,
                "--host",
                "127.0.0.1",
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
            stdin=subprocess.DEVNULL,
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        assert first, self.proc.stderr.read() if self.proc.stderr else ""
        self.port = int(json.loads(first)["listening"]["port"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.communicate(timeout=30)


@pytest.fixture
def scraped(tmp_path: Path) -> Iterator[tuple[Path, Prometheus]]:
    if not Path(PROMETHEUS).exists():
        pytest.fail("prometheus is not installed: ./scripts/setup installs Debian's package")
    db = tmp_path / "spool" / "queue.db"
    add_job(db, "true")  # the queue exists before the dashboard opens it
    web = Web(db)
    prometheus = Prometheus(tmp_path, f"127.0.0.1:{web.port}")
    try:
        yield db, prometheus
    finally:
        prometheus.stop()
        web.stop()


@pytest.mark.slow
def test_a_real_prometheus_scrapes_the_web_while_a_worker_drains(
    scraped: tuple[Path, Prometheus],
) -> None:
    db, prometheus = scraped
    wait_for(prometheus.ready, timeout=15, interval=0.1, what="prometheus to be ready")
    wait_for(
        lambda: prometheus.query('up{job="spoolctl"}').get("") == 1,
        timeout=10,
        interval=0.2,
        what="the first scrape to succeed (behind the token)",
    )
    for _ in range(3):
        add_job(db, "sleep", "1.5")
    add_job(db, "false", max_retries=0)
    worker = start_worker(db, "--drain")
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, out + err

    def scraped_after_the_drain() -> bool:
        # both families of one scrape: a query may still see the one before
        done = prometheus.query('spoolctl_jobs{state="done"}')
        ended = prometheus.query("sum(spoolctl_attempts_ended_total)")
        return done.get("default") == 4 and ended == {"": 5}

    wait_for(scraped_after_the_drain, timeout=10, interval=0.2, what="a scrape after the drain")
    assert prometheus.query('spoolctl_attempts_ended_total{outcome="failed"}') == {"": 1}
    assert prometheus.query('spoolctl_jobs{state="dead"}') == {"default": 1}
    seen_running = prometheus.query("max_over_time(spoolctl_lane_running_jobs[2m])")
    assert seen_running == {"default": 1}, "a scrape saw a 1.5 s job running"
    seen_workers = prometheus.query("max_over_time(spoolctl_lane_live_workers[2m])")
    assert seen_workers == {"default": 1}
    longest = max(b for b in DURATION_BUCKETS_S if b < 1.5)
    slow = prometheus.query(
        f'spoolctl_recent_attempt_duration_seconds_bucket{{le="+Inf"}}'
        f' - ignoring(le) spoolctl_recent_attempt_duration_seconds_bucket{{le="{longest!r}"}}'
    )
    assert slow == {"": 3}, "the three 1.5 s jobs fall above the bucket below 1.5 s"
