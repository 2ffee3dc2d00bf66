"""What `--db` names: a value that looks like a URL is parsed as one and is
never taken for a file path; a password never shows, however the URL is
written (docs/postgresql.md, connection settings). A libpq connection
string and a URL with several hosts are PostgreSQL's too."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from urllib.parse import unquote

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import make_url

from spoolctl.db import backends
from spoolctl.db.backends import parse_db_url
from spoolctl.db.backends.postgresql.url import connect_kwargs, scrub
from spoolctl.db.url import MASK, looks_like_conninfo, looks_like_url, masked
from spoolctl.errors import InvalidInput
from tests.helpers import inproc

Capsys = pytest.CaptureFixture[str]

SECRET = "s3cr3t"
NEAR_URLS = [
    f"postgresql:/user:{SECRET}@host:5432/db",
    f"postgresql//user:{SECRET}@host:5432/db",
    f"postgres:/user:{SECRET}@host/db",
    f" postgresql://user:{SECRET}@host/db",
    f"postgresql://user:{SECRET}@host/db ",
    f"user:{SECRET}@host/db",
    f"mysql://user:{SECRET}@host/db",
    f"postgresql://user:{SECRET}@host:54x/db",
    f"postgresql://user:{SECRET}@h@host/db",
    f"postgresql://us@er:{SECRET}@host/db",
    f"postgresql://user:{SECRET}@host:99999/db",
    f"postgresql://user:{SECRET}@host/",
    "sqlite://",
    "sqlite:///:memory:",
    "sqlite://host/file.db",
    "sqlite:///q.db?mode=ro",
    "queue:1.db",
]


GIVEN_AS = [("flag", value) for value in NEAR_URLS] + [
    (source, value) for source in ("env", "config") for value in NEAR_URLS[:4]
]


@pytest.mark.parametrize(("given_as", "value"), GIVEN_AS)
def test_a_near_url_is_refused_and_creates_nothing(
    value: str, given_as: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    flag: list[str] = []
    if given_as == "flag":
        flag = ["--db", value]
    elif given_as == "env":
        monkeypatch.setenv("SPOOLCTL_DB", value)
    else:
        (tmp_path / ".spoolctl").mkdir()
        (tmp_path / ".spoolctl" / "config.json").write_text(json.dumps({"db_path": value}))
    before = sorted(tmp_path.rglob("*"))
    result = inproc("add", "--json", *flag, "--", "true", capsys=capsys)
    error = result.envelope["errors"][0]
    assert (result.exit_code, error["code"]) == (1, "INVALID_INPUT"), error
    assert SECRET not in result.stdout + result.stderr
    assert sorted(tmp_path.rglob("*")) == before, "a near-URL became a file or folder"
    for verb in ("doctor", "config-show", "status", "list"):
        for as_json in ([], ["--json"]):
            shown = inproc(verb, *as_json, *flag, capsys=capsys)
            assert SECRET not in shown.stdout + shown.stderr, (verb, shown.stdout, shown.stderr)
    assert sorted(tmp_path.rglob("*")) == before


def test_a_malformed_url_gets_the_percent_encoding_hint() -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_db_url(f"postgresql://user:{SECRET}@h@host/db", "--db")
    assert "%40" in refused.value.message and SECRET not in refused.value.message


@pytest.mark.parametrize(
    "password",
    ["se/cret", "se#cret", "se?cret", "se:cret", "s e", "per%cent", "pa%2Fss", "ümlaut", "a@b"],
)
@pytest.mark.parametrize("scheme", ["postgresql", "postgres", "postgresql+psycopg"])
def test_a_password_never_shows_however_written(scheme: str, password: str) -> None:
    url = f"{scheme}://user:{password}@localhost:5432/queue"
    shown = masked(url)
    assert password not in shown and MASK in shown, shown
    assert shown.startswith(f"{scheme}://")
    try:
        kind, canonical = parse_db_url(url, "--db")
    except InvalidInput as refused:
        assert password not in refused.message and password not in json.dumps(refused.detail)
        return
    assert kind == "postgresql"
    decoded = unquote(password)  # userinfo is percent-decoded, as in every URL
    assert make_url(canonical).password == decoded
    assert password not in masked(canonical) and decoded not in masked(canonical)
    assert decoded not in scrub(f"FATAL: login as user with {decoded} failed", canonical)


def test_secret_query_options_are_masked_too() -> None:
    shown = masked(f"postgresql://u@h/db?password={SECRET}&sslmode=require")
    assert SECRET not in shown and "sslmode=require" in shown


def test_connect_kwargs_hand_the_password_over_undecoded_by_libpq() -> None:
    canonical = parse_db_url("postgresql://u:se/cr#et@h:6543/db?sslmode=disable", "--db")[1]
    assert connect_kwargs(canonical) == {
        "user": "u",
        "password": "se/cr#et",
        "host": "h",
        "port": 6543,
        "dbname": "db",
        "sslmode": "disable",
    }


@pytest.mark.parametrize(
    "value", ["queue.db", "./a:b.db", "/tmp/x/queue.db", "2024:logs.db", "~/q.db", " queue.db"]
)
def test_paths_stay_paths(value: str) -> None:
    assert not looks_like_url(value)


ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
HEADS = [
    "postgresql://",
    "postgres://",
    "postgresql+psycopg://",
    "postgresql:/",
    "postgresql//",
    " ",
]


MARKED = st.tuples(ANY_TEXT, ANY_TEXT).map(lambda parts: f"{parts[0]}§{parts[1]}")
"""Any text around a character no message or URL of ours holds, so a password
found in the output is the password, not a word that happens to match."""


@settings(max_examples=300, deadline=None)
@given(user=st.text("abcxyz", min_size=1, max_size=6), password=MARKED, head=st.sampled_from(HEADS))
@example(user="a", password="0§://", head="postgresql:/")  # a '://' in the password
@example(user="a", password="x?password=§", head="postgresql:/")
def test_masking_never_leaks_a_password(user: str, password: str, head: str) -> None:
    """Whatever the characters (reserved, spaces, '@', '%', non-ASCII), the
    password is neither in the masked form nor in any refusal."""
    url = f"{head}{user}:{password}@localhost:5432/queue"
    assert password not in masked(url), url
    if not looks_like_url(url):
        return
    try:
        kind, canonical = parse_db_url(url, "--db")
    except InvalidInput as refused:
        shown = refused.message + json.dumps(refused.detail, ensure_ascii=False)
        assert password not in shown and "§" not in shown, url
        return
    assert kind == "postgresql"
    assert unquote(password) not in masked(canonical), url


SECRET = "s3§cr"
"""A secret query option's value, around the marker no message holds."""


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql:/host/db?password={SECRET}",  # one slash: no parser reads it
        f"postgresql:/host/db?x=1&PassWord={SECRET}#frag",
        f"postgresql:/host/db?password={SECRET}@x",  # an '@' in the value
        f"postgresql:/host/db?sslpassword={SECRET}&passfile={SECRET}",
        f"postgresql//host/db?password={SECRET}",
        f"postgresql://u:p@ss@host/db?password={SECRET}",  # two '@': not parsed either
        f"postgresql://host/db?passfile={SECRET}",  # parsed, no '@' and no 'password'
        f"postgresql:/host/db?passfile={SECRET}",
    ],
)
def test_a_secret_query_option_is_masked_in_a_url_no_parser_reads(url: str) -> None:
    shown = masked(url)
    assert "§" not in shown, shown
    try:
        parse_db_url(url, "--db")
    except InvalidInput as refused:
        text = refused.message + json.dumps(refused.detail, ensure_ascii=False)
        assert "§" not in text, text


