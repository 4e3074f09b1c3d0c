"""Helpers shared by the benchmarks: percentiles, pacing and a plain table."""

from __future__ import annotations

import http.client
import statistics
import time
from collections.abc import Callable, Sequence


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def paced(rate: float, count: int, send: Callable[[int], None]) -> None:
    """Call send(i) ``count`` times at ``rate`` per second (catching up if late)."""
    start = time.perf_counter()
    for i in range(count):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(i)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [list(map(str, header))] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(cells[0], widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells[1:]]
    return "\n".join(lines)


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def timed_post(conn: http.client.HTTPConnection, path: str, headers: dict[str, str], body: bytes,
               ok: tuple[int, ...] = (200, 202)) -> float:
    """Milliseconds for one POST on a kept-alive connection; the status must be one of ``ok``."""
    start = time.perf_counter()
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    response.read()
    assert response.status in ok, response.status
    return (time.perf_counter() - start) * 1000
