"""The report's tuning section: a release's latest spec-tune (tune.json, read back from the host):
the speedup of every candidate at every level it was measured at, the winner marked, the drafts
side by side when it compared several (speedup against draft tokens, a line each, and a row each
with its best settings and accept length per draft-token count), and the combinations pruned
before any restart with why.  Values are escaped and checked, as the rest of
the page's: a record of another shape shows as "-", never as markup."""
from __future__ import annotations

import math

from .charts import _e, line_chart


def _num(value) -> str:
    return f"{value:.2f}x" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _latest(releases: list[dict], name: str) -> tuple[dict, dict] | None:
    for r in reversed(releases):
        rec = (r.get("tune") or {}).get(name) if isinstance(r.get("tune"), dict) else None
        if isinstance(rec, dict):
            return r, rec
    return None


def section(releases: list[dict], name: str) -> list[str]:
    found = _latest(releases, name)
    if not found:
        return []
    release, rec = found
    cands = [c for c in rec.get("candidates") or [] if isinstance(c, dict)]
    levels = sorted({int(c) for cand in cands for c in (cand.get("speedup") or {}) if str(c).isdigit()})
    winner = rec.get("winner") if isinstance(rec.get("winner"), dict) else None
    out = [f"<h3>Tuning ({_e(rec.get('at', '?'))}, release {_e(release.get('stamp'))})</h3>",
           f"<p data-tune-verdict>{_e(rec.get('verdict', ''))}</p>",
           f"<p>{_e(rec.get('restarts', '?'))} restarts, where the full grid would need "
           f"{_e(rec.get('grid_restarts', '?'))}; "
           f"objective: {_e((rec.get('objective') or {}).get('text', '?'))}</p>"]
    out += _drafts(rec)
    if rec.get("draft_limit"):
        out.append(f"<p data-draft-limit>{_e(rec['draft_limit'])}</p>")
    out.append("<table data-tune><tr><th>settings</th><th>load</th>"
               + "".join(f"<th>speedup @{c}</th>" for c in levels) + "</tr>")
    for c in cands:
        won = winner is not None and c.get("settings") == winner and c.get("rung") == "full" \
            and c.get("draft") == rec.get("winner_draft")  # both None in a record from before drafts
        speed = c.get("speedup") or {}
        out.append(f"<tr{' data-winner' if won else ''}><td>{_e(c.get('label', '?'))}{' (winner)' if won else ''}"
                   f"</td><td>{_e(c.get('rung', '?'))}</td>"
                   + "".join(f"<td>{_num(speed.get(str(lv)))}</td>" for lv in levels) + "</tr>")
    out.append("</table>")
    if winner and not any(c.get("settings") == winner for c in cands):
        runs = ", ".join(f"{k} {v}" for k, v in winner.items())
        out.append(f"<p data-winner>winner: what the service runs now ({_e(runs)})</p>")
    pruned = [p for p in rec.get("pruned") or [] if isinstance(p, dict)]
    if pruned:
        out.append(f"<details><summary>{len(pruned)} combinations pruned before any restart</summary><ul data-pruned>")
        for p in pruned:
            asked = ", ".join(f"{_e(k)} {_e(v)}" for k, v in (p.get("asked") or {}).items())
            out.append(f"<li>{asked}: {_e(p.get('reason', ''))}</li>")
        out.append("</ul></details>")
    return out


def _finite(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _by_tokens(d: dict) -> dict:
    """A draft's {draft tokens: {speedup, accept_length}}, what of it has the expected shape."""
    rows = d.get("by_draft_tokens") if isinstance(d.get("by_draft_tokens"), dict) else {}
    return {int(n): v for n, v in rows.items() if isinstance(n, str) and n.isascii() and n.isdigit()
            and isinstance(v, dict)}


def _drafts(rec: dict) -> list[str]:
    drafts = [d for d in rec.get("drafts") or [] if isinstance(d, dict)] if isinstance(rec.get("drafts"), list) else []
    if len(drafts) < 2:
        return []
    points = {}
    for i, d in enumerate(drafts):  # the legend names a draft by its directory, its place when two share one
        pts = [(n, _finite(v.get("speedup"))) for n, v in sorted(_by_tokens(d).items())]
        name = str(d.get("draft")).rstrip("/").rsplit("/", 1)[-1]
        points[name if name not in points else f"{name} ({i + 1})"] = [(n, g) for n, g in pts if g is not None]
    points = {k: v for k, v in points.items() if v}
    counts = sorted({n for d in drafts for n in _by_tokens(d)})
    out = [f"<div data-drafts-chart>{line_chart('Drafts side by side', points, 'draft tokens', 'speedup (x)')}</div>"
           if points else "",
           "<table data-drafts><tr><th>draft</th><th>best settings</th><th>speedup</th>"
           + "".join(f"<th>accept length @{n} draft tokens</th>" for n in counts) + "</tr>"]
    for d in drafts:
        best = d.get("best") if isinstance(d.get("best"), dict) else None
        won = d.get("draft") == rec.get("winner_draft") and best == rec.get("winner")
        accepts = [_finite((_by_tokens(d).get(n) or {}).get("accept_length")) for n in counts]
        out.append(f"<tr{' data-winner' if won else ''}><td>{_e(d.get('draft', '?'))}{' (winner)' if won else ''}</td>"
                   f"<td>{_e(', '.join(f'{k} {v}' for k, v in best.items())) if best else '-'}</td>"
                   f"<td>{_num(_finite(d.get('speedup')))}</td>"
                   + "".join("<td>-</td>" if a is None else f"<td>{a:.2f}</td>" for a in accepts) + "</tr>")
    out.append("</table>")
    return out
