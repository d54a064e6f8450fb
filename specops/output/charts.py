"""The report page's inline SVG charts: lines over concurrency and bars per release, each with
axes that carry ticks, values and units.

Nothing outside the SVG is referenced.  Series differ by marker shape and line dash as well as
colour, and a marked bar (a rolled-back release) by its dashed outline and a word under it, so
the charts read in print and by colour-blind readers.  Every text is escaped here: labels come
from hosts.  Tick labels carry data-axis="x" or "y", so a test can read the axes back.
"""
from __future__ import annotations

import html
import math
import re

W, H = 460, 270
LEFT, RIGHT, TOP, BOTTOM = 58, 62, 36, 58  # room for tick labels, axis titles, legend, a gate's label
BLUE = "#0b5394"
SERIES = {"speculative": (BLUE, "", "circle"), "baseline": ("#b45f06", "6 4", "square")}
# Any other series (a draft's, on the tuning section), by its place: colour, dash and marker all differ
OTHERS = [("#38761d", "2 3", "circle"), (BLUE, "", "square"), ("#b45f06", "6 4", "circle"),
          ("#741b47", "8 3 2 3", "circle")]
_STAMP = re.compile(r"^\d{4}(\d\d)(\d\d)T(\d\d)(\d\d)(\d\d)(?:\.\d+)?Z$")  # layout.new_stamp(): UTC, to the µs


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def ticks(top: float) -> list[float]:
    """0, then round steps (1, 2, 2.5 or 5 times a power of ten) up to the first at or above
    `top`: four to six ticks, so the axis ends on a labelled value."""
    if not top >= 1e-9:  # 0, or a figure so small that log10 of its quarter is no number (5e-324)
        return [0.0, 1.0]
    raw = top / 4
    scale = 10 ** math.floor(math.log10(raw))
    step = next(m * scale for m in (1, 2, 2.5, 5, 10) if m * scale >= raw * (1 - 1e-9))
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def tick_text(value: float, step: float) -> str:
    """A tick's value with as many decimals as its step needs (0.5 → "0.5", 150.0 → "150")."""
    decimals = max(0, 1 - math.floor(math.log10(step))) if step > 0 else 0
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def stamp_label(stamp: str, seconds: bool = False) -> str:
    """A release stamp as a person reads it on an axis: "20261203T160000.123456Z" → "12-03 16:00"
    (with `seconds`, "12-03 16:00:00")."""
    m = _STAMP.match(stamp)
    return f"{m[1]}-{m[2]} {m[3]}:{m[4]}" + (f":{m[5]}" if seconds else "") if m else stamp[:14]


def stamp_labels(stamps: list[str]) -> list[str]:
    """Labels for releases side by side (the bars, the page's words about them): to the minute, or
    to the second when two would read the same."""
    labels = [stamp_label(s) for s in stamps]
    return labels if len(set(labels)) == len(labels) else [stamp_label(s, seconds=True) for s in stamps]


def _frame(title: str, xlabel: str, ylabel: str, top: float) -> tuple[list[str], callable]:
    """The SVG's start, both axis titles and the y axis with its ticks and grid; and y → pixel."""
    marks = ticks(top)
    py = lambda y: H - BOTTOM - (H - TOP - BOTTOM) * y / marks[-1]  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" aria-label="{_e(title)}">',
           f'<title>{_e(title)}</title>',
           f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 8}" text-anchor="middle" font-size="12">{_e(xlabel)}</text>',
           f'<text x="14" y="{(TOP + H - BOTTOM) / 2}" text-anchor="middle" font-size="12" '
           f'transform="rotate(-90 14 {(TOP + H - BOTTOM) / 2})">{_e(ylabel)}</text>']
    for v in marks:
        y = py(v)
        if v:  # a light grid line, under what is drawn later
            out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<line x1="{LEFT - 5}" y1="{y:.1f}" x2="{LEFT}" y2="{y:.1f}" stroke="#000"/>'
                   f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end" font-size="11" data-axis="y">'
                   f'{tick_text(v, marks[1])}</text>')
    out += [f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}" stroke="#000"/>',
            f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" stroke="#000"/>']
    return out, py


