"""`inv report`: one self-contained HTML page of what spec-bench recorded, per host and service.

Nothing outside the file is referenced (no script, font, stylesheet or image from anywhere: it
opens on an air-gapped laptop).  Charts are inline SVG drawn here; series differ by marker shape
and line dash as well as colour (readable in print and by colour-blind readers), and every
plotted number is also in a table.  Each figure carries a data-* attribute with the exact value
from perf.json, so a test (or a script) can read the page back.
"""
from __future__ import annotations

import html
import time

W, H, PAD = 420, 240, 44
SERIES = {"speculative": ("#0b5394", "", "circle"), "baseline": ("#b45f06", "6 4", "square")}


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
                   f'font-size="11">gate {line}</text>')
    return "\n".join(out + ["</svg>"])


def _levels_table(perf: dict) -> str:
    base = {lv["concurrency"]: lv["figures"] for lv in perf.get("baseline") or []}
    rows = ["<table><tr><th>concurrency</th><th>tok/s</th><th>baseline tok/s</th><th>speedup</th>"
            "<th>accept length</th><th>TTFT p50 / p99 (s)</th><th>ITL p50 / p99 (s)</th></tr>"]
    for lv in perf.get("spec", []):
        f, c = lv["figures"], lv["concurrency"]
        b, gain = base.get(c, {}), (perf.get("speedup") or {}).get(str(c))
        rows.append(
            f'<tr><td>{c}</td><td data-tok-s="{f["output_tok_s"]}" data-concurrency="{c}">{f["output_tok_s"]:.1f}</td>'
            f'<td data-baseline-tok-s="{b.get("output_tok_s", "")}">{b.get("output_tok_s", "-")}</td>'
            f'<td data-speedup="{gain if gain is not None else ""}">{f"{gain:.2f}x" if gain is not None else "-"}</td>'
            f'<td data-accept-length="{f.get("accept_length", "")}">{f.get("accept_length", "-")}</td>'
            f'<td>{f.get("ttft_p50")} / {f.get("ttft_p99")}</td><td>{f.get("itl_p50")} / {f.get("itl_p99")}</td></tr>')
    return "\n".join(rows + ["</table>"])


def service_section(host: str, name: str, releases: list[dict], gate: dict | None) -> str:
    measured = [dict(r, perf=r["perf"][name]) for r in releases if (r.get("perf") or {}).get(name)]
    out = [f'<section data-host="{_e(host)}" data-service="{_e(name)}"><h2>{_e(host)}: {_e(name)}</h2>',
           "<h3>Releases</h3><table><tr><th>release</th><th>status</th><th>what changed</th><th>perf</th></tr>"]
    for r in releases:
        p = (r.get("perf") or {}).get(name)
        out.append(f'<tr data-stamp="{_e(r["stamp"])}"><td>{_e(r["stamp"])}{" (current)" if r["current"] else ""}</td>'
                   f'<td>{_e(r["status"])}</td><td>{_e(r.get("summary", ""))}</td><td>{_e(p["verdict"]) if p else "-"}</td></tr>')
    out.append("</table>")
    if gate:
        out.append("<h3>Gate</h3><p data-gate>" + ", ".join(f"{_e(k)}: {_e(v)}" for k, v in gate.items() if k != "load")
                   + "</p>")
    if measured:
        latest = measured[-1]["perf"]
        out.append(f"<h3>Latest spec-bench ({_e(latest['at'])})</h3><p>{_e(latest['verdict'])}</p>")
        series = {"speculative": [(lv["concurrency"], lv["figures"]["output_tok_s"]) for lv in latest["spec"]]}
        if latest.get("baseline"):
            series["baseline"] = [(lv["concurrency"], lv["figures"]["output_tok_s"]) for lv in latest["baseline"]]
        out.append(line_chart("output tok/s against concurrency", series, "concurrency", "tok/s"))
        at = str((gate or {}).get("at_concurrency") or min(lv["concurrency"] for lv in latest["spec"]))
        accepts = [(r["stamp"], v) for r in measured for v in [(r["perf"].get("accept_length") or {}).get(at)] if v]
        if accepts:
            out.append(bar_chart(f"accept length at concurrency {at} per release", accepts, "accept length",
                                 (gate or {}).get("min_accept_length")))
        gains = [(r["stamp"], g) for r in measured for g in [(r["perf"].get("speedup") or {}).get(at)] if g]
        if gains:
            out.append(bar_chart(f"speedup at concurrency {at} per release", gains, "speedup (x)",
                                 (gate or {}).get("min_speedup")))
        out.append(_levels_table(latest))
    current = next((r for r in releases if r["current"]), {})
    out += _verified(name, current)
    return "\n".join(out + ["</section>"])


def _verified(name: str, release: dict) -> list[str]:
    """What verify found when the current release was deployed, and what it checks."""
    out = []
    for found in release.get("verified") or []:
        if found.get("name") == name:
            g = found.get("generate") or {}
            lines = (found.get("checks") or []) + (found.get("notes") or []) + (
                [f"/generate {g.get('completion_tokens')} tokens at {g.get('tok_s')} tok/s, accept length "
                 f"{g.get('spec_accept_length')}"] if g else [])
            out.append("<h3>Verify (when the current release was deployed)</h3><ul>"
                       + "".join(f"<li data-verified>{_e(line)}</li>" for line in lines) + "</ul>")
    for check in release.get("verify") or []:
        if check.get("name") == name:
            out.append("<h4>What verify checks</h4><table>" + "".join(
                f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in sorted((check.get("intended") or {}).items()))
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