# -- libpq connection strings and several hosts (docs/postgresql.md) ----------------------

CONNINFO_SECRET = "s3§cr"


@pytest.mark.parametrize(
    "value",
    [
        f"host=h password={CONNINFO_SECRET} dbname=q",
        f"password = {CONNINFO_SECRET}  dbname=q",
        f"host=h password='{CONNINFO_SECRET} it''s' dbname=q",
        f"host=h password='a \\' b {CONNINFO_SECRET}' dbname=q",
        f"host=h password=a\\ {CONNINFO_SECRET} dbname=q",
        f"host=h password=se {CONNINFO_SECRET} dbname=q",  # unquoted space: libpq refuses it
        f"host=h password='{CONNINFO_SECRET} dbname=q",  # a quote never closed
        f"host=h PASSWORD={CONNINFO_SECRET} dbname=q",
        f"dbname=q sslpassword={CONNINFO_SECRET} passfile=/x/{CONNINFO_SECRET}",
        f"dbname=q password={CONNINFO_SECRET}\\",
        f"host=h password={CONNINFO_SECRET}@x dbname=q user=u@v",
    ],
)
def test_a_connection_strings_secrets_never_show(value: str) -> None:
    assert looks_like_conninfo(value) and looks_like_url(value), "never a file name"
    assert "§" not in masked(value), masked(value)
    try:
        kind, canonical = parse_db_url(value, "--db")
    except InvalidInput as refused:
        text = refused.message + json.dumps(refused.detail, ensure_ascii=False)
        assert "§" not in text, text
        return
    assert kind == "postgresql"
    assert "§" not in masked(canonical) and "§" not in unquote(masked(canonical))


