"""BENCHMARKS.md written from bench/run.py's medians: the tools side by side, CPU per host, the
targets (met or not, by how much), and the sections the other benchmarks keep beside it."""
import json
import os
import platform
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def markdown(results: dict, runs: dict, tools: tuple, keys: tuple, startup_s: float) -> str:
    """BENCHMARKS.md from the medians of bench/run.py (`results`: hosts → tool → key → median) and the
    runs per host count; `tools` in their columns' order, `keys` the figures measured, `startup_s`
    the simulated server's start."""
    lines = ["# Benchmarks", "",
             "specops against Ansible (ansible-core 2.19.14, pipelining, forks 50, no fact gathering) and "
             "pyinfra 3.10.0, on the same sandbox hosts (systemd-nspawn containers with real systemd and "
             "sshd, each in its own network namespace), interleaved. Workload: template the SGLang unit, "
             "copy two ~180 KB patched model files, purge their bytecode, daemon-reload and restart only on "
             "change, make sure the service runs, health check (specops: its full verify).", "",
             f"Median of {', '.join(f'{r} run(s) at {n} host(s)' for n, r in runs.items())}; wall time in "
             f"seconds. The simulated server takes {startup_s:.0f} s to start on a first run. CPU: seconds per "
             "host, on the controller (the tool's process and everything it waited for) and on the hosts "
             "(their busy time outside the simulated servers).", "",
             "| hosts | run | specops | Ansible | pyinfra | specops/Ansible | specops/pyinfra | "
             "specops SSH channels / requests per host |",
             "|---|---|---|---|---|---|---|---|"]
    for n, r in results.items():
        for kind in ("first", "noop"):
            s, a, p = (r[t][kind] for t in tools)
            ch, trips = r["specops"][f"channels_{kind}"], r["specops"][f"trips_{kind}"]
            lines.append(f"| {n} | {'first' if kind == 'first' else 'no-op'} | {s:.2f} | {a:.2f} | {p:.2f} | "
                         f"{s / a:.2f} | {s / p:.2f} | {ch:g} / {trips:g} |")
    lines += ["", "### CPU seconds per host (controller + hosts)", "",
              "| hosts | run | specops | Ansible | pyinfra |", "|---|---|---|---|---|"]
    for n, r in results.items():
        for kind in ("first", "noop"):
            cells = [f"{r[t][f'controller_cpu_{kind}']:.3f} + {r[t][f'hosts_cpu_{kind}']:.3f}" for t in tools]
            lines.append(f"| {n} | {'first' if kind == 'first' else 'no-op'} | " + " | ".join(cells) + " |")
    lines += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]

    def target(text, value, limit, unit="×"):
        ok = value <= limit
        lines.append(f"| {text} | {value:.2f}{unit} | {'yes' if ok else f'no, {value / limit:.2f}× the target'} |")

    ratio = {n: {k: results[n]["specops"][k] / results[n]["pyinfra"][k] for k in keys
                 if "channels" not in k and "trips" not in k and k != "status"} for n in results}
    for n in results:
        target(f"no-op at {n} host(s) ≤ 0.5× pyinfra", ratio[n]["noop"], 0.5)
    for n in (n for n in results if n >= 20):
        target(f"first deploy at {n} hosts ≤ 0.7× pyinfra", ratio[n]["first"], 0.7)
    for n in results:  # a no-op's, issue 51's: at most 0.6× pyinfra's; a first deploy's, issue 39's: at most pyinfra's
        target(f"host CPU per host, no-op, at {n} host(s) ≤ 0.6× pyinfra's", ratio[n]["hosts_cpu_noop"], 0.6)
        target(f"host CPU per host, first deploy, at {n} host(s) ≤ pyinfra's", ratio[n]["hosts_cpu_first"], 1.0)
    worst = max(r["specops"]["trips_noop"] for r in results.values())
    lines.append(f"| ≤ 2 SSH round trips per host on a no-op | {worst:g} | {'yes' if worst <= 2 else 'no'} |")
    if 20 in results:
        target("`inv status` at 20 hosts ≤ 1.5× a no-op deploy", results[20]["specops"]["status"] /
               results[20]["specops"]["noop"], 1.5)
    textfile = json.loads((HERE / "textfile.json").read_text()) if (HERE / "textfile.json").exists() else None
    if textfile and textfile["hosts"] in results:  # its own run (bench/textfile.py), against this one's pyinfra
        n = textfile["hosts"]
        target(f"no-op with `monitoring` at {n} hosts ≤ 1.1× the one without (bench/textfile.py, its own run)",
               textfile["monitored"]["wall_s"] / textfile["plain"]["wall_s"], 1.1)
    stacks = json.loads((HERE / "stacks.json").read_text()) if (HERE / "stacks.json").exists() else None
    if stacks and "undo" in stacks.get("rollback", {}):  # bench/stacks.py
        rb = stacks["rollback"]
        target("rolling back a failed SGLang upgrade (the deploy's undo, no install) ≤ the server's start + 3 s "
               "(bench/stacks.py)", rb["undo"] - rb["startup"], 3.0, unit=" s over the start")
        target("`inv rollback` of a serving release, whole task ≤ the server's start + 3 s (bench/stacks.py)",
               rb["manual"] - rb["startup"], 3.0, unit=" s over the start")
    for n in (min(results), max(results)):
        target(f"no-op at {n} host(s) ≤ 0.15× Ansible",
               results[n]["specops"]["noop"] / results[n]["ansible"]["noop"], 0.15)
    analysis = HERE / "analysis.md"
    for part in (analysis, HERE / "loadclient.md", HERE / "rolling.md"):  # sections of bench/loadclient.py, rolling.py
        if part.exists():
            lines += ["", part.read_text().rstrip()]
    lines += ["", f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
              f"{time.strftime('%Y-%m-%d')}.", "", "Reproduce (as root, after `bash scripts/setup.sh`, with nothing "
              "else running on the machine):", "", "    .venv/bin/python bench/run.py", ""]
    for part in (HERE / "stacks.md", HERE / "tune.md"):  # bench/stacks.py's section; spec-tune's (its tests')
        if part.exists():
            lines += [part.read_text().rstrip(), ""]
    return "\n".join(lines)
