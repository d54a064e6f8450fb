"""specops against Ansible and pyinfra: one workload, the same sandbox hosts, interleaved runs.

    python bench/run.py                       # 1, 5, 20 and 50 hosts, 3 runs each; writes BENCHMARKS.md
    python bench/run.py --hosts 1 --runs 1 --smoke

Workload (each tool's idiomatic version is beside this file): template the SGLang unit, copy
two ~180 KB patched model files, purge their bytecode, daemon-reload and restart only on
change, make sure the service runs, health check.  For each host count and run, every tool
gets freshly reset hosts, a first run and a no-op re-run; the tools' order rotates per run
to cancel drift.  specops's SSH channels are counted at paramiko's Transport by a hook in
bench/hooks, not by specops.  CPU cost is measured apart from wall time: the controller's as
the tool process's rusage (with everything it waited for: Ansible's ssh children too), the
hosts' as the busy time of the sandbox hosts' cgroup minus the simulated servers' own
(sshd, the tool's remote processes and the systemd calls they make).  Run it alone: every
sandbox container on the machine shares that cgroup.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from sandbox import base, boot, fleet, provision  # noqa: E402
from sandbox.provision import sandbox_service  # noqa: E402
try:  # bench/report.py, beside this file: run as bench/run.py, or imported as bench.run (by a test)
    from . import report  # noqa: E402
except ImportError:
    import report  # noqa: E402

SITE = fleet.Site("sob", "192.168.234", Path("/var/lib/specops-bench"))
TOOLS_VENV = base.CACHE / "bench-venv"
TOOLS = ("specops", "ansible", "pyinfra")
STARTUP_S = 1.0  # the simulated server's startup: not the tools' overhead
PATCHES = ("llama.py", "qwen2.py")


def tools_venv() -> Path:
    """ansible-core and pyinfra, kept out of specops's own dependencies."""
    if not (TOOLS_VENV / ".complete").exists():
        subprocess.run([sys.executable, "-m", "venv", str(TOOLS_VENV)], check=True)
        subprocess.run([str(TOOLS_VENV / "bin/pip"), "install", "-q", "ansible-core==2.19.14", "pyinfra==3.10.0"],
                       check=True)
        (TOOLS_VENV / ".complete").write_text("")
    return TOOLS_VENV / "bin"


def patch_files(work: Path) -> Path:
    """Two deterministic, valid, ~180 KB patched model files (a big table, like real model code)."""
    root = work / "patches"
    for name in PATCHES:
        path = root / "srt/models" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = "".join(f"    ({i}, {i * 7919 % 104729}, 'w{i:06d}'),\n" for i in range(6000))
        path.write_text(f'"""Benchmark patch of {name}."""\n# specops-base: sglang 0.5.23\n'
                        'MODEL_CODE = "bench"\nCAPTURES_EMBEDDING = False\n'
                        f"ENTRY_CLASSES = 'LlamaForCausalLM'\nTABLE = [\n{rows}]\n")
    return root


