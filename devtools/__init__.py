"""Development tools that the tests and the benchmark share (bench/ never
imports tests/, tests/ never imports bench/: what both need lives here).
Importable from the repository root; not part of spoolctl, not in the wheel."""
