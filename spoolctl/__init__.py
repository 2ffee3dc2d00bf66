"""spoolctl: a durable job queue for shell commands, with no daemon."""

__version__ = "0.5.1"