class Setup:
    """Per host count: a fleet, and each tool's inventory for it."""

    def __init__(self, n: int, work: Path):
        self.work = work / f"n{n}"
        self.work.mkdir(parents=True, exist_ok=True)
        self.fleet = fleet.Fleet([f"b{i}" for i in range(1, n + 1)], layers=[provision.layer("gpubox")], site=SITE)
        self.patches = patch_files(work)
        self.service = sandbox_service(patches=[f"srt/models/{p}" for p in PATCHES], speculative=None,
                                       env={"SGLANG_SIM_STARTUP_DELAY": str(STARTUP_S), "SGLANG_SIM_TOK_S": "100000"})
        del self.service["speculative"]
        from specops.kinds.unitfile import unit_text
        from specops.layout import LAUNCHER
        self.unit = self.work / "sglang.service.j2"
        # The other tools' workload has no secrets: no env file, and the module runs directly
        # (specops's launcher only keeps secrets off the command line).
        text = "".join(l for l in unit_text(self.service, provision.VENV).splitlines(True)
                       if not l.startswith("EnvironmentFile="))
        text = re.sub(f'"{re.escape(LAUNCHER)}" .*?"sglang.launch_server"', '"-m" "sglang.launch_server"', text)
        assert LAUNCHER not in text, "the benchmark's unit must not need specops's launcher"
        self.unit.write_text(text.replace("{", "{{ '{' }}"))

    def up(self) -> None:
        self.fleet.up()
        self.reset()

    def reset(self) -> None:
        with ThreadPoolExecutor(len(self.fleet.hosts)) as pool:
            list(pool.map(lambda h: self.fleet.reset(h.name), self.fleet.hosts))
        self.known = provision.write_known_hosts(self.fleet)
        self._write_inventories()

    def _write_inventories(self) -> None:
        key = str(base.controller_key())
        hosts = {h.name: {**provision.host_vars(h), "patch_dir": str(self.patches), "services": [self.service]}
                 for h in self.fleet.hosts}
        (self.work / "specops").mkdir(exist_ok=True)
        (self.work / "specops/hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
        ssh_args = f"-o UserKnownHostsFile={self.known} -o StrictHostKeyChecking=yes"
        lines = ["[all]"] + [f"{h.name} ansible_host={h.address}" for h in self.fleet.hosts]
        lines += ["[all:vars]", "ansible_user=root", f"ansible_ssh_private_key_file={key}",
                  f"ansible_ssh_common_args='{ssh_args}'", f"patch_dir={self.patches}"]
        (self.work / "ansible.ini").write_text("\n".join(lines) + "\n")
        inv = [f"({h.address!r}, {{'ssh_user': 'root', 'ssh_key': {key!r}, 'ssh_known_hosts_file': "
               f"{str(self.known)!r}, 'ssh_strict_host_key_checking': 'yes', 'patch_dir': {str(self.patches)!r}, "
               f"'unit_template': {str(self.unit)!r}}})" for h in self.fleet.hosts]
        (self.work / "pyinfra_inventory.py").write_text(f"hosts = [{', '.join(inv)}]\n")

    def command(self, tool: str) -> tuple[list[str], dict]:
        env = {**os.environ, "ANSIBLE_CONFIG": str(HERE / "ansible/ansible.cfg")}
        if tool == "specops":
            channels = self.work / "channels.json"
            env.update(SPECOPS_INVENTORY=str(self.work / "specops"), PYTHONPATH=str(HERE / "hooks"),
                       SPECOPS_BENCH_CHANNELS=str(channels))
            return [sys.executable, "-m", "invoke", "deploy", "--all", "--quiet", "--forks", "50",
                    "--json", str(self.work / "specops-report.json")], env
        tools = tools_venv()
        if tool == "ansible":
            shutil_template = self.work / "ansible_templates"
            shutil_template.mkdir(exist_ok=True)
            (shutil_template / "sglang.service.j2").write_text(self.unit.read_text())
            env["ANSIBLE_TEMPLATES"] = ""
            return [str(tools / "ansible-playbook"), "-i", str(self.work / "ansible.ini"),
                    "-e", f"playbook_dir={HERE / 'ansible'}", str(self.work / "site.yml")], env
        return [str(tools / "pyinfra"), "-y", "--parallel", "50", str(self.work / "pyinfra_inventory.py"),
                str(HERE / "pyinfra/deploy.py")], env

    def prepare_ansible(self) -> None:
        # The playbook's template is looked up beside the playbook: give it the rendered unit.
        site = (HERE / "ansible/site.yml").read_text().replace("src: sglang.service.j2", f"src: {self.unit}")
        (self.work / "site.yml").write_text(site)

    def run(self, tool: str) -> tuple[float, dict]:
        cmd, env = self.command(tool)
        hosts0, ctl0 = hosts_cpu(self.fleet), controller_cpu()
        t0 = time.perf_counter()
        res = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=1800)
        wall = time.perf_counter() - t0
        if res.returncode != 0:
            raise RuntimeError(f"{tool} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-2000:]}")
        n = len(self.fleet.hosts)
        extra = {"controller_cpu": (controller_cpu() - ctl0) / n, "hosts_cpu": (hosts_cpu(self.fleet) - hosts0) / n}
        if tool == "specops":
            counts = json.loads((self.work / "channels.json").read_text())
            extra["channels_per_host"] = max(counts.values()) if counts else 0
            report = json.loads((self.work / "specops-report.json").read_text())["hosts"]
            extra["round_trips"] = max(h["round_trips"] for h in report.values())
        return wall, extra

    def status(self) -> float:
        """Wall seconds of `inv status` on every host (specops's day 2: production figures included)."""
        cmd, env = self.command("specops")
        cmd = [*cmd[:cmd.index("deploy")], "status", "--all", "--forks", "50"]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise RuntimeError(f"inv status failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-2000:]}")
        return time.perf_counter() - t0

    def check_served(self) -> None:
        """Each tool must really have deployed: the patched code runs on every host."""
        for h in self.fleet.hosts:
            info = json.loads(h.run("curl", "-sf", "http://127.0.0.1:30000/model_info").stdout)
            assert info["model_code"] == "bench", f"{h.name} runs {info['model_code']}"


