"""What differs per database engine: one module per backend (SQLite's lives in
`spoolctl.db.engine`, PostgreSQL's here), imported only when selected."""
