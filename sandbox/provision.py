"""What turns a bare sandbox host into a stand-in GPU box.

The "gpubox" layer is built once and cached like the root filesystem: the
nvidia-smi stand-in, tiny model directories (config.json only: the simulator
loads no weights), and a venv with the SGLang simulator, installed inside the
container by the container's own python3 and pip.  Hosts mount it as an extra
overlay layer, so booting a provisioned host costs nothing.  A "bare" host
(for bootstrap) is a rented box with a GPU: the stand-in, and no venv, no
/models (its services bring their weights: bare_service pushes them from the
controller).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import yaml

from sandbox import base, fleet, logins, pkgindex

from sandbox.simulator import (  # noqa: F401  (their home: simulator.py; here for what builds hosts)
    GPUS, HERE, MODELS, SIM_FAILING, SIM_SRC, SIM_VERSION, SIM_VERSIONS, VENV, _tree_hash, sim_wheel)


def _in_container(root: Path, script: str, network: bool = False) -> None:
    # With network, the build shares the controller's (to reach Debian's mirror for apt).
    resolv = "--resolv-conf=copy-host" if network else "--resolv-conf=off"
    res = subprocess.run(["systemd-nspawn", "-q", "-D", str(root), "--register=no", "--keep-unit",
                          resolv, "/bin/sh", "-ec", script], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"provisioning failed: {res.stdout[-800:]}{res.stderr[-800:]}")


def _write_common(upper: Path, models: bool = True) -> None:
    smi = upper / "usr/local/bin/nvidia-smi"
    smi.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "nvidia_smi.py", smi)
    smi.chmod(0o755)
    (upper / "etc/specops-sim").mkdir(parents=True, exist_ok=True)
    (upper / "etc/specops-sim/gpus.json").write_text(json.dumps(GPUS, indent=2))
    # The stand-in driver's device nodes (regular files: a container makes no device nodes), as on
    # a box whose admin set NVreg_DeviceFileGID=video and NVreg_DeviceFileMode=0660, and where the
    # stand-in driver counts the processes that hold GPU memory (any user's).
    nodes = ["nvidiactl", "nvidia-uvm"] + [f"nvidia{i}" for i in range(len(GPUS["gpus"]))]
    (upper / "etc/tmpfiles.d").mkdir(parents=True, exist_ok=True)
    (upper / "etc/tmpfiles.d/specops-sim.conf").write_text(
        "".join(f"f /dev/{n} 0660 root video -\n" for n in nodes) + "d /run/sglang-sim/gpu 1777 root root -\n")
    if models:
        _write_models(upper / "models")


@base.built_once
def controller_models() -> Path:
    """The tiny models as a user keeps them on the controller, to push to a bare host."""
    root = base.CACHE / "controller-models"
    _write_models(root)
    return root


def _write_models(root: Path) -> None:
    for name, cfg in MODELS.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


# How each kind of layer gets its SGLang venv, run inside the container: (script, needs network).
LAYER_SCRIPTS = {
    "gpubox": ("python3 -m venv {venv} && {venv}/bin/pip install -q --no-index --no-compile "
               "--find-links /opt/specops-sim {wheel}", False),
    # The venv's interpreter (PyPy 3.9) differs from the host's python3 (CPython 3.11).
    "pypy": ("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pypy3 pypy3-venv"
             " >/dev/null && pypy3 -m venv {venv} && {venv}/bin/pip install -q --no-index --no-compile "
             "--find-links /opt/specops-sim {wheel}",
             True),
}


@base.built_once
def layer(kind: str = "gpubox") -> Path:
    """The cached overlay layer: 'gpubox' (SGLang preinstalled), 'pypy' (in a PyPy venv) or
    'bare' (stand-in GPU and models, no venv: for bootstrap)."""
    root = base.rootfs()
    key = _tree_hash(SIM_SRC, HERE / "nvidia_smi.py", HERE / "provision.py", HERE / "wheels.py")
    path = base.CACHE / f"layer-{kind}-{key}"
    if (path / ".complete").exists():
        return path
    tmp = Path(str(path) + ".tmp")
    work, merged = Path(str(path) + ".work"), Path(str(path) + ".merged")
    for d in (tmp, work, merged):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    base.log(f"building sandbox layer {path.name}")
    t0 = time.monotonic()
    _write_common(tmp, models=kind != "bare")
    if kind in LAYER_SCRIPTS:
        wheel = sim_wheel(tmp / "opt/specops-sim")
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={root},upperdir={tmp},workdir={work}", str(merged)], check=True)
        try:
            script, network = LAYER_SCRIPTS[kind]
            _in_container(merged, script.format(venv=VENV, wheel=f"/opt/specops-sim/{wheel.name}"), network)
        finally:
            subprocess.run(["umount", str(merged)], check=True)
        # Leave the image as a host would have it: apt lists and caches are not part of it.
        for junk in ("var/lib/apt/lists", "var/cache/apt/archives"):
            shutil.rmtree(tmp / junk, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(merged, ignore_errors=True)
    (tmp / ".complete").write_text("")
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    # An older build of this kind goes, unless a fleet still has it mounted: another checkout's
    # test run (a worktree with another simulator) boots its hosts from it.
    mounted = Path("/proc/mounts").read_text()
    for old in base.CACHE.glob(f"layer-{kind}-*"):
        if old != path and not old.name.endswith((".tmp", ".work", ".merged")) and f"{old}:" not in mounted \
                and f"lowerdir={old}," not in mounted:
            shutil.rmtree(old, ignore_errors=True)
    base.log(f"layer ready in {time.monotonic() - t0:.0f}s")
    return path


def sandbox_service(name: str = "sglang", port: int = 30000, **over) -> dict:
    """The sandbox's example service: Llama target with an EAGLE-3 draft, consistent flags."""
    svc = {"name": name, "model_path": "/models/tiny-llama", "served_model_name": "tiny-llama",
           "port": port,
           "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/models/tiny-llama-eagle3",
                           "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4},
           "env": {"SGLANG_SIM_STARTUP_DELAY": "1"}}
    svc.update(over)
    return svc


