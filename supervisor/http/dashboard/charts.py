"""SVG charts drawn here, server-side: bars per time bucket, lines, sparklines, run strips.

Each function returns markup (``Markup``, already escaped) for a template. Times
are epoch seconds; every chart scales to its own maximum and says what it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from markupsafe import Markup

Point = tuple[float, float]  # (epoch seconds, value)

W, H, PAD_L, PAD_B = 640, 160, 40, 18


def _frame(title: str, top: float, t0: float, t1: float, body: str, legend: Sequence[tuple[str, str]]) -> Markup:
    keys = "".join(
        f'<rect x="{PAD_L + 8 + i * 110}" y="4" width="10" height="10" class="{cls}"/>'
        f'<text x="{PAD_L + 22 + i * 110}" y="13">{escape(name)}</text>'
        for i, (name, cls) in enumerate(legend))
    span = t1 - t0
    ago = f"{span / 3600:g} h ago" if span >= 3600 else f"{span / 60:g} min ago"
    return Markup(
        f'<svg class="chart" viewBox="0 0 {W} {H}" role="img" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>"
        f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W}" y2="{H - PAD_B}" class="axis"/>'
        f'<line x1="{PAD_L}" y1="20" x2="{PAD_L}" y2="{H - PAD_B}" class="axis"/>'
        f'<text x="{PAD_L - 4}" y="26" text-anchor="end">{_num(top)}</text>'
        f'<text x="{PAD_L - 4}" y="{H - PAD_B}" text-anchor="end">0</text>'
        f'<text x="{PAD_L}" y="{H - 4}">{ago}</text>'
        f'<text x="{W}" y="{H - 4}" text-anchor="end">now</text>'
        f"{keys}{body}</svg>")


def _num(v: float) -> str:
    return f"{v:.0f}" if v >= 10 or v == int(v) else f"{v:.1f}"


def _x(t: float, t0: float, t1: float) -> float:
    return PAD_L + (W - PAD_L) * (t - t0) / max(t1 - t0, 1e-9)


def _y(v: float, top: float) -> float:
    return (H - PAD_B) - (H - PAD_B - 20) * v / top


def stacked_bars(title: str, t0: float, t1: float, step: float,
                 buckets: Sequence[tuple[float, Sequence[float]]], names: Sequence[str]) -> Markup:
    """One bar per bucket, its parts stacked (e.g. succeeded under failed)."""
    top = max([sum(parts) for _, parts in buckets] + [1])
    width = max((W - PAD_L) * step / max(t1 - t0, 1) - 1, 1)
    rects = []
    for t, parts in buckets:
        base = 0.0
        for i, v in enumerate(parts):
            if v:
                y0, y1 = _y(base, top), _y(base + v, top)
                rects.append(f'<rect x="{_x(t, t0, t1):.1f}" y="{y1:.1f}" width="{width:.1f}" '
                             f'height="{y0 - y1:.1f}" class="bar s{i}"><title>{escape(names[i])}: {v:g}</title></rect>')
            base += v
    return _frame(title, top, t0, t1, "".join(rects), [(n, f"s{i}") for i, n in enumerate(names)])


def lines(title: str, t0: float, t1: float, series: Sequence[tuple[str, Sequence[Point]]]) -> Markup:
    top = max([v for _, pts in series for _, v in pts] + [1])
    paths = []
    for i, (_, pts) in enumerate(series):
        if pts:
            coords = " ".join(f"{_x(t, t0, t1):.1f},{_y(v, top):.1f}" for t, v in pts)
            paths.append(f'<polyline points="{coords}" class="l{i}"/>')
    # The key takes its line's colour (l0, l1, ...), not the bars' (s0, s1, ...).
    return _frame(title, top, t0, t1, "".join(paths), [(n, f"l{i}") for i, (n, _) in enumerate(series)])


def sparkline(points: Sequence[Point], t0: float, t1: float, label: str) -> Markup:
    """A 120x24 line scaled to its own peak (the cell beside it says how that compares
    with the limit), for a table cell."""
    w, h = 120, 24
    if not points:
        return Markup(f'<svg class="spark" viewBox="0 0 {w} {h}"><title>{escape(label)}: no samples</title></svg>')
    top = max(v for _, v in points) * 1.1 or 1.0
    coords = " ".join(f"{w * (t - t0) / max(t1 - t0, 1):.1f},{h - 1 - (h - 2) * v / top:.1f}" for t, v in points)
    return Markup(f'<svg class="spark" viewBox="0 0 {w} {h}"><title>{escape(label)}</title>'
                  f'<polyline points="{coords}"/></svg>')


def strip(runs: Sequence[tuple[str, str]]) -> Markup:
    """One square per run, oldest left, coloured by status; hover for when."""
    cells = "".join(f'<rect x="{i * 9}" y="0" width="8" height="14" class="run-{escape(status)}">'
                    f"<title>{escape(when)}: {escape(status)}</title></rect>"
                    for i, (status, when) in enumerate(runs))
    return Markup(f'<svg class="strip" viewBox="0 0 {max(len(runs), 1) * 9} 14" '
                  f'width="{max(len(runs), 1) * 9}" height="14">{cells}</svg>')
