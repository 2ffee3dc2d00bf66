"""The dashboard in a real browser: Debian's headless Chromium, driven through
its chromedriver by selenium, against `spoolctl web` running as a process and
real workers. The pages update themselves (a finished job shows up on the
overview, a running job's output grows), actions work only when allowed, and
nothing a job controls ever executes.

Chromium comes from the operating system (`apt-get install chromium
chromium-driver`; ./scripts/setup does it as root). Where it is missing these
tests fail, saying what to install: a run without the browser is not a pass."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Db, add_job, job, rows, start_worker, wait_for
from tests.process.test_web import IMG, SCRIPT, Served, drain, hostile_queue

pytestmark = pytest.mark.subprocess

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
MISSING = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
WHY_NOT = (
    f"headless Chromium is not installed ({', '.join(MISSING)} missing): install it with "
    "`apt-get install chromium chromium-driver` (./scripts/setup does, as root)"
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
)
WAIT_S = 20


def launch_chromium(profile: str) -> Any:
    """Chromium through the system's chromedriver; Selenium Manager stays offline."""
    os.environ["SE_OFFLINE"] = "true"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if MISSING:
        pytest.fail(WHY_NOT, pytrace=False)
    profile = tempfile.mkdtemp(prefix="spoolctl-chromium-")
    driver = launch_chromium(profile)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """The module's browser on a blank page (no script of an earlier test
    polling), with no cookies and its console read so far."""
    chromium.get("about:blank")
    chromium.delete_all_cookies()
    chromium.get_log("browser")
    yield chromium
    chromium.get("about:blank")


@pytest.fixture
def serve() -> Iterator[Any]:
    """Start `spoolctl web` for a queue; every server started is stopped after."""
    started: list[Served] = []

    def start(db: Db, *args: str) -> str:
        server = Served("--db", str(db), *args)
        started.append(server)
        return server.first.strip()

    yield start
    for server in started:
        server.kill()


