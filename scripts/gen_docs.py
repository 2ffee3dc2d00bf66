"""Regenerate docs/verbs.md (click command tree), the environment table of
docs/configuration.md (ENV_VARS) and the lean path's SQL (spoolctl/db/lean_sql.py,
from services/statements.py): python scripts/gen_docs.py"""

from __future__ import annotations

from pathlib import Path

from spoolctl.cli.docgen import verbs_markdown, with_env_table
from spoolctl.services.statements import lean_sql_module

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
LEAN_SQL = REPO / "spoolctl" / "db" / "lean_sql.py"
TARGET = DOCS / "verbs.md"
CONFIGURATION = DOCS / "configuration.md"

if __name__ == "__main__":
    TARGET.write_text(verbs_markdown(), encoding="utf-8")
    page = CONFIGURATION.read_text(encoding="utf-8")
    CONFIGURATION.write_text(with_env_table(page), encoding="utf-8")
    LEAN_SQL.write_text(lean_sql_module(), encoding="utf-8")
    print(f"wrote {TARGET}, the environment table of {CONFIGURATION} and {LEAN_SQL}")