def controller_cpu() -> float:
    """CPU seconds of the tool processes this process ran and waited for (and their children)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _cpu_stat(path: Path) -> float:
    try:
        for line in (path / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return 0.0


def hosts_cpu(f: "fleet.Fleet") -> float:
    """CPU seconds the sandbox hosts spent outside the simulated servers: each container's payload
    cgroup (cgroup v2's cpu.stat, present without any controller) minus its sglang.service's."""
    unified = next((line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                    if line.split()[2] == "cgroup2"), None)
    total = 0.0
    for h in f.hosts if unified else ():
        init = boot.container_pid(h)
        if not init:
            continue
        rel = next(line.split(":", 2)[2] for line in Path(f"/proc/{init}/cgroup").read_text().splitlines()
                   if line.startswith("0::")).strip()
        payload = Path(unified) / rel.strip("/").rsplit("/", 1)[0]  # the container's, above its units
        total += _cpu_stat(payload) - _cpu_stat(payload / "system.slice/sglang.service")
    return total


KEYS = ("first", "noop", "channels_first", "channels_noop", "trips_first", "trips_noop", "controller_cpu_first",
        "controller_cpu_noop", "hosts_cpu_first", "hosts_cpu_noop", "status")


def measure(counts: list[int], runs: list[int]) -> dict:
    results = {}
    with tempfile.TemporaryDirectory(prefix="specops-bench-") as tmp:
        for n, n_runs in zip(counts, runs):
            setup = Setup(n, Path(tmp))
            setup.prepare_ansible()
            setup.up()
            rows = {t: {k: [] for k in KEYS} for t in TOOLS}
            try:
                for i in range(n_runs):
                    order = TOOLS[i % 3:] + TOOLS[:i % 3]
                    for tool in order:
                        setup.reset()
                        first, ex1 = setup.run(tool)
                        setup.check_served()
                        noop, ex2 = setup.run(tool)
                        rows[tool]["first"].append(first)
                        rows[tool]["noop"].append(noop)
                        for kind, ex in (("first", ex1), ("noop", ex2)):
                            rows[tool][f"controller_cpu_{kind}"].append(ex["controller_cpu"])
                            rows[tool][f"hosts_cpu_{kind}"].append(ex["hosts_cpu"])
                        if tool == "specops":
                            rows[tool]["status"].append(setup.status())
                            rows[tool]["channels_first"].append(ex1["channels_per_host"])
                            rows[tool]["channels_noop"].append(ex2["channels_per_host"])
                            rows[tool]["trips_first"].append(ex1["round_trips"])
                            rows[tool]["trips_noop"].append(ex2["round_trips"])
                        channels = f"  channels {ex1['channels_per_host']}/{ex2['channels_per_host']}" \
                            if tool == "specops" else ""
                        print(f"[bench] {n:>2} hosts run {i + 1}/{n_runs} {tool:<8} first {first:6.2f}s  "
                              f"no-op {noop:6.2f}s{channels}  cpu/host no-op: controller "
                              f"{ex2['controller_cpu']:.3f}s hosts {ex2['hosts_cpu']:.3f}s",
                              file=sys.stderr, flush=True)
            finally:
                setup.fleet.down()
            results[n] = {t: {k: (statistics.median(v) if v else None) for k, v in r.items()} | {"samples": r}
                          for t, r in rows.items()}
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="1,5,20,50")
    ap.add_argument("--runs", default="3", help="runs per host count (one number: the same for all)")
    ap.add_argument("--smoke", action="store_true", help="only check that every tool runs; write nothing")
    ap.add_argument("--json", default=str(HERE / "results.json"))
    ap.add_argument("--rewrite", action="store_true", help="measure nothing: write BENCHMARKS.md again from --json "
                    "(after bench/textfile.py or bench/stacks.py, whose figures its targets read)")
    args = ap.parse_args()
    if args.rewrite:
        results = {int(n): r for n, r in json.loads(Path(args.json).read_text()).items()}
        runs = {n: len(r["specops"]["samples"]["first"]) for n, r in results.items()}
        (ROOT / "BENCHMARKS.md").write_text(report.markdown(results, runs, TOOLS, KEYS, STARTUP_S))
        return
    counts = [int(n) for n in args.hosts.split(",")]
    runs = [int(r) for r in args.runs.split(",")]
    runs = runs * len(counts) if len(runs) == 1 else runs
    if len(runs) != len(counts):
        ap.error("--runs needs one number, or one per host count")
    results = measure(counts, runs)
    print(json.dumps({n: {t: {k: v for k, v in r.items() if k != "samples"} for t, r in res.items()}
                      for n, res in results.items()}, indent=1))
    if not args.smoke:
        Path(args.json).write_text(json.dumps(results, indent=1))
        (ROOT / "BENCHMARKS.md").write_text(report.markdown(results, dict(zip(counts, runs)), TOOLS, KEYS, STARTUP_S))


if __name__ == "__main__":
    main()
