"""`inv report`: one self-contained HTML page of what spec-bench recorded, per host and service.

Nothing outside the file is referenced (no script, font, stylesheet or image from anywhere: it
opens on an air-gapped laptop).  Charts are inline SVG (`charts`), and every plotted number is
also in a table.  A release whose deploy was undone keeps what its gate measured; it is shown,
marked rolled back.  Figures of releases measured with different loads are said to be so.  Each figure carries a
data-* attribute with the exact value
from perf.json, so a test (or a script) can read the page back.

Everything shown comes from the host (its manifests and perf.json), so it is read back before it is
drawn: a figure must be a JSON number, else it is shown as absent and the section says which ones
were refused; every text is escaped.
"""

from __future__ import annotations

import json
import math
import time

from ..protocol import ROLLED_BACK, is_rolled_back, provenance_labels
from . import tunepage
from ..sglang import stack
from .charts import _e, bar_chart, line_chart, stamp_labels
from .report import accept_text

FIGURES = ("output_tok_s", "accept_length", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99")
SHOWN_REFUSALS = 5  # a tampered file could name thousands; the page says how many more




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
            "accept_length": per_level("accept_length"), "refused": refused,
            "load": raw.get("load") if isinstance(raw.get("load"), dict) else None}


def load_differences(loads: list) -> list[str]:
    """The keys of spec-bench load records (flows/specbench.py Load.identity(): concurrency,
    requests, warmup, max_new_tokens, seed, prompts) that are not the same in all of `loads`; a
    record that is missing (None) differs in every key the others have."""
    keys = sorted({str(k) for ld in loads if isinstance(ld, dict) for k in ld})
    return [k for k in keys if len({json.dumps(ld.get(k) if isinstance(ld, dict) else None, sort_keys=True)
                                    for ld in loads}) > 1]


def load_value(load, key: str) -> str:
    """One setting of a load record as text ("not recorded" when it is not there)."""
    if not isinstance(load, dict) or key not in load:
        return "not recorded"
    value = load[key]
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text[:12] if key == "prompts_sha256" else text[:80]


def _loads_note(charted: list[tuple[dict, dict]]) -> list[str]:
    """Next to the per-release charts: say so when the releases compared ran different loads."""
    keys = load_differences([p["load"] for _, p in charted])
    if not keys:
        return []
    parts, labels = [], stamp_labels([str(r.get("stamp")) for r, _ in charted])  # as the bars read
    for key in keys:
        stamps_by_value: dict[str, list[str]] = {}
        for (r, p), label in zip(charted, labels):
            stamps_by_value.setdefault(load_value(p["load"], key), []).append(label)
        parts.append(f"{key} " + ", ".join(f"{v} in {' and '.join(st)}" for v, st in stamps_by_value.items()))
    return ["<p data-loads-differ>Not like for like: the releases in the charts below were measured with different "
            f"loads ({_e('; '.join(parts))}).</p>"]


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


def provenance_text(release: dict) -> str:
    """Who deployed a release and from what, in words (`by alice@laptop, specops 3f2a9c1d4e5f+dirty,
    inventory 9e8d7c6b1a2b`), what was recorded of it; "" for a release recorded before releases said."""
    got = provenance_labels(release)
    return ", ".join(([f"by {got['deployed_by']}"] if "deployed_by" in got else [])
                     + [f"{name} {got[key]}" for key, name in (("specops_commit", "specops"),
                                                               ("inventory_commit", "inventory")) if key in got])


def _perf_of(release: dict, name: str) -> dict | None:
    perf = release.get("perf")
    return read_perf(perf.get(name)) if isinstance(perf, dict) else None


def _perf_cell(release: dict, perf: dict | None) -> str:
    if not perf:
        return "<td>-</td>"
    if is_rolled_back(release):
        return f"<td data-rolled-back>{_e(perf['verdict'])} (measured, then rolled back)</td>"
    return f"<td>{_e(perf['verdict'])}</td>"


def _per_release_charts(measured: list[tuple[dict, dict]], at: str, gate: dict) -> list[str]:
    """Accept length and speedup at one level, a bar per release (rolled-back ones in outline)."""
    def bars(key):
        return [(str(r.get("stamp")), v, "rolled back" if is_rolled_back(r) else "")
                for r, p in measured for v in [p[key].get(at)] if v]
    accepts, gains = bars("accept_length"), bars("speedup")
    charted = [(r, p) for r, p in measured if p["accept_length"].get(at) or p["speedup"].get(at)]
    out = _loads_note(charted) if len(charted) > 1 else []
    if accepts:
        out.append(bar_chart(f"accept length at concurrency {at} per release", accepts,
                             "accept length (tokens per step)", "{:.2f}", gate.get("min_accept_length")))
    if gains:
        out.append(bar_chart(f"speedup at concurrency {at} per release", gains,
                             "speedup (× baseline tok/s)", "{:.2f}x", gate.get("min_speedup")))
    return out


def service_section(host: str, name: str, releases: list[dict], gate: dict | None) -> str:
    releases = [r for r in releases if isinstance(r, dict)]
    measured = [(r, p) for r in releases for p in [_perf_of(r, name)] if p]
    out = [f'<section data-host="{_e(host)}" data-service="{_e(name)}"><h2>{_e(host)}: {_e(name)}</h2>',
           "<h3>Releases</h3><table><tr><th>release</th><th>status</th><th>stack</th><th>what changed</th>"
           "<th>perf</th><th>deployed</th></tr>"]
    prior: dict = {}
    for r in releases:
        status = ROLLED_BACK if is_rolled_back(r) else r.get("status")
        packages = r.get("packages") if isinstance(r.get("packages"), dict) else {}
        out.append(f'<tr data-stamp="{_e(r.get("stamp"))}"><td>{_e(r.get("stamp"))}'
                   f'{" (current)" if r.get("current") is True else ""}</td><td>{_e(status)}</td>'
                   f'<td data-stack>{_e(stack.versions(packages, prior) or "-")}</td>'
                   f'<td>{_e(r.get("summary", ""))}</td>{_perf_cell(r, _perf_of(r, name))}'
                   f'<td data-deployed>{_e(provenance_text(r) or "unknown")}</td></tr>')
        prior = packages or prior
    out.append("</table>")
    if gate:
        out.append("<h3>Gate</h3><p data-gate>" + ", ".join(f"{_e(k)}: {_e(v)}" for k, v in gate.items() if k != "load")
                   + "</p>")
    if measured:
        release, latest = measured[-1]
        out.append(f"<h3>Latest spec-bench ({_e(latest['at'])}, release {_e(release.get('stamp'))}"
                   f"{', rolled back' if is_rolled_back(release) else ''})</h3><p>{_e(latest['verdict'])}</p>")
        out += _refusals(latest)
        series = {side: pts for side, key in (("speculative", "spec"), ("baseline", "baseline"))
                  for pts in [[(c, f["output_tok_s"]) for c, f in latest[key].items() if f["output_tok_s"] is not None]]
                  if pts}
        if series:
            out.append(line_chart("output tok/s against concurrency", series, "concurrency (requests in flight)",
                                  "output (tok/s)"))
        at = str((gate or {}).get("at_concurrency") or min(latest["spec"], default=1))
        out += _per_release_charts(measured, at, gate or {})
        out.append(_levels_table(latest))
    out += tunepage.section(releases, name)
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
                 f"{accept_text(g.get('spec_accept_length'))}"] if g else [])
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
