"""Regenerate docs/verbs.md from the click command tree: python scripts/gen_docs.py"""

from __future__ import annotations

from pathlib import Path

from spoolctl.cli.docgen import verbs_markdown

TARGET = Path(__file__).resolve().parents[1] / "docs" / "verbs.md"

if __name__ == "__main__":
    TARGET.write_text(verbs_markdown(), encoding="utf-8")
    print(f"wrote {TARGET}")