def _x_tick(x: float, label: str, size: int = 11, dy: int = 16) -> str:
    return (f'<line x1="{x:.1f}" y1="{H - BOTTOM}" x2="{x:.1f}" y2="{H - BOTTOM + 5}" stroke="#000"/>'
            f'<text x="{x:.1f}" y="{H - BOTTOM + dy}" text-anchor="middle" font-size="{size}" data-axis="x">'
            f'{_e(label)}</text>')


def _marker(shape: str, x: float, y: float, colour: str) -> str:
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}"/>'
    return f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="{colour}"/>'


def line_chart(title: str, series: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str) -> str:
    """Lines over a shared x axis (values placed by rank, each with its tick and value)."""
    xs = sorted({x for pts in series.values() for x, _ in pts})
    out, py = _frame(title, xlabel, ylabel, max(y for pts in series.values() for _, y in pts))
    inner = W - LEFT - RIGHT
    px = {x: LEFT + inner * ((i + 0.5) / len(xs)) for i, x in enumerate(xs)}  # one level: mid-axis
    out += [_x_tick(px[x], str(x)) for x in xs]
    for i, (name, pts) in enumerate(series.items()):
        colour, dash, shape = SERIES.get(name) or OTHERS[i % len(OTHERS)]
        path = " ".join(f"{px[x]:.1f},{py(y):.1f}" for x, y in sorted(pts))
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"'
                   + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        out += [_marker(shape, px[x], py(y), colour) for x, y in pts]
        legend_x = W - RIGHT - 100 * (len(series) - i)  # a row above the plot, left to right
        out.append(_marker(shape, legend_x, 14, colour)
                   + f'<text x="{legend_x + 9}" y="18" font-size="11">{_e(name)}</text>')
    return "\n".join(out + ["</svg>"])


def bar_chart(title: str, bars: list[tuple[str, float, str]], ylabel: str, fmt: str = "{:.2f}",
              line: float | None = None) -> str:
    """One bar per release: (stamp, value, mark); a marked bar (e.g. "rolled back") is drawn in
    outline, dashed, with the mark under its label.  `line`: a gate's threshold, dashed."""
    out, py = _frame(title, "release (UTC)", ylabel, max([v for _, v, _ in bars] + [line or 0]))
    step = (W - LEFT - RIGHT) / max(len(bars), 1)
    labels = stamp_labels([stamp for stamp, _, _ in bars])
    for i, (stamp, v, mark) in enumerate(bars):
        x, width = LEFT + i * step + step * 0.2, step * 0.6
        style = f'fill="#fff" stroke="{BLUE}" stroke-width="2" stroke-dasharray="4 3"' if mark else \
            f'fill="{BLUE}" stroke="#000"'
        out.append(f'<rect x="{x:.1f}" y="{py(v):.1f}" width="{width:.1f}" height="{H - BOTTOM - py(v):.1f}" {style}/>')
        out.append(f'<text x="{x + width / 2:.1f}" y="{py(v) - 4:.1f}" text-anchor="middle" font-size="11">'
                   f'{_e(fmt.format(v))}</text>')
        out.append(_x_tick(x + width / 2, labels[i], size=10))
        if mark:
            out.append(f'<text x="{x + width / 2:.1f}" y="{H - BOTTOM + 28}" text-anchor="middle" font-size="10" '
                       f'font-style="italic">{_e(mark)}</text>')
    if line is not None:
        out.append(f'<line x1="{LEFT}" y1="{py(line):.1f}" x2="{W - RIGHT}" y2="{py(line):.1f}" stroke="#000" '
                   f'stroke-dasharray="5 4"/><text x="{W - RIGHT + 4}" y="{py(line) + 4:.1f}" font-size="11">'
                   f'gate {_e(line)}</text>')
    return "\n".join(out + ["</svg>"])