def bare_service(**over) -> dict:
    """The example service for a bare host: its weights pushed from the controller's copy."""
    root = controller_models()
    return sandbox_service(**{"weights": {"source": "controller", "path": str(root / "tiny-llama")},
                              "draft_weights": {"source": "controller", "path": str(root / "tiny-llama-eagle3")},
                              **over})


def site_key(site: fleet.Site) -> str:
    """The sandbox servers' API key: made once per site, kept with its state (root's alone)."""
    path = site.state / "api_key"
    if not path.exists():
        import secrets
        path.parent.mkdir(parents=True, exist_ok=True)
        _private(path, "sk-sandbox-" + secrets.token_hex(12))
    return path.read_text().strip()


def _private(path: Path, text: str) -> None:
    """`text` as the whole of `path`, root's alone (0600), written under a new name and renamed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def known_hosts_path(site: fleet.Site) -> Path:
    return site.state / "known_hosts"


def host_vars(h: fleet.Host) -> dict:
    return {"address": h.address, **logins.host_vars(h.flavour), "ssh_key": str(base.controller_key()),
            "known_hosts": str(known_hosts_path(h.site)), "connect_timeout": 5}


def write_known_hosts(f: fleet.Fleet) -> Path:
    path = known_hosts_path(f.site)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f.known_hosts())
    return path


DEMO_PATCH = "srt/models/llama.py.patch"  # the demo's patch, a diff cut from 0.5.23 (files/patches)


def write_inventory(f: fleet.Fleet) -> Path:
    """The sandbox's own inventory directory (hosts.yml, and patches/ with the demo's patch, copied
    once so that `inv patch` edits the sandbox's copy, not this repository's), never a real fleet's."""
    path = f.site.inventory_dir
    path.mkdir(parents=True, exist_ok=True)
    patch = path / "patches" / DEMO_PATCH
    if not patch.exists():
        patch.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(HERE.parent / "files" / "patches" / DEMO_PATCH, patch)
    _private(path / "hosts.yml", inventory_yaml(f))  # it holds the servers' key
    return path


def remove_inventory(site: fleet.Site) -> None:
    (site.inventory_dir / "hosts.yml").unlink(missing_ok=True)
    shutil.rmtree(site.inventory_dir / "patches", ignore_errors=True)


def _shown(path: Path) -> Path:
    """A path as a user in this repository types it."""
    try:
        return path.relative_to(HERE.parent)
    except ValueError:
        return path


def inventory_yaml(f: fleet.Fleet) -> str:
    """The sandbox hosts on a stack (no `venv:`): SGLang pinned, built by uv from the site's package
    index (which `inv sandbox.up` serves), as a real fleet's upgrades go."""
    write_known_hosts(f)
    # The seed's setup: an EAGLE-3 draft wired to the embedding output (-1), which needs the
    # patched model file that captures it.
    # Reached beyond loopback (Prometheus on the controller scrapes it), so with a key of the
    # site's; its draft watched over seconds, not minutes (docs/tutorial.md, day 2).  As a system
    # user of its own, not root (docs/security.md): the choice a user copies should be the safer one.
    demo = sandbox_service(patches=[DEMO_PATCH], bind="0.0.0.0", api_key=site_key(f.site), user="sglang",
                           draft_config={"eagle_config.eagle_aux_hidden_state_layer_ids": [-1, 2, 16]},
                           watch={"for": "20s", "min_verify_rate": 0.5})
    hosts = {h.name: {**host_vars(h), "monitoring": False, "services": [demo]} for h in f.hosts}
    index = pkgindex.url_of(f.site)
    torch_version, _ = pkgindex.STANDIN_TORCH
    stack = {"sglang": {"version": SIM_VERSION},
             "torch": {"version": torch_version, "cuda": "auto", "index_url": f"{index}/whl/{{variant}}"},
             "package_index": f"{index}/simple", "patch_dir": str(f.site.inventory_dir / "patches")}
    doc = {"all": {"children": {"sandbox": {"vars": stack, "hosts": hosts}}}}
    other = next(v for v in SIM_VERSIONS if v not in (SIM_VERSION, SIM_FAILING))
    return ("# Written by `inv sandbox.up`; removed by `inv sandbox.down`.  Sandbox hosts only: never\n"
            "# add real hosts here, and never point this inventory at a real fleet.\n"
            "#\n"
            f"# SGLang versions on the sandbox's package index ({index}/simple/sglang/):\n"
            f"# {', '.join(SIM_VERSIONS)} (the simulator; {SIM_FAILING} fails at start, on purpose: a failed\n"
            "# upgrade is undone).  Each version is a stack: a venv of its own, built by uv on the host.\n"
            f"# To upgrade, change `sglang: {{version: {SIM_VERSION}}}` below (e.g. to {other}), then\n"
            f"#   inv deploy --inventory {_shown(f.site.inventory_dir)} --host {f.hosts[0].name}\n"
            f"# The demo's patch (patches/{DEMO_PATCH}, a diff cut from {SIM_VERSION}) conflicts with\n"
            f"# {other}'s file: docs/tutorial.md, '7. An upgrade', walks through it here.\n"
            + yaml.safe_dump(doc, sort_keys=False))
