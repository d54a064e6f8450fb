"""A second stack venv (only sglang differs) built with uv against pip, measured side by side.

    python bench/stacks.py                   # writes bench/stacks.md and its section of BENCHMARKS.md
    python bench/stacks.py --rollback-only   # only specops's four tasks again (uv's and pip's kept)

One bare sandbox host (a site of its own) and the sandbox package index, with the real CPU
torch 2.13.0 and flash-linear-attention 0.6.0.  Each tool builds a first venv (torch, fla,
sglang 0.5.23: its cache is then warm, as on a host that already runs a stack), then a second
with sglang 0.5.24 alone changed.  Reported for the second: wall time, and the disk it adds
(`du` over both venvs, hard-linked files counted once, minus the first alone); uv's cache and
pip's are not counted, as they are the same wheels for both.  The commands are the ones
specops runs for a stack (agent/converge/stacks.py) and for a venv the user manages (pip).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench import sections  # noqa: E402
from sandbox import fleet, pkgindex, provision  # noqa: E402
from specops.layout import UV_PIN  # noqa: E402
from specops.sglang import patchfile  # noqa: E402

SITE = fleet.Site("soz", "192.168.241", Path("/var/lib/specops-bench-stacks"))
MARK, END = sections.markers("stacks")
SPECS = ["torch==2.13.0+cpu", "flash-linear-attention==0.6.0"]
STARTUP_S = 1.0  # the simulator's start (provision.bare_service's default)


def timed(h: fleet.Host, *argv: str) -> float:
    t0 = time.perf_counter()
    h.run(*argv)
    return time.perf_counter() - t0


def du(h: fleet.Host, *paths: str) -> int:
    """Bytes on disk under paths, each inode once (GNU du counts a hard link once per run)."""
    return int(h.run("du", "-s", "-B1", "-c", *paths).stdout.split()[-2])


def measure(rollback_only: bool = False) -> dict:
    f = fleet.Fleet(["s1"], layers=[provision.layer("bare")], site=SITE).up()
    index = None
    try:
        index = pkgindex.Index(f.site).start()
        h = f.hosts[0]
        url = index.url
        trusted = url.split("//")[1].split(":")[0]
        h.run("python3", "-m", "venv", "/opt/bench/uv-tool")
        h.run("/opt/bench/uv-tool/bin/pip", "install", "-q", "--index-url", f"{url}/simple", "--trusted-host", trusted,
              f"uv=={UV_PIN}")
        uv = "/opt/bench/uv-tool/bin/uv"
        env = ["env", "UV_CACHE_DIR=/var/cache/bench-uv", "UV_PYTHON_DOWNLOADS=never", "UV_NO_CONFIG=1"]
        out = {}
        for tool in () if rollback_only else ("uv", "pip"):
            times = []
            for name, sglang in (("a", "0.5.23"), ("b", "0.5.24")):
                venv = f"/opt/bench/{tool}-{name}"
                specs = [*SPECS, f"sglang=={sglang}"]
                if tool == "uv":
                    t = timed(h, *env, uv, "venv", "--quiet", "--relocatable", "--python", "python3", venv)
                    t += timed(h, *env, uv, "pip", "install", "--quiet", "--python", f"{venv}/bin/python",
                               "--index", f"{url}/whl/cpu", "--default-index", f"{url}/simple", *specs)
                else:
                    t = timed(h, "python3", "-m", "venv", venv)
                    t += timed(h, f"{venv}/bin/pip", "install", "-q", "--disable-pip-version-check",
                               "--index-url", f"{url}/whl/cpu", "--extra-index-url", f"{url}/simple",
                               "--trusted-host", trusted, *specs)
                times.append(t)
            first, both = du(h, f"/opt/bench/{tool}-a"), du(h, f"/opt/bench/{tool}-a", f"/opt/bench/{tool}-b")
            out[tool] = {"first_s": round(times[0], 1), "second_s": round(times[1], 1),
                         "first_mib": round(first / 2**20, 1), "second_adds_mib": round((both - first) / 2**20, 1)}
        out["rollback"] = rollbacks(f, h, url)
        if not rollback_only:
            out["tools_measured"] = time.strftime("%Y-%m-%d")
        return out
    finally:
        if index:
            index.stop()
        f.down()


def inv(work: Path, *args) -> tuple[float, str, float | None]:
    """(wall seconds, output or "failed: " + output, seconds from the line that says it rolls back
    to the end: the undo of a failed deploy, as it happens within the task)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, "SPECOPS_INVENTORY": str(work)})
    lines, undo_at = [], None
    for line in proc.stdout:
        lines.append(line)
        if undo_at is None and "ROLLING BACK" in line:
            undo_at = time.perf_counter()
    proc.wait(timeout=1800)
    end = time.perf_counter()
    out = "".join(lines)
    return end - t0, out if proc.returncode == 0 else "failed: " + out, (end - undo_at if undo_at else None)


