"""Regenerate docs/verbs.md (click command tree) and the environment table of
docs/configuration.md (ENV_VARS): python scripts/gen_docs.py"""

from __future__ import annotations

from pathlib import Path

from spoolctl.cli.docgen import verbs_markdown, with_env_table

DOCS = Path(__file__).resolve().parents[1] / "docs"
TARGET = DOCS / "verbs.md"
CONFIGURATION = DOCS / "configuration.md"

if __name__ == "__main__":
    TARGET.write_text(verbs_markdown(), encoding="utf-8")
    page = CONFIGURATION.read_text(encoding="utf-8")
    CONFIGURATION.write_text(with_env_table(page), encoding="utf-8")
    print(f"wrote {TARGET} and the environment table of {CONFIGURATION}")