def until(driver: Any, condition: Any, what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(condition, message=what)


def text_of(driver: Any, element_id: str) -> str:
    """An element's shown text, read in one step (a live region may be
    replaced between finding an element and reading it)."""
    script = "const e = document.getElementById(arguments[0]); return e ? e.innerText : '';"
    return str(driver.execute_script(script, element_id))


def mark_page(driver: Any) -> None:
    """A flag that survives only as long as the page is not reloaded."""
    driver.execute_script("window.__sameDocument = true;")


def same_page(driver: Any) -> bool:
    return bool(driver.execute_script("return window.__sameDocument === true;"))


def console_problems(driver: Any) -> list[str]:
    """Errors and CSP violations the page logged (a blocked inline script
    would be one: the escaping, not the CSP, must keep markup out)."""
    return [
        entry["message"]
        for entry in driver.get_log("browser")
        if entry["level"] == "SEVERE" or "Content Security Policy" in entry["message"]
    ]


def test_the_overview_updates_when_a_job_finishes(browser: Any, serve: Any, tmp_path: Path) -> None:
    db = tmp_path / "spool" / "queue.db"
    finished = add_job(db, "true")
    drain(db)
    job_id = add_job(db, "sh", "-c", "sleep 3")  # seen running by a 2 s refresh
    url = serve(db)
    browser.get(url)
    assert text_of(browser, "count-done").split()[0] == "1"
    assert text_of(browser, "count-queued").split()[0] == "1"
    mark_page(browser)
    start_worker(db)
    until(browser, lambda d: text_of(d, "count-running").split()[0] == "1", "the job running")
    wait_for(lambda: job(db, job_id)["state"] == "done", WAIT_S, what="the worker to finish")
    until(browser, lambda d: text_of(d, "count-done").split()[0] == "2", "the finished job")
    assert text_of(browser, "count-queued").split()[0] == "0"
    assert same_page(browser), "updated in place, not reloaded"
    assert finished == 1
    times = browser.execute_script(
        "return [...document.querySelectorAll('time.ts')].map(t => t.textContent);"
    )
    assert all("ago" in t or "just now" in t for t in times), times
    assert console_problems(browser) == []


def test_a_running_jobs_output_grows_on_its_page(browser: Any, serve: Any, tmp_path: Path) -> None:
    db = tmp_path / "spool" / "queue.db"
    script = "for i in 1 2 3 4 5 6 7 8; do echo line $i; echo warn $i >&2; sleep 0.4; done"
    job_id = add_job(db, "sh", "-c", script)
    url = serve(db)
    browser.get(f"{url}jobs/{job_id}")
    assert "has not run yet" in browser.page_source
    mark_page(browser)
    start_worker(db)
    seen: list[str] = []
    deadline = time.monotonic() + WAIT_S
    while "line 8" not in (seen[-1] if seen else "") and time.monotonic() < deadline:
        shown = text_of(browser, "stdout")
        if not seen or shown != seen[-1]:
            seen.append(shown)
        time.sleep(0.1)
    assert seen[-1].splitlines() == [f"line {i}" for i in range(1, 9)], seen
    growing = [s for s in seen if s]
    assert len(growing) >= 3, f"the output arrived in one piece, not live: {seen}"
    assert all(b.startswith(a) for a, b in itertools.pairwise(growing)), growing
    until(browser, lambda d: "warn 8" in text_of(d, "stderr"), "stderr followed too")
    until(browser, lambda d: "done" in text_of(d, "live-head"), "the job's state refreshed")
    assert same_page(browser)
    assert console_problems(browser) == []


def test_actions_work_when_allowed_and_are_absent_when_not(
    browser: Any, serve: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    db = tmp_path / "spool" / "queue.db"
    dead = add_job(db, "sh", "-c", "exit 7", max_retries=0)
    drain(db)
    read_only = serve(db)
    for path in ("", f"jobs/{dead}"):
        browser.get(read_only + path)
        assert browser.find_elements(By.CSS_SELECTOR, "[data-action], form[method=post]") == []
    assert job(db, dead)["state"] == "dead"

    allowed = serve(db, "--allow-actions")
    browser.get(f"{allowed}jobs/{dead}")
    browser.find_element(By.CSS_SELECTOR, "button[data-action=retry]").click()
    until(browser, lambda d: "Retried" in d.page_source, "the retry's notice")
    assert browser.current_url == f"{allowed}jobs/{dead}?done=retry"
    assert job(db, dead)["state"] == "queued"
    browser.get(allowed)
    lane = browser.find_element(By.CSS_SELECTOR, 'tr[data-lane="default"]')
    lane.find_element(By.NAME, "reason").send_keys(f"maintenance {IMG}")
    lane.find_element(By.CSS_SELECTOR, "button[data-action=pause]").click()
    until(browser, lambda d: "Lane paused" in d.page_source, "the pause's notice")
    paused = browser.find_element(By.CSS_SELECTOR, 'tr[data-lane="default"]').text
    assert "paused" in paused and f"maintenance {IMG}" in paused, "the reason shown as text"
    assert browser.execute_script("return window.__pwned;") is None
    ledger = rows(db, "SELECT event, detail FROM job_events WHERE event IN ('retried', 'paused')")
    for event, detail in ledger:
        assert json.loads(detail)["by"].startswith("web: "), (event, detail)
    assert {event for event, _ in ledger} == {"retried", "paused"}
    assert console_problems(browser) == []


def test_a_token_server_lets_the_one_time_link_in_and_no_one_else(
    browser: Any, serve: Any, tmp_path: Path
) -> None:
    db = tmp_path / "spool" / "queue.db"
    add_job(db, "true")
    server = Served("--db", str(db), "--token", "browser-token-0123456789")
    try:
        url = server.first.strip()
        assert server.proc.stdout is not None
        login = server.proc.stdout.readline().strip().split(": ", 1)[1]
        browser.get(url)
        assert "needs its access token" in browser.page_source
        browser.get(login)
        until(browser, lambda d: d.title.startswith("Overview"), "in through the link")
        assert browser.current_url == url
        browser.get(url + "jobs")
        assert browser.title.startswith("Jobs"), "the session cookie keeps one in"
        browser.delete_all_cookies()
        browser.get(login)
        assert "already used" in browser.page_source
    finally:
        server.kill()


def test_nothing_a_job_controls_executes_in_the_browser(
    browser: Any, serve: Any, tmp_path: Path
) -> None:
    """HTML and script in commands, notes, tags, env keys, output and ledger
    details are shown as text on every page, loaded or refreshed live."""
    from selenium.webdriver.common.by import By

    db = tmp_path / "spool" / "queue.db"
    ids = hostile_queue(db)
    dead = add_job(
        db, "sh", "-c", 'printf "%s\\n" "$1"; exit 3', "sh", SCRIPT, max_retries=0, note=SCRIPT
    )
    url = serve(db, "--allow-actions")
    add_job(db, "sh", "-c", 'printf "%s" "$1" >&2; exit 1', "sh", IMG, max_retries=0)
    for path in ("", "jobs", f"jobs/{ids['hostile']}", f"jobs/{dead}", "events"):
        browser.get(url + path)
        mark_page(browser)
        if path == "":
            drain(db)  # the dead jobs arrive through the live refresh
            until(
                browser,
                lambda d: len(d.find_elements(By.CSS_SELECTOR, "table.dead tr")) > 2,
                "the dead jobs shown live",
            )
        if path == "events":
            result = add_job(db, "true", note=IMG, tags={"t": SCRIPT})
            row = f'tr[data-event] a[href="/jobs/{result}"]'
            until(browser, lambda d, r=row: d.find_elements(By.CSS_SELECTOR, r), "a live event")
        time.sleep(2.5)  # one live refresh at least
        assert same_page(browser), path
        assert browser.execute_script("return window.__pwned;") is None, path
        assert browser.find_elements(By.CSS_SELECTOR, "img") == [], path
        sources = browser.execute_script(
            "return [...document.scripts].map(s => s.getAttribute('src'));"
        )
        assert sources == ["/static/app.js"], (path, sources)
        assert console_problems(browser) == [], path
    browser.get(f"{url}jobs/{ids['hostile']}")
    until(browser, lambda d: SCRIPT in text_of(d, "stdout"), "the output, as text")
    assert "<script>window.__pwned=" in text_of(browser, "command")
    assert "<img src=x onerror=" in text_of(browser, "command")
    assert IMG in text_of(browser, "stdout")
    assert IMG in text_of(browser, "stderr")
    assert "<i>HTML_ENV</i>" in browser.find_element(By.CLASS_NAME, "facts").text
