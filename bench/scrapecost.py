"""Time one metrics scrape in-process, many times, on a queue file.

Run under ours' interpreter (.venv): python bench/scrapecost.py DB REPS

A scrape is what the web's /metrics does: read the queue's figures in one
snapshot (`services/metrics.collect`) and render the exposition with
prometheus_client. `warm_s`: one long-lived scraper (its ended-attempt
totals kept between scrapes, as the dashboard keeps them; one untimed scrape
first); `cold_s`: a fresh scraper each time (what one `spoolctl metrics`
process does). Prints {"warm_s": [...], "cold_s": [...], "bytes": N}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(db: Path, reps: int) -> dict[str, object]:
    from spoolctl import exposition
    from spoolctl.db.backends import sqlite_at
    from spoolctl.db.queue import open_for_read
    from spoolctl.services import metrics
    from spoolctl.services.totals import EndedTotals

    queue = open_for_read(sqlite_at(db))
    assert queue is not None, f"no queue at {db}"

    def scrape(totals: EndedTotals) -> tuple[float, int]:
        start = time.perf_counter()
        now = queue.now()
        snapshot = queue.read(
            lambda conn: metrics.collect(conn, now, live_within_s=30.0, totals=totals)
        )
        text = exposition.render(snapshot)
        return time.perf_counter() - start, len(text)

    kept = EndedTotals()
    _, size = scrape(kept)
    warm = [scrape(kept)[0] for _ in range(reps)]
    cold = [scrape(EndedTotals())[0] for _ in range(reps)]
    queue.dispose()
    return {"warm_s": warm, "cold_s": cold, "bytes": size}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), int(sys.argv[2]))))