@settings(max_examples=200, deadline=None)
@given(password=MARKED.filter(lambda text: "\0" not in text))
def test_a_quoted_password_in_a_connection_string_is_read_and_masked(password: str) -> None:
    """Whatever the characters (but NUL, which no C string holds), a password
    quoted as libpq quotes it (psycopg's make_conninfo) is the URL's password
    and never shows."""
    from psycopg.conninfo import make_conninfo

    value = make_conninfo(host="h", port=5433, dbname="q", user="u", password=password)
    assert "§" not in masked(value), value
    kind, canonical = parse_db_url(value, "--db")
    assert kind == "postgresql" and make_url(canonical).password == password
    assert "§" not in masked(canonical) and "§" not in unquote(masked(canonical))


def test_a_connection_string_connects_as_the_equivalent_url() -> None:
    given = "host=127.0.0.1 port=5432 password=secret dbname=q user=u sslmode=disable"
    url = "postgresql://u:secret@127.0.0.1:5432/q?sslmode=disable"
    assert parse_db_url(given, "--db") == parse_db_url(url, "--db")
    assert (
        masked(parse_db_url(given, "--db")[1])
        == "postgresql://u:***@127.0.0.1:5432/q?sslmode=disable"
    )


SEVERAL_HOSTS = [
    ("postgresql://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write", "5432,5433"),
    ("postgres://u:p@h1,h2:5433/db?target_session_attrs=read-write", ",5433"),
    ("postgresql+psycopg://u:p@h1,h2/db?target_session_attrs=read-write", None),
    (
        "host=h1,h2 port=5432 user=u password=p dbname=db target_session_attrs=read-write",
        "5432,5432",
    ),
]
"""A URL or connection string naming hosts h1 and h2, and the ports libpq gets."""


@pytest.mark.parametrize(("value", "ports"), SEVERAL_HOSTS)
def test_several_hosts_reach_libpq_as_written(value: str, ports: str | None) -> None:
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    kind, canonical = parse_db_url(value, "--db")
    shown = masked(canonical)
    assert kind == "postgresql" and ":p@" not in shown and ":***@" in shown
    expected = {
        "user": "u",
        "password": "p",
        "dbname": "db",
        "host": "h1,h2",
        "target_session_attrs": "read-write",
    }
    assert connect_kwargs(canonical) == {**expected, **({"port": ports} if ports else {})}
    _, params = PGDialect_psycopg().create_connect_args(make_url(canonical))
    assert {key: params[key] for key in expected} == expected, "what SQLAlchemy hands psycopg"
    assert params["port"] == (ports or ","), "one port per host, empty for libpq's default"


@pytest.mark.parametrize("value", ["queue.db", "./host=x.db", "/srv/user=a/q.db", "a=b.db"])
def test_paths_are_not_connection_strings(value: str) -> None:
    assert not looks_like_conninfo(value) and not looks_like_url(value)


def test_every_scheme_names_a_driver_the_registry_can_reach() -> None:
    """The registry's tables (db/backends/__init__.py) name only driver
    modules that offer what it calls (`base.Backend` and its two kinds)."""
    assert set(backends.SCHEMES.values()) == set(backends.DRIVERS)
    assert {backends.FILE_BACKEND, backends.CONNINFO_BACKEND} <= set(backends.DRIVERS)
    for backend, module_name in backends.DRIVERS.items():
        module = importlib.import_module(module_name)
        assert callable(module.parse_url) and callable(module.located), backend
    assert callable(importlib.import_module(backends.DRIVERS[backends.FILE_BACKEND]).at)
    conninfo = importlib.import_module(backends.DRIVERS[backends.CONNINFO_BACKEND])
    assert callable(conninfo.parse_conninfo)