def rollbacks(f: fleet.Fleet, h: fleet.Host, url: str) -> dict:
    """specops itself: 0.5.23 then 0.5.24 (a diff patch carried), then the failing 0.5.25 (built, started,
    undone) and a manual rollback across the version change."""
    provision.write_known_hosts(f)
    work = Path(tempfile.mkdtemp(prefix="specops-stacks-"))
    rel = "srt/models/llama.py"
    upstream = (provision.SIM_SRC / "sglang" / rel).read_text()
    (work / "patches" / rel).parent.mkdir(parents=True)
    (work / "patches" / (rel + ".patch")).write_text(patchfile.make(
        rel, upstream, upstream.replace('"upstream"', '"patched"'), "0.5.23",
        patchfile.upstream_sha256(upstream.encode())))

    def write(version):
        host = {**provision.host_vars(h), "services": [provision.bare_service(patches=[rel + ".patch"])],
                "sglang": {"version": version}, "patch_dir": str(work / "patches"), "package_index": f"{url}/simple"}
        (work / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {h.name: host}}}, sort_keys=False))
        return work
    times = {}
    for step, version, task in (("first", "0.5.23", "bootstrap"), ("upgrade", "0.5.24", "deploy"),
                                ("failing", "0.5.25", "deploy"), ("manual", "0.5.24", "rollback")):
        took, out, undo = inv(write(version), task, "--host", h.name)
        if (step == "failing") != out.startswith("failed") or (step == "failing" and undo is None):
            raise SystemExit(f"{step}: {out[-3000:]}")
        times[step] = round(took, 1)
        if undo is not None:
            times["undo"] = round(undo, 1)
    times["startup"] = STARTUP_S
    return times


def markdown(r: dict) -> str:
    rows = [f"| {tool} | {v['first_s']} | {v['first_mib']} | {v['second_s']} | {v['second_adds_mib']} |"
            for tool, v in r.items() if tool in ("uv", "pip")]
    rb = r["rollback"]
    return "\n".join([
        MARK, "## A second stack: uv against pip", "",
        "A venv of the real CPU torch 2.13.0, flash-linear-attention 0.6.0 and sglang 0.5.23 (the simulator), then a "
        "second with only sglang 0.5.24 changed, from the sandbox package index on one host; each tool's cache warm "
        "from the first. The second venv's disk is what it adds beside the first (hard links counted once).", "",
        "| tool | first venv (s) | first venv (MiB) | second venv (s) | second venv adds (MiB) |",
        "|---|---|---|---|---|", *rows, "",
        "Through specops on the same host (a bare box, weights pushed; the simulator starts in 1 s), whole tasks "
        "with their verify:", "",
        "| bootstrap 0.5.23 (s) | upgrade to 0.5.24 (s) | deploy of the failing 0.5.25, undone (s) | "
        "of which the undo (s) | `inv rollback` to 0.5.23, no install (s) |", "|---|---|---|---|---|",
        f"| {rb['first']} | {rb['upgrade']} | {rb['failing']} | {rb.get('undo', '-')} | {rb['manual']} |", "",
        "The undo: from the deploy's ROLLING BACK line (verify has failed) to the end of the task, the "
        "earlier release's files back, its server started and verified; no install. `inv rollback` of a "
        "release that serves stops its server with SGLang's own drain first (its SIGTERM watchdog looks "
        "every 5 s), then the same.", "",
        f"specops's tasks measured {time.strftime('%Y-%m-%d')}, "
        f"uv's and pip's {r.get('tools_measured', 'the same day')}; "
        "reproduce with `.venv/bin/python bench/stacks.py` (as root, nothing else running).", END])


def main() -> None:
    if "--rollback-only" in sys.argv:  # specops's tasks again; uv's and pip's figures kept from the last run
        import json
        result = {**json.loads((HERE / "stacks.json").read_text()), "rollback": measure(rollback_only=True)["rollback"]}
    else:
        result = measure()
    sections.publish("stacks", result, markdown(result))


if __name__ == "__main__":
    main()
