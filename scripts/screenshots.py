"""Screenshots of the dashboard for the docs: python scripts/screenshots.py

Builds a small demo queue in a temporary folder (finished, dead, running,
queued, waiting and scheduled jobs, a paused lane, a live worker), serves it
with `spoolctl web --allow-actions`, and photographs each page in Debian's
headless Chromium at a desktop and a phone size into docs/screenshots/
(PAGE-desktop.png, PAGE-mobile.png). Needs /usr/bin/chromium and
/usr/bin/chromedriver (`apt-get install chromium chromium-driver`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SIZES = {"desktop": (1280, 900, False), "mobile": (390, 844, True)}
MAX_HEIGHT = 2400
SETTLE_S = 2.5
"""Long enough for the page's script to fill in local times and live output."""


def spoolctl(db: Path, *args: str) -> dict[str, Any]:
    verb, rest = args[0], args[1:]
    proc = subprocess.run(
        [sys.executable, "-m", "spoolctl", verb, "--db", str(db), "--json", *rest],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    data: dict[str, Any] = json.loads(proc.stdout)["data"]
    return data


def add(db: Path, *args: str) -> int:
    return int(spoolctl(db, "add", *args)["job_id"])


def demo_queue(db: Path) -> tuple[int, subprocess.Popen[str]]:
    """The demo jobs; returns the running job's id and its worker."""
    add(
        db,
        "--tag",
        "team=web",
        "--note",
        "nightly build",
        "--",
        "sh",
        "-c",
        "echo compiling 42 modules; echo build ok",
    )
    add(db, "--tag", "team=web", "--", "sh", "-c", "echo 118 tests passed")
    add(
        db,
        "--max-retries",
        "0",
        "--tag",
        "team=api",
        "--",
        "sh",
        "-c",
        'echo collected 96 items; echo "FAILED tests/test_login.py::test_expired_token" >&2; '
        "exit 1",
    )
    add(db, "--max-retries", "0", "--", "sh", "-c", 'echo "disk quota exceeded" >&2; exit 28')
    spoolctl(db, "work", "--drain")
    long = add(
        db,
        "--tag",
        "team=data",
        "--note",
        "reindex the search cluster",
        "--",
        "sh",
        "-c",
        'for i in $(seq 1 400); do echo "shard $i/400: reindexed $((i * 1250)) docs"; '
        "sleep 0.3; done",
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "spoolctl", "work", "--db", str(db), "--worker-id", "build-box-1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    for _ in range(100):
        if spoolctl(db, "show", str(long))["job"]["state"] == "running":
            break
        time.sleep(0.1)
    train = add(
        db,
        "--queue",
        "gpu",
        "--priority",
        "5",
        "--tag",
        "team=ml",
        "--",
        "python3",
        "train.py",
        "--epochs",
        "20",
    )
    add(db, "--queue", "gpu", "--after-job", str(train), "--", "python3", "evaluate.py")
    add(db, "--queue", "gpu", "--", "python3", "train.py", "--epochs", "5", "--small")
    add(db, "--queue", "reports", "--after", "1h", "--", "sh", "-c", "./weekly-report.sh")
    add(db, "--queue", "reports", "--", "sh", "-c", "./daily-digest.sh")
    spoolctl(db, "pause", "gpu", "--reason", "driver upgrade on the GPU host")
    return long, worker


def start_server(db: Path) -> tuple[subprocess.Popen[str], str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "spoolctl", "web", "--db", str(db), "--allow-actions"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )
    assert server.stdout is not None
    return server, server.stdout.readline().strip()


def chromium() -> Any:
    os.environ["SE_OFFLINE"] = "true"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={tempfile.mkdtemp(prefix='spoolctl-shots-')}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))


def photograph(driver: Any, url: str, target: Path, size: tuple[int, int, bool]) -> None:
    """The whole page (up to MAX_HEIGHT pixels) at one width."""
    width, height, mobile = size
    metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    driver.get(url)
    time.sleep(SETTLE_S)
    full = driver.execute_script("return document.documentElement.scrollHeight;")
    metrics["height"] = max(height, min(int(full), MAX_HEIGHT))
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    time.sleep(0.3)
    driver.save_screenshot(str(target))
    print(f"wrote {target.relative_to(REPO)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    out = parser.parse_args().out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="spoolctl-demo-") as folder:
        db = Path(folder) / "queue.db"
        long, worker = demo_queue(db)
        server, url = start_server(db)
        driver = chromium()
        try:
            pages = {"overview": "", "jobs": "jobs", "job": f"jobs/{long}", "events": "events"}
            for name, path in pages.items():
                for label, size in SIZES.items():
                    photograph(driver, url + path, out / f"{name}-{label}.png", size)
        finally:
            driver.quit()
            server.send_signal(signal.SIGINT)
            server.communicate(timeout=30)
            for _ in range(2):  # the second signal stops the long job too
                worker.send_signal(signal.SIGINT)
                time.sleep(0.5)
            worker.wait(timeout=30)


if __name__ == "__main__":
    main()
