"""`inv report`: one self-contained HTML page of what spec-bench recorded, per host and service.

Nothing outside the file is referenced (no script, font, stylesheet or image from anywhere: it
opens on an air-gapped laptop).  Charts are inline SVG drawn here; series differ by marker shape
and line dash as well as colour (readable in print and by colour-blind readers), and every
plotted number is also in a table.  Each figure carries a data-* attribute with the exact value
from perf.json, so a test (or a script) can read the page back.

Everything shown comes from the host (its manifests and perf.json), so it is read back before it is
drawn: a figure must be a JSON number, else it is shown as absent and the section says which ones
were refused; every text is escaped.
"""
from __future__ import annotations

import html
import math
import time

W, H, PAD = 420, 240, 44
SERIES = {"speculative": ("#0b5394", "", "circle"), "baseline": ("#b45f06", "6 4", "square")}
FIGURES = ("output_tok_s", "accept_length", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99")
SHOWN_REFUSALS = 5  # a tampered file could name thousands; the page says how many more


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _marker(shape: str, x: float, y: float, colour: str) -> str:
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}"/>'
    return f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="{colour}"/>'


def line_chart(title: str, series: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str) -> str:
    """Lines over a shared x axis (values placed by rank, labelled with the value)."""
    xs = sorted({x for pts in series.values() for x, _ in pts})
    ymax = max([y for pts in series.values() for _, y in pts] + [1e-9]) * 1.15
    px = {x: PAD + (W - 2 * PAD) * (i / max(len(xs) - 1, 1)) for i, x in enumerate(xs)}
    py = lambda y: H - PAD - (H - 2 * PAD) * y / ymax  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" aria-label="{_e(title)}">',
           f'<title>{_e(title)}</title>',
           f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#000"/>',
           f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="#000"/>',
           f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle" font-size="12">{_e(xlabel)}</text>',
           f'<text x="12" y="{H / 2}" text-anchor="middle" font-size="12" transform="rotate(-90 12 {H / 2})">'
           f'{_e(ylabel)}</text>']
    for x in xs:
        out.append(f'<text x="{px[x]:.1f}" y="{H - PAD + 16}" text-anchor="middle" font-size="11">{_e(x)}</text>')
    for frac in (0.5, 1.0):
        out.append(f'<text x="{PAD - 6}" y="{py(ymax / 1.15 * frac):.1f}" text-anchor="end" font-size="10">'
                   f'{ymax / 1.15 * frac:.0f}</text>')
    for i, (name, pts) in enumerate(series.items()):
        colour, dash, shape = SERIES.get(name, ("#38761d", "2 3", "circle"))
        path = " ".join(f"{px[x]:.1f},{py(y):.1f}" for x, y in sorted(pts))
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"'
                   + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        out += [_marker(shape, px[x], py(y), colour) for x, y in pts]
        out.append(_marker(shape, W - PAD - 110, PAD - 22 + 14 * i, colour)
                   + f'<text x="{W - PAD - 100}" y="{PAD - 18 + 14 * i}" font-size="11">{_e(name)}</text>')
    return "\n".join(out + ["</svg>"])


def bar_chart(title: str, bars: list[tuple[str, float]], ylabel: str, line: float | None = None) -> str:
    """One bar per release; `line`: a gate's threshold, dashed."""
    ymax = max([v for _, v in bars] + [line or 0, 1e-9]) * 1.2
    step = (W - 2 * PAD) / max(len(bars), 1)
    py = lambda y: H - PAD - (H - 2 * PAD) * y / ymax  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" aria-label="{_e(title)}">',
           f'<title>{_e(title)}</title>',
           f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#000"/>',
           f'<text x="12" y="{H / 2}" text-anchor="middle" font-size="12" transform="rotate(-90 12 {H / 2})">'
           f'{_e(ylabel)}</text>']
    for i, (label, v) in enumerate(bars):
        x = PAD + i * step + step * 0.2
        out.append(f'<rect x="{x:.1f}" y="{py(v):.1f}" width="{step * 0.6:.1f}" height="{H - PAD - py(v):.1f}" '
                   f'fill="#0b5394" stroke="#000"/>')
        out.append(f'<text x="{x + step * 0.3:.1f}" y="{py(v) - 4:.1f}" text-anchor="middle" font-size="11">{v:.2f}</text>')
        out.append(f'<text x="{x + step * 0.3:.1f}" y="{H - PAD + 14}" text-anchor="middle" font-size="9">'
                   f'{_e(label[4:13])}</text>')  # a stamp's month, day and hour:minute
    if line is not None:
        out.append(f'<line x1="{PAD}" y1="{py(line):.1f}" x2="{W - PAD}" y2="{py(line):.1f}" stroke="#000" '
                   f'stroke-dasharray="5 4"/><text x="{W - PAD}" y="{py(line) - 4:.1f}" text-anchor="end" '
                   f'font-size="11">gate {_e(line)}</text>')
    return "\n".join(out + ["</svg>"])


