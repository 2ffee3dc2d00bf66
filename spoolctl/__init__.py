"""spoolctl: a durable job queue for shell commands on one machine."""

__version__ = "0.5.1"
