"""What the views read of placement, on an SQLAlchemy connection: the
devices and who holds them, and the queued jobs no live worker could ever
hold (`doctor`, the web and `metrics` read these; `status`, `show`, `list`
and `workers` read the same through `services/placement_views.py`, which
assembles them from named statements on either path)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from spoolctl.services import placement_views
from spoolctl.services.placement_views import UNPLACEABLE_LIMIT, Unplaceable, Unplaceables
from spoolctl.services.statements import reads

__all__ = ["UNPLACEABLE_LIMIT", "Unplaceable", "Unplaceables", "device_table", "unplaceable"]


def unplaceable(conn: Connection, now: float, threshold_s: float) -> Unplaceables:
    """The queued jobs that ask for resources no live worker of their lane
    (heard from within `threshold_s`) has: 16 GPUs where the largest has 8,
    a model nobody has. A lane with no live worker at all is not counted."""
    return placement_views.unplaceable_of(reads(conn), now, threshold_s)


def device_table(conn: Connection) -> list[dict[str, Any]]:
    """Every registered device with what is held of it and by which jobs
    (`held_share`: 0 … 1; `holders`: job id, attempt id, worker, share)."""
    return placement_views.device_list(reads(conn))