def number(value) -> float | int | None:
    """A figure as spec-bench writes it: a finite JSON number, not negative; None for anything else
    (a string such as "1e3" too: it is what a tampered file holds, not what specops wrote)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        ok = math.isfinite(float(value)) and value >= 0
    except OverflowError:  # an integer too large for a float
        return None
    return value if ok else None


def read_perf(raw) -> dict | None:
    """One service's record from perf.json, read back: levels keyed by a whole positive concurrency,
    each figure a number or None; `refused` names what was there but was not a number."""
    if not isinstance(raw, dict):
        return None
    refused: list[str] = []

    def figure(value, what):
        n = number(value)
        if n is None and value is not None:
            refused.append(what)
        return n

    def levels(side):
        out = {}
        for lv in raw.get(side) if isinstance(raw.get(side), list) else []:
            lv = lv if isinstance(lv, dict) else {}
            c = number(lv.get("concurrency"))
            if c is None or c != int(c) or c < 1:
                refused.append(f"a {side} level's concurrency")
                continue
            figs = lv.get("figures") if isinstance(lv.get("figures"), dict) else {}
            out[int(c)] = {k: figure(figs.get(k), f"{side} {k} at {int(c)}") for k in FIGURES}
        return out

    def per_level(key):
        given = raw.get(key) if isinstance(raw.get(key), dict) else {}
        return {str(c): n for c, v in given.items() for n in [figure(v, f"{key} at {c}")] if n is not None}

    return {"at": str(raw.get("at", "")), "verdict": str(raw.get("verdict", "")), "spec": levels("spec"),
            "baseline": levels("baseline"), "speedup": per_level("speedup"),
            "accept_length": per_level("accept_length"), "refused": refused}


def _levels_table(perf: dict) -> str:
    rows = ["<table><tr><th>concurrency</th><th>tok/s</th><th>baseline tok/s</th><th>speedup</th>"
            "<th>accept length</th><th>TTFT p50 / p99 (ms)</th><th>ITL p50 / p99 (ms)</th></tr>"]
    shown = lambda v, fmt="{:.1f}": "-" if v is None else fmt.format(v)  # noqa: E731
    ms = lambda v: shown(None if v is None else v * 1000)  # noqa: E731  (seconds on the host, ms here)
    attr = lambda v: "" if v is None else _e(v)  # noqa: E731
    for c, f in sorted(perf["spec"].items()):
        b, gain = perf["baseline"].get(c, {}), perf["speedup"].get(str(c))
        rows.append(
            f'<tr><td>{c}</td><td data-tok-s="{attr(f["output_tok_s"])}" data-concurrency="{c}">'
            f'{shown(f["output_tok_s"])}</td>'
            f'<td data-baseline-tok-s="{attr(b.get("output_tok_s"))}">{shown(b.get("output_tok_s"))}</td>'
            f'<td data-speedup="{attr(gain)}">{shown(gain, "{:.2f}x")}</td>'
            f'<td data-accept-length="{attr(f["accept_length"])}">{shown(f["accept_length"], "{:.2f}")}</td>'
            f'<td>{ms(f["ttft_p50"])} / {ms(f["ttft_p99"])}</td>'
            f'<td>{ms(f["itl_p50"])} / {ms(f["itl_p99"])}</td></tr>')
    return "\n".join(rows + ["</table>"])


def _refusals(perf: dict) -> list[str]:
    """Say which recorded figures were not numbers (and so are shown as -)."""
    bad = perf["refused"]
    if not bad:
        return []
    more = f" and {len(bad) - SHOWN_REFUSALS} more" if len(bad) > SHOWN_REFUSALS else ""
    return [f"<p data-refused>perf.json holds {len(bad)} figure(s) that are not numbers, shown as -: "
            f"{_e(', '.join(bad[:SHOWN_REFUSALS]))}{more}.</p>"]


def _perf_of(release: dict, name: str) -> dict | None:
    perf = release.get("perf")
    return read_perf(perf.get(name)) if isinstance(perf, dict) else None


def service_section(host: str, name: str, releases: list[dict], gate: dict | None) -> str:
    releases = [r for r in releases if isinstance(r, dict)]
    measured = [(r, p) for r in releases for p in [_perf_of(r, name)] if p]
    out = [f'<section data-host="{_e(host)}" data-service="{_e(name)}"><h2>{_e(host)}: {_e(name)}</h2>',
           "<h3>Releases</h3><table><tr><th>release</th><th>status</th><th>what changed</th><th>perf</th></tr>"]
    for r in releases:
        p = _perf_of(r, name)
        out.append(f'<tr data-stamp="{_e(r.get("stamp"))}"><td>{_e(r.get("stamp"))}'
                   f'{" (current)" if r.get("current") is True else ""}</td><td>{_e(r.get("status"))}</td>'
                   f'<td>{_e(r.get("summary", ""))}</td><td>{_e(p["verdict"]) if p else "-"}</td></tr>')
    out.append("</table>")
    if gate:
        out.append("<h3>Gate</h3><p data-gate>" + ", ".join(f"{_e(k)}: {_e(v)}" for k, v in gate.items() if k != "load")
                   + "</p>")
    if measured:
        latest = measured[-1][1]
        out.append(f"<h3>Latest spec-bench ({_e(latest['at'])})</h3><p>{_e(latest['verdict'])}</p>")
        out += _refusals(latest)
        series = {side: pts for side, key in (("speculative", "spec"), ("baseline", "baseline"))
                  for pts in [[(c, f["output_tok_s"]) for c, f in latest[key].items() if f["output_tok_s"] is not None]]
                  if pts}
        if series:
            out.append(line_chart("output tok/s against concurrency", series, "concurrency", "tok/s"))
        at = str((gate or {}).get("at_concurrency") or min(latest["spec"], default=1))
        accepts = [(str(r.get("stamp")), v) for r, p in measured for v in [p["accept_length"].get(at)] if v]
        if accepts:
            out.append(bar_chart(f"accept length at concurrency {at} per release", accepts, "accept length",
                                 (gate or {}).get("min_accept_length")))
        gains = [(str(r.get("stamp")), g) for r, p in measured for g in [p["speedup"].get(at)] if g]
        if gains:
            out.append(bar_chart(f"speedup at concurrency {at} per release", gains, "speedup (x)",
                                 (gate or {}).get("min_speedup")))
        out.append(_levels_table(latest))
    current = next((r for r in releases if r.get("current") is True), {})
    out += _verified(name, current)
    return "\n".join(out + ["</section>"])


def _dicts(value) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _texts(value) -> list:
    return value if isinstance(value, list) else []


def _verified(name: str, release: dict) -> list[str]:
    """What verify found when the current release was deployed, and what it checks."""
    out = []
    for found in _dicts(release.get("verified")):
        if found.get("name") == name:
            g = found.get("generate") if isinstance(found.get("generate"), dict) else {}
            lines = _texts(found.get("checks")) + _texts(found.get("notes")) + (
                [f"/generate {g.get('completion_tokens')} tokens at {g.get('tok_s')} tok/s, accept length "
                 f"{g.get('spec_accept_length')}"] if g else [])
            out.append("<h3>Verify (when the current release was deployed)</h3><ul>"
                       + "".join(f"<li data-verified>{_e(line)}</li>" for line in lines) + "</ul>")
    for check in _dicts(release.get("verify")):
        if check.get("name") == name and isinstance(check.get("intended"), dict):
            out.append("<h4>What verify checks</h4><table>" + "".join(
                f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in sorted(check["intended"].items(), key=str))
                + "</table>")
    return out


def page(sections: list[str]) -> str:
    style = ("body{font-family:sans-serif;max-width:60em;margin:1em auto;color:#000;background:#fff}"
             "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #888;padding:2px 6px;font-size:13px}"
             "section{border-top:2px solid #000;margin-top:1.5em}")
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>specops: speculative decoding</title>"
            f"<style>{style}</style></head><body><h1>specops: does speculative decoding pay off?</h1>"
            f"<p>Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.</p>"
            + "\n".join(sections or ["<p>No host answered.</p>"]) + "</body></html>\n")
