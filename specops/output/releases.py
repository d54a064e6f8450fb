"""What `inv releases` prints: each host's releases, newest last (* marks current), with who deployed
each and from which commits, the versions its stack moved to, the spec-bench record each keeps
(`perf_line`) and what changed since the last deployed release measured (`since`, `compare`), saying
so when the two were measured with different loads."""
from __future__ import annotations

import shutil
import sys

from ..protocol import ROLLED_BACK, is_rolled_back
from ..sglang import stack
from .perfpage import load_differences, load_value, provenance_text
from .report import accept_text, shorten


def width() -> int | None:
    """A terminal's width, to which a release's summary is shortened; None when the output is not a
    terminal (a pipe, a file): lines whole, for grep and scripts."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def lines(host: str, releases: list[dict], columns: int | None = None) -> list[str]:
    """The listing of one host's releases; `columns`: see width()."""
    out, prior = [], {}
    for rel in releases:
        status = ROLLED_BACK if is_rolled_back(rel) else rel["status"]
        head = f"{host:<12} {'*' if rel['current'] else ' '} {rel['stamp']}  {status:<11} " \
               f"{', '.join(rel['services'])}  "
        out.append(head + (shorten(rel["summary"], columns - len(head)) if columns else rel["summary"]))
        if status != rel["status"]:  # deployed, then left by inv rollback
            to = rel["rolled_back"].get("to") if isinstance(rel["rolled_back"], dict) else None
            out.append(f"{'':<14} rolled back to {to or 'an older release'}")
        if provenance_text(rel):  # a release recorded before releases said who deployed them: nothing
            out.append(f"{'':<14} {provenance_text(rel)}")
        moved = stack.versions(rel.get("packages") or {}, prior, changed_only=True) if prior else ""
        if moved:  # the stack by the versions in it, where they moved since the release before
            out.append(f"{'':<14} stack: {moved}")
        prior = rel.get("packages") or prior
        for name, perf in sorted((rel.get("perf") or {}).items()):
            out.append(f"{'':<14} perf {name}: {perf_line(perf)}")
        for name, tune in sorted((rel.get("tune") or {}).items()):
            out.append(f"{'':<14} tune {name}: {tune_line(tune)}")
        stamp, changed = since(releases, rel)
        out += [f"{'':<16} since {stamp}: {line}" for line in changed]
    return out


def stack_lines(host: str, stacks: list[dict], uv_cache: int = 0) -> list[str]:
    """The host's stacks (venvs), the releases that run each, and the disk they take together
    (files shared by hard links counted once), with what uv's cache holds beside them."""
    if not stacks:
        return []
    out = [f"{host:<12}   stacks: {len(stacks)} kept, {sum(s['new'] for s in stacks) / 2**30:.2f} GiB on disk together"
           f" (and uv's cache {uv_cache / 2**30:.2f} GiB more)"]
    for s in stacks:
        names = stack.versions(s.get("packages") or {})
        out.append(f"{'':<14} {s['path']}  {names or '-'}  {s['bytes'] / 2**20:.0f} MiB of files, "
                   f"{s['new'] / 2**20:.0f} MiB its own  releases: {', '.join(s['releases']) or 'none'}")
    return out


def perf_line(perf: dict) -> str:
    """One service's result in a release's perf.json in one line, for `inv releases`."""
    levels = ", ".join(f"{lv['figures']['output_tok_s']:.0f} tok/s @{lv['concurrency']}" for lv in perf.get("spec", []))
    accept = [v for _, v in sorted((perf.get("accept_length") or {}).items(), key=lambda kv: int(kv[0])) if v]
    speed = ", ".join(
        f"{g:.2f}x @{c}" for c, g in sorted((perf.get("speedup") or {}).items(), key=lambda kv: int(kv[0]))
    )
    return "; ".join(p for p in (levels, f"accept length {accept[0]:.2f}" if accept else "",
                                 f"speedup {speed}" if speed else "") if p)


def tune_line(tune: dict) -> str:
    """One service's spec-tune record in one line: the verdict and what it cost."""
    if not isinstance(tune, dict):
        return "unreadable"
    cands = tune.get("candidates") if isinstance(tune.get("candidates"), list) else []
    return (f"{tune.get('verdict', '?')}; {len(cands)} measured, {len(tune.get('pruned') or [])} pruned, "
            f"{tune.get('restarts', '?')} restarts (the grid: {tune.get('grid_restarts', '?')})")


def compare(old: dict, new: dict) -> list[str]:
    """What changed from one release to the next beside the speed: the intended flags of each
    service, the packages, the managed files (patches, units), and per service the tok/s and
    accept length at each level both measured (said first when the two ran different loads)."""
    out = []
    for name in sorted(set(old.get("spec") or {}) | set(new.get("spec") or {})):
        a, b = (old.get("spec") or {}).get(name) or {}, (new.get("spec") or {}).get(name) or {}
        out += [f"{name} {k}: {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    pa, pb = old.get("packages") or {}, new.get("packages") or {}
    out += [f"package {k}: {pa.get(k)} -> {pb.get(k)}" for k in sorted(set(pa) | set(pb)) if pa.get(k) != pb.get(k)]
    fa, fb = old.get("files") or {}, new.get("files") or {}
    out += [f"file {p}: {'added' if p not in fa else 'removed' if p not in fb else 'changed'}"
            for p in sorted(set(fa) | set(fb)) if fa.get(p) != fb.get(p)]
    for name, perf in sorted((new.get("perf") or {}).items()):
        was = (old.get("perf") or {}).get(name) or {}
        levels = {lv["concurrency"]: lv["figures"] for lv in was.get("spec", [])}
        figures = []
        for lv in perf.get("spec", []):
            before, now = levels.get(lv["concurrency"]), lv["figures"]
            if before:
                accept = [accept_text(x.get("accept_length")) for x in (before, now)]
                figures.append(f"{name} tok/s @{lv['concurrency']}: {before['output_tok_s']:.1f} -> "
                               f"{now['output_tok_s']:.1f}" + (f", accept length {accept[0]} -> {accept[1]}"
                                                              if now.get("accept_length") or before.get("accept_length")
                                                              else ""))
        differ = load_differences([was.get("load"), perf.get("load")])
        if figures and differ:
            out.append(f"{name} measured with different loads, not like for like: " + ", ".join(
                f"{k} {load_value(was.get('load'), k)} -> {load_value(perf.get('load'), k)}" for k in differ))
        out += figures
    return out


def since(listed: list[dict], rel: dict) -> tuple[str, list[str]]:
    """For `inv releases`: the last deployed release measured before `rel`, and what changed since
    (compare).  Of a rolled-back release only the figures are compared: its manifest keeps no
    flags, packages or files."""
    measured = [r for r in listed if r.get("perf") and r["stamp"] < rel["stamp"] and r.get("status") != ROLLED_BACK]
    if not rel.get("perf") or not measured:
        return "", []
    old, new = measured[-1], rel
    if rel.get("status") == ROLLED_BACK:
        old, new = {"perf": old["perf"]}, {"perf": rel["perf"]}
    return measured[-1]["stamp"], compare(old, new)
