"""The dashboard over HTTP (Starlette's TestClient, and `spoolctl web` as a real
process): every page renders what the services read, escapes everything a job
controls, refuses what it must (Host, token, cross-site posts, actions when
off), records its actions in the ledger as coming from the web, runs no SQL
of its own, and stays out of every other verb's imports."""

from __future__ import annotations

import ast
import json
import re
import signal
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from starlette.testclient import TestClient

from spoolctl.cli.database import driver_of, open_read, open_write
from spoolctl.cli.schemas import DATA_SCHEMAS, ENVELOPE, STREAMS
from spoolctl.web.access import QueueAccess
from spoolctl.web.app import create_app
from spoolctl.web.common import Settings
from spoolctl.web.request_guard import Guard
from spoolctl.web.views import decode_complete, skip_partial_head
from tests.helpers import REPO, Db, add_job, child_env, job, rows
from tests.populated import run_quiet
from tests.process.test_layering import modules_after
from tests.schema_check import errors as schema_errors

pytestmark = pytest.mark.subprocess

PORT = 8765
"""The port the in-process app believes it serves (Host headers name it)."""
ACTOR = "web: tester@box (pid 1)"
SCRIPT = "<script>window.__pwned='script'</script>"
IMG = "<img src=x onerror=\"window.__pwned='img'\">"
ENV_KEY = "<i>HTML_ENV</i>"
"""An environment variable's name cannot hold '=': markup without attributes."""
HOSTILE_ARGV = [
    "sh",
    "-c",
    'printf "%s\\n%s\\n" "$1" "$2"; printf "%s\\n" "$2" >&2',
    "sh",
    SCRIPT,
    IMG,
]
WEB_STACK = ("starlette", "uvicorn", "jinja2")


def client_for(db: Db, *, actions: bool = False, guard: Guard | None = None) -> TestClient:
    target = str(db)
    access = QueueAccess(
        lambda: open_read(target), lambda: open_write(target), driver_of(target).display
    )
    port = PORT if guard is None else guard.port
    app = create_app(access, guard or Guard.loopback(PORT), Settings(actions, ACTOR))
    return TestClient(app, base_url=f"http://127.0.0.1:{port}", follow_redirects=False)


def drain(db: Db) -> None:
    result = run_quiet("work", "--db", str(db), "--drain", "--json")
    assert result.exit_code == 0, result.stdout + result.stderr


def hostile_queue(db: Db) -> dict[str, int]:
    """A finished job whose command, note, tags, env keys and output all hold
    HTML and script; a dead job; a queued one in a paused lane; a waiting one."""
    hostile = add_job(
        db, *HOSTILE_ARGV, note=IMG, tags={"x": IMG, "<b>k</b>": SCRIPT}, env={ENV_KEY: "v"}
    )
    dead = add_job(db, "sh", "-c", "echo boom >&2; exit 3", max_retries=0)
    drain(db)
    queued = add_job(db, "sleep", "1", lane="slow", priority=2, tags={"team": "ml"})
    waiting = add_job(db, "true", lane="slow", after_jobs=(queued,))
    result = run_quiet("pause", "--db", str(db), "slow", "--reason", IMG, "--json")
    assert result.exit_code == 0, result.stdout
    return {"hostile": hostile, "dead": dead, "queued": queued, "waiting": waiting}


@pytest.fixture(scope="module")
def shown(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    db = tmp_path_factory.mktemp("web") / "spool" / "queue.db"
    return db, hostile_queue(db)


@pytest.fixture
def client(shown: tuple[Path, dict[str, int]]) -> Iterator[TestClient]:
    with client_for(shown[0]) as found:
        yield found


def assert_escaped(html: str) -> None:
    """Nothing a job wrote became markup: the only script is our own file."""
    assert "<script>window" not in html and "<img src=x" not in html, html
    assert "<b>k</b>" not in html and "<i>HTML_ENV" not in html
    scripts = re.findall(r"<script[^>]*>", html)
    assert all(s == '<script src="/static/app.js" defer>' for s in scripts), scripts


# -- pages ------------------------------------------------------------------------


def test_every_page_shows_the_queue_and_escapes_what_jobs_control(
    client: TestClient, shown: tuple[Path, dict[str, int]]
) -> None:
    ids = shown[1]
    pages = {
        "/": ["Lanes", "slow", "paused", "Recent dead jobs", f"#{ids['dead']}"],
        "/?partial=1": ['id="count-done"'],
        "/jobs": [f'data-job="{ids["hostile"]}"', "&lt;script&gt;window.__pwned"],
        f"/jobs/{ids['hostile']}": [
            "&lt;script&gt;window.__pwned",  # the command and stdout
            "&lt;img src=x onerror=",  # note, tag value, stderr
            "&lt;b&gt;k&lt;/b&gt;",  # a tag key
            "&lt;i&gt;HTML_ENV&lt;/i&gt;",  # an env key
            "Env keys",
        ],
        f"/jobs/{ids['hostile']}?partial=head": ["Job #"],
        f"/jobs/{ids['hostile']}?partial=history": ["Attempts", "succeeded"],
        f"/jobs/{ids['waiting']}": ["After", f"#{ids['queued']}", "waiting"],
        f"/jobs/{ids['queued']}": ["Before", f"#{ids['waiting']}", "has not run yet"],
        "/events": ["paused", "&lt;img src=x onerror="],  # the pause reason in its detail
    }
    for path, wanted in pages.items():
        response = client.get(path)
        assert response.status_code == 200, (path, response.text)
        assert response.headers["content-type"].startswith("text/html")
        for text in wanted:
            assert text in response.text, (path, text)
        assert_escaped(response.text)
    dead = client.get(f"/jobs/{ids['dead']}").text
    assert "boom" in dead and "process_exit" in dead


def test_live_json_carries_output_as_text_and_ledger_rows_escaped(
    client: TestClient, shown: tuple[Path, dict[str, int]]
) -> None:
    hostile = shown[1]["hostile"]
    out = client.get(f"/jobs/{hostile}/output", params={"stream": "stdout", "offset": 0})
    assert out.headers["content-type"] == "application/json"
    chunk = out.json()
    assert chunk["text"] == f"{SCRIPT}\n{IMG}\n"
    assert chunk["offset"] == len(chunk["text"].encode()) and not chunk["running"]
    assert chunk["job_terminal"] is True and chunk["attempt_no"] == 1
    later = client.get(f"/jobs/{hostile}/output", params={"stream": "stderr", "offset": 5})
    assert later.json()["text"] == IMG[5:] + "\n"
    live = client.get("/events/live", params={"cursor": 0}).json()
    assert live["count"] >= 8 and live["cursor"] >= live["count"]
    assert_escaped(live["html"])
    ids = [int(i) for i in re.findall(r'data-event="(\d+)"', live["html"])]
    assert ids == sorted(ids, reverse=True), "newest first"
    assert client.get("/events/live", params={"cursor": live["cursor"]}).json()["count"] == 0


def test_responses_carry_the_security_headers(client: TestClient) -> None:
    for path in ("/", "/jobs", "/static/app.js", "/nope"):
        headers = client.get(path).headers
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "same-origin"
        assert headers["x-frame-options"] == "DENY"
    cookie = client.get("/").headers["set-cookie"]
    assert f"spoolctl_csrf_{PORT}=" in cookie
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower()


def test_bad_requests_get_an_error_page_not_a_traceback(client: TestClient) -> None:
    cases = {
        "/jobs/abc": 400,
        "/jobs/0": 400,
        "/jobs/99999": 404,
        "/jobs?state=bogus": 400,
        "/jobs?limit=100000": 400,
        "/jobs?queue=bad%20name": 400,
        "/jobs/1?attempt=9": 404,
        "/jobs/1/output?stream=stdin": 400,
        "/events?before=x": 400,
        "/nope": 404,
        f"/jobs/{2**70}": 400,
    }
    for path, status in cases.items():
        response = client.get(path)
        assert response.status_code == status, (path, response.text)
        assert "Traceback" not in response.text
    assert client.request("PUT", "/").status_code == 405


def test_a_timed_out_attempt_shows_the_signal_that_stopped_it(tmp_path: Path) -> None:
    """It has no exit code (null, as in 0.4.11): the Exit cell names the signal."""
    db = tmp_path / "spool" / "queue.db"
    slow = add_job(db, "sleep", "30", timeout_seconds=1, max_retries=0)
    failed = add_job(db, "sh", "-c", "exit 3", max_retries=0)
    drain(db)
    exit_cell = re.compile(
        r'<table class="attempts">.*?<td class="num">1</td>.*?<td class="num">([^<]*)</td>', re.S
    )
    with client_for(db) as client:
        cells = {j: exit_cell.findall(client.get(f"/jobs/{j}").text) for j in (slow, failed)}
    assert cells == {slow: ["SIGTERM"], failed: ["3"]}


def test_job_list_filters_and_pages_by_id_cursor(tmp_path: Path) -> None:
    db = tmp_path / "spool" / "queue.db"
    for n in range(130):
        add_job(db, "true", lane="a" if n % 2 else "b", priority=n % 3, tags={"n": str(n % 5)})
    with client_for(db) as client:
        first = client.get("/jobs").text
        shown_ids = [int(i) for i in re.findall(r'data-job="(\d+)"', first)]
        assert shown_ids == list(range(130, 80, -1)), "newest first, 50 a page"
        older = re.search(r'href="(/jobs\?[^"]*before=\d+[^"]*)"', first)
        assert older is not None
        second = client.get(older.group(1).replace("&amp;", "&")).text
        assert [int(i) for i in re.findall(r'data-job="(\d+)"', second)] == list(range(80, 30, -1))
        page = client.get("/jobs", params={"queue": "a", "priority_min": 2, "tag": "n=1"}).text
        picked = [int(i) for i in re.findall(r'data-job="(\d+)"', page)]
        expected = [n + 1 for n in range(129, -1, -1) if n % 2 and n % 3 == 2 and n % 5 == 1]
        assert picked == expected and picked
        keyed = client.get("/jobs", params=[("tag", "n"), ("state", "queued,done")]).text
        assert len(re.findall(r'data-job="', keyed)) == 50
        assert client.get("/jobs", params={"state": "dead"}).text.count('data-job="') == 0


def test_utf8_split_across_reads_is_held_back_until_complete() -> None:
    data = "é€😀".encode()
    for cut in range(len(data) + 1):
        head, used = decode_complete(data[:cut], final=False)
        rest, _ = decode_complete(data[used:], final=True)
        assert head + rest == "é€😀", cut
        assert "\ufffd" not in head
    assert skip_partial_head(data[1:]) == 1
    assert skip_partial_head(b"abc") == 0


# -- who may use it ----------------------------------------------------------------


def test_a_foreign_host_header_is_refused_without_a_token(
    client: TestClient, shown: tuple[Path, dict[str, int]]
) -> None:
    """A site that rebinds its own name to 127.0.0.1 still names itself in Host."""
    for host in ("evil.example", f"evil.example:{PORT}", "127.0.0.1.evil.example", "[::2]:80"):
        response = client.get("/", headers={"host": host})
        assert response.status_code == 421, host
        assert "slow" not in response.text
    for host in (f"localhost:{PORT}", f"[::1]:{PORT}", f"127.0.0.1:{PORT}", "localhost:9000"):
        assert client.get("/", headers={"host": host}).status_code == 200, host


def test_a_token_is_needed_as_bearer_or_through_the_one_time_link(
    shown: tuple[Path, dict[str, int]],
) -> None:
    token = "t" * 20
    guard = Guard(PORT, token)
    with client_for(shown[0], guard=guard) as client:
        guard_path = re.search(r"/login\?once=[\w-]+", str(guard.login_path))
        assert guard_path is not None
        for headers in (
            {},
            {"authorization": "Bearer wrong-token-xxxxxxx"},
            {"authorization": token},
        ):
            refused = client.get("/", headers=headers)
            assert refused.status_code == 401 and "slow" not in refused.text
            assert refused.headers["www-authenticate"] == "Bearer"
        assert client.get("/", headers={"authorization": f"Bearer {token}"}).status_code == 200
        anywhere = {"host": "anything.example", "authorization": f"Bearer {token}"}
        assert client.get("/", headers=anywhere).status_code == 200, "a token needs no Host check"
        login = client.get(guard_path.group(0))
        assert login.status_code == 303 and login.headers["location"] == "/"
        cookie = login.headers["set-cookie"]
        assert f"spoolctl_session_{PORT}=" in cookie and "HttpOnly" in cookie
        assert "samesite=strict" in cookie.lower() and token not in cookie
        assert client.get("/").status_code == 200, "the session cookie lets the browser in"
        client.cookies.clear()
        assert client.get(guard_path.group(0)).status_code == 401, "the link works once"
        assert client.get("/").status_code == 401


# -- actions -------------------------------------------------------------------------


def csrf_of(client: TestClient, path: str = "/") -> str:
    page = client.get(path).text
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, "the page offers a form"
    return found.group(1)


def test_without_allow_actions_no_form_is_shown_and_posts_are_refused(
    client: TestClient, shown: tuple[Path, dict[str, int]]
) -> None:
    ids = shown[1]
    for path in ("/", f"/jobs/{ids['dead']}", f"/jobs/{ids['queued']}", "/jobs", "/events"):
        page = client.get(path).text
        assert '<form method="post"' not in page and "data-action" not in page, path
    before = rows(shown[0], "SELECT count(*) FROM job_events")[0][0]
    for path in (
        f"/jobs/{ids['dead']}/retry",
        f"/jobs/{ids['queued']}/cancel",
        "/lanes/slow/resume",
        "/lanes/default/pause",
    ):
        refused = client.post(path, data={"csrf": "x"})
        assert refused.status_code == 403 and "--allow-actions" in refused.text, path
    assert rows(shown[0], "SELECT count(*) FROM job_events")[0][0] == before
    assert job(shown[0], ids["dead"])["state"] == "dead"


@pytest.mark.both_backends
def test_actions_go_through_the_services_and_are_ledgered_as_the_web(db: Db) -> None:
    ids = hostile_queue(db)
    with client_for(db, actions=True) as client:
        overview = client.get("/").text
        assert 'data-action="retry"' in overview and 'data-action="resume"' in overview
        csrf = csrf_of(client)
        retried = client.post(f"/jobs/{ids['dead']}/retry", data={"csrf": csrf})
        assert retried.status_code == 303
        assert retried.headers["location"] == f"/jobs/{ids['dead']}?done=retry"
        assert "Retried" in client.get(retried.headers["location"]).text
        canceled = client.post(f"/jobs/{ids['queued']}/cancel", data={"csrf": csrf, "next": "/"})
        assert canceled.headers["location"] == "/?done=cancel"
        assert client.post("/lanes/slow/resume", data={"csrf": csrf}).status_code == 303
        paused = client.post("/lanes/other/pause", data={"csrf": csrf, "reason": "deploy"})
        assert paused.status_code == 303
        again = client.post(f"/jobs/{ids['queued']}/cancel", data={"csrf": csrf})
        assert again.status_code == 409 and "CONFLICT" in again.text
        hostile = client.post("/jobs/1/retry", data={"csrf": csrf, "next": "//evil.example/"})
        assert hostile.status_code == 409, "a done job cannot be retried"
    assert job(db, ids["dead"])["state"] == "queued"
    assert job(db, ids["queued"])["state"] == "canceled"
    assert job(db, ids["waiting"])["state"] == "canceled", "its dependent followed, as in the CLI"
    ledger = rows(db, "SELECT event, job_id, detail FROM job_events ORDER BY id")
    by_web = {
        (event, job_id): json.loads(detail)
        for event, job_id, detail in ledger
        if detail and ACTOR in (json.loads(detail).get("by") or "")
    }
    assert by_web[("retried", ids["dead"])]["from"] == "dead"
    assert by_web[("canceled", ids["queued"])]["was_running"] is False
    assert by_web[("resumed", None)]["queue"] == "slow"
    assert by_web[("paused", None)] == {
        "queue": "other",
        "by": ACTOR + ", client testclient",
        "reason": "deploy",
    }
    lanes = rows(db, "SELECT queue, paused_by FROM lanes")
    assert [tuple(r) for r in lanes] == [("other", ACTOR + ", client testclient")]


def test_cross_site_posts_are_refused_and_change_nothing(tmp_path: Path) -> None:
    db = tmp_path / "spool" / "queue.db"
    dead = add_job(db, "false", max_retries=0)
    drain(db)
    with client_for(db, actions=True) as client:
        csrf = csrf_of(client, f"/jobs/{dead}")
        path = f"/jobs/{dead}/retry"
        cases = [
            ({"csrf": "forged"}, {}),
            ({"next": "/"}, {}),
            ({"csrf": csrf}, {"origin": "http://evil.example"}),
            ({"csrf": csrf}, {"origin": "null"}),
            ({"csrf": csrf}, {"sec-fetch-site": "cross-site"}),
            ({"csrf": csrf}, {"referer": "http://evil.example/page"}),
        ]
        for form, headers in cases:
            response = client.post(path, data=form, headers=headers)
            assert response.status_code == 403, (form, headers)
        stolen = client.cookies.get(f"spoolctl_csrf_{PORT}")
        client.cookies.clear()
        no_cookie = client.post(path, data={"csrf": csrf})
        assert no_cookie.status_code == 403, "the SameSite cookie must come along"
        assert job(db, dead)["state"] == "dead"
        client.cookies.set(f"spoolctl_csrf_{PORT}", stolen or "")
        proxied = client.post(
            path, data={"csrf": csrf}, headers={"origin": f"https://evil.example:{PORT}"}
        )
        assert proxied.status_code == 403
        same_site = {"origin": f"https://127.0.0.1:{PORT}", "sec-fetch-site": "same-origin"}
        assert client.post(path, data={"csrf": csrf}, headers=same_site).status_code == 303
    assert job(db, dead)["state"] == "queued"


@pytest.mark.both_backends
def test_a_database_url_never_shows_its_password(db: Db) -> None:
    add_job(db, "true")
    with client_for(db) as client:
        page = client.get("/").text
    if isinstance(db, str):
        password = re.search(r"://[^:/]+:([^@]+)@", db)
        assert password is not None and password.group(1) not in page
        assert "***" in page
    else:
        assert str(db) in page


# -- the layers ---------------------------------------------------------------------

SQL_BUILDERS = {"select", "insert", "update", "delete", "text", "func", "union", "and_", "or_"}
NOT_FOR_THE_WEB = (
    "spoolctl.db.tables",
    "spoolctl.db.backends.sqlite",
    "spoolctl.db.backends.postgresql",
    "spoolctl.db.prepared",
    "spoolctl.db.engine",
    "spoolctl.cli",
    "click",
)


@pytest.mark.parametrize(
    "path", sorted((REPO / "spoolctl" / "web").rglob("*.py")), ids=lambda p: p.name
)
def test_the_web_layer_runs_no_sql_of_its_own(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert not alias.name.startswith(("sqlalchemy", *NOT_FOR_THE_WEB)), alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert not node.module.startswith(NOT_FOR_THE_WEB), node.module
            if node.module.startswith("sqlalchemy"):
                names = {alias.name for alias in node.names}
                assert node.module == "sqlalchemy" and names <= {"Connection"}, names
                assert not names & SQL_BUILDERS
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            assert not re.search(r"\b(SELECT|INSERT INTO|UPDATE|DELETE FROM)\s", node.value)
    for template in (REPO / "spoolctl" / "web" / "templates").glob("*.html"):
        assert "|safe" not in template.read_text().replace(" ", ""), template.name


def test_no_other_verb_imports_the_web_stack(tmp_path: Path) -> None:
    db = tmp_path / "q" / "queue.db"
    modules_after(["add", "--db", str(db), "--json", "--", "true"], tmp_path)
    for argv in (["add", "--db", str(db), "--json", "--", "true"], ["capabilities", "--json"]):
        _, loaded = modules_after(argv, tmp_path)
        assert not [m for m in loaded if m.split(".")[0] in WEB_STACK], argv
        assert not any(m.startswith("spoolctl.web") for m in loaded), argv


# -- the verb, as a real process ---------------------------------------------------


def spoolctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spoolctl", *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_beyond_loopback_without_a_token_is_refused_before_listening(tmp_path: Path) -> None:
    db = str(tmp_path / "queue.db")
    for host in ("0.0.0.0", "::"):
        refused = spoolctl("web", "--db", db, "--host", host, "--json")
        envelope = json.loads(refused.stdout)
        assert refused.returncode == 2, refused.stderr
        assert envelope["errors"][0]["code"] == "SAFETY_BLOCK" and envelope["ok"] is False
        assert "--token" in envelope["errors"][0]["message"]
        assert refused.stdout.count("\n") == 1, "no URL, nothing listened"
    short = spoolctl("web", "--db", db, "--token", "short", "--json")
    assert (
        short.returncode == 1 and json.loads(short.stdout)["errors"][0]["code"] == "INVALID_INPUT"
    )
    text = spoolctl("web", "--db", db, "--host", "0.0.0.0")
    assert text.returncode == 2 and text.stdout == ""
    assert text.stderr.startswith("spoolctl: SAFETY_BLOCK: refusing to serve")
    assert not Path(db).exists(), "a refusal opens no queue"


def test_a_file_that_is_not_a_current_queue_is_refused_before_listening(tmp_path: Path) -> None:
    foreign = tmp_path / "other.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    refused = spoolctl("web", "--db", str(foreign), "--json")
    assert refused.returncode == 3 and refused.stdout.count("\n") == 1, refused.stdout
    assert json.loads(refused.stdout)["ok"] is False


class _Stay(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


NO_REDIRECTS = urllib.request.build_opener(_Stay)


class Served:
    """`spoolctl web` started on port 0; the URL is its first line."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "spoolctl", "web", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
            stdin=subprocess.DEVNULL,
        )
        assert self.proc.stdout is not None
        self.first = self.proc.stdout.readline()
        assert self.first, self.proc.stderr.read() if self.proc.stderr else ""

    def get(self, url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        """One request; a redirect is returned, not followed."""
        request = urllib.request.Request(url, headers=headers or {})
        try:
            with NO_REDIRECTS.open(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def listening(self) -> list[tuple[str, int]]:
        found = psutil.Process(self.proc.pid).net_connections(kind="inet")
        return [(c.laddr.ip, c.laddr.port) for c in found if c.status == psutil.CONN_LISTEN]

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str, str]:
        self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, out, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for server in started:
        server.kill()


def test_serves_on_loopback_until_a_signal_and_answers_in_the_published_shapes(
    tmp_path: Path, served: list[Served]
) -> None:
    db = tmp_path / "spool" / "queue.db"
    add_job(db, "true")
    server = Served("--db", str(db), "--json")
    served.append(server)
    frame = json.loads(server.first)
    assert schema_errors(frame, STREAMS["web_listening"]) == [], frame
    facts = frame["listening"]
    assert facts["url"] == f"http://127.0.0.1:{facts['port']}/" and facts["port"] > 0
    assert facts["login_url"] is None and facts["token_required"] is False
    assert server.listening() == [("127.0.0.1", facts["port"])], "one socket, on loopback only"
    status, page = server.get(facts["url"])
    assert status == 200 and "Overview" in page
    code, out, err = server.stop(signal.SIGTERM)
    envelope = json.loads(out)
    assert code == 0 and "Traceback" not in err, err
    assert schema_errors(envelope, ENVELOPE) == []
    assert schema_errors(envelope["data"], DATA_SCHEMAS["web"]) == []
    assert envelope["data"]["stopped_by"] == "SIGTERM"


def test_a_token_server_prints_a_one_time_login_link(tmp_path: Path, served: list[Served]) -> None:
    token = "s3cret-token-0123456789"
    server = Served("--db", str(tmp_path / "queue.db"), "--token", token, "--host", "0.0.0.0")
    served.append(server)
    url = server.first.strip()
    assert server.proc.stdout is not None
    login = server.proc.stdout.readline().strip().split(": ", 1)[1]
    port = int(url.rsplit(":", 1)[1].strip("/"))
    assert server.listening() == [("0.0.0.0", port)]
    local = f"http://127.0.0.1:{port}/"
    assert server.get(local)[0] == 401
    assert server.get(local, {"Authorization": f"Bearer {token}"})[0] == 200
    assert token not in login and "once=" in login
    assert server.get(login.replace(url, local))[0] == 303, "the link lets one in (then /)"
    assert server.get(login.replace(url, local))[0] == 401, "once only"
    code, out, err = server.stop(signal.SIGINT)
    assert code == 0 and out.strip() == "spoolctl web: stopped (SIGINT)", (out, err)
    assert token not in out + err
