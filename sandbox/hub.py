"""The sandbox's Hugging Face hub: olah, a real self-hosted Hugging Face mirror, serving local git
repositories offline, behind a small gate that the hosts reach over their gateway.

Repositories (git work trees on branch main; weights as Git LFS pointers with their objects
under .git/lfs/objects, which olah reads and reports with their sha256):
  sandbox/tiny-llama          the target: config.json and two real safetensors shards
  sandbox/tiny-llama-eagle3   an EAGLE-3 draft: config.json and one safetensors file
  sandbox/gated-llama         the target again, gated: only with the token (TOKEN below)

Why a gate in front of olah: olah's offline mirror streams whole files and knows no gated
repositories.  The gate adds exactly what the Hub does there and nothing else:
  - `Range: bytes=N-` on a download answers 206 with the rest (huggingface_hub resumes so);
  - a gated repository without `Authorization: Bearer <token>` answers 401 with
    `X-Error-Code: GatedRepo`, which huggingface_hub turns into GatedRepoError;
  - `sandbox/escape-listing` lists the target's files plus `../../etc/specops-escape.json`, as a
    hostile mirror could;
  - tests can cut the next download of a weight file at half (`cut()`), as a lost connection does,
    after which downloads fail until `uncut()` (so the run ends there instead of resuming at once);
  - tests can hold a repository's listing (`hold(repo)`) until `release()`: a point in the middle of
    a fetch, after the host's checks, where a test acts as a local user would;
  - tests can slow every weight download (`slow(bytes_per_s)`), so a transfer is still running when
    the test interrupts it.
Everything else is passed to olah unchanged.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

from sandbox import base, fleet, provision

OLAH = "olah==0.5.4"
OLAH_PORT, GATE_PORT = 8632, 8633
TOKEN = "hf_sandboxGatedToken0123456789"
GATED = {"sandbox/gated-llama"}
ESCAPE = "sandbox/escape-listing"  # the gate answers its listing with a name that leaves the directory
COMMIT_DATE = "2026-01-01T00:00:00+00:00"  # fixed, so every build has the same commit shas


def safetensors(seed: str, floats: int) -> bytes:
    """A real safetensors file: one F32 tensor of `floats` values, derived from `seed`."""
    header = json.dumps({"weight": {"dtype": "F32", "shape": [floats], "data_offsets": [0, 4 * floats]}}).encode()
    header += b" " * (-len(header) % 8)
    block = hashlib.sha256(seed.encode()).digest()
    data = (block * (4 * floats // len(block) + 1))[:4 * floats]
    return struct.pack("<Q", len(header)) + header + data


REPOS = {
    "sandbox/tiny-llama": {"config.json": json.dumps(provision.MODELS["tiny-llama"], indent=2).encode(),
                           "model-00001-of-00002.safetensors": safetensors("target-1", 1 << 20),
                           "model-00002-of-00002.safetensors": safetensors("target-2", 1 << 20)},
    "sandbox/tiny-llama-eagle3": {"config.json": json.dumps(provision.MODELS["tiny-llama-eagle3"], indent=2).encode(),
                                  "model.safetensors": safetensors("draft", 1 << 19)},
}
REPOS["sandbox/gated-llama"] = dict(REPOS["sandbox/tiny-llama"])
# Names and bytes a hostile mirror chooses: a file named like root's SSH keys, with a key of its own.
PLANTED_KEY = b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPlantedByTheMirror0000000000000000000000 mirror\n"
REPOS["sandbox/planted"] = {"config.json": REPOS["sandbox/tiny-llama"]["config.json"], "authorized_keys": PLANTED_KEY}


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_DATE": COMMIT_DATE, "GIT_COMMITTER_DATE": COMMIT_DATE,
           "GIT_AUTHOR_NAME": "sandbox", "GIT_AUTHOR_EMAIL": "sandbox@localhost",
           "GIT_COMMITTER_NAME": "sandbox", "GIT_COMMITTER_EMAIL": "sandbox@localhost"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def build_repos(root: Path) -> dict[str, str]:
    """The repositories under root/models/ORG/REPO; returns each one's commit sha."""
    shas = {}
    for name, files in REPOS.items():
        repo = root / "models" / name
        if not (repo / ".git").exists():
            repo.mkdir(parents=True, exist_ok=True)
            _git(repo, "init", "-q", "-b", "main")
            for fname, data in files.items():
                if fname.endswith(".safetensors"):  # a Git LFS pointer, the object beside it
                    oid = hashlib.sha256(data).hexdigest()
                    obj = repo / ".git/lfs/objects" / oid[:2] / oid[2:4] / oid
                    obj.parent.mkdir(parents=True, exist_ok=True)
                    obj.write_bytes(data)
                    data = f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(data)}\n".encode()
                (repo / fname).write_bytes(data)
            _git(repo, "add", "-A")
            _git(repo, "commit", "-q", "-m", "sandbox weights")
        shas[name] = _git(repo, "rev-parse", "HEAD")
    return shas


@base.built_once
def olah_venv() -> Path:
    """olah in a venv of its own, cached."""
    venv = base.CACHE / f"olah-venv-{OLAH.split('==')[1]}"
    if not (venv / ".complete").exists():
        base.log(f"installing {OLAH} (cached afterwards)")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin/pip"), "install", "-q", "--disable-pip-version-check", OLAH], check=True)
        (venv / ".complete").write_text("")
    return venv


class Hub:
    """olah and the gate, for one site; `url` is what hosts put in HF_ENDPOINT."""

    def __init__(self, site: fleet.Site = fleet.DEFAULT_SITE):
        self.site = site
        self.dir = site.state / "hub"
        # olah listens on loopback only (hosts reach it through the gate), at an address of the
        # site's own: two sites' hubs (two test workers) run side by side.
        self.olah = f"127.0.{site.subnet.split('.')[2]}.1:{OLAH_PORT}"
        self.procs: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"http://{fleet.service_address(self.site)}:{GATE_PORT}"

    def start(self) -> "Hub":
        self.dir.mkdir(parents=True, exist_ok=True)
        for name in ("served", "cut", "cut-done", "hold", "held", "slow"):  # a new gate counts from 0, with the link up
            (self.dir / name).unlink(missing_ok=True)
        self.shas = build_repos(self.dir / "mirrors")
        netloc = f"{fleet.service_address(self.site)}:{GATE_PORT}"
        (self.dir / "configs.toml").write_text(
            f'[basic]\nhost = "{self.olah.split(":")[0]}"\nport = {OLAH_PORT}\nrepos-path = "{self.dir / "repos"}"\n'
            f'mirror-scheme = "http"\nmirror-netloc = "{netloc}"\nmirror-lfs-netloc = "{netloc}"\n'
            f'mirrors-path = ["{self.dir / "mirrors"}"]\n\n[accessibility]\noffline = true\n\n'
            '[[accessibility.proxy]]\nrepo = ".*"\nallow = true\nuse_re = true\n\n'
            '[[accessibility.cache]]\nrepo = ".*"\nallow = true\nuse_re = true\n')
        fleet.service_address_up(self.site)
        log = open(self.dir / "olah.log", "ab")
        self.procs.append(subprocess.Popen([str(olah_venv() / "bin/olah-cli"), "-c", str(self.dir / "configs.toml")],
                                           cwd=self.dir, stdout=log, stderr=log))
        self.procs.append(subprocess.Popen([sys.executable, "-m", "sandbox.hubgate", fleet.service_address(self.site),
                                            str(GATE_PORT), self.olah, str(self.dir)],
                                           cwd=Path(__file__).resolve().parent.parent, stdout=log, stderr=log))
        self._wait(f"http://{self.olah}/api/models/sandbox/tiny-llama/revision/main")
        self._wait(f"{self.url}/api/models/sandbox/tiny-llama/revision/main")
        return self

    def _wait(self, url: str, timeout: float = 60) -> None:
        import urllib.request
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"the sandbox hub did not answer {url} within {timeout:.0f}s "
                           f"(see {self.dir / 'olah.log'})")

    def cut(self) -> None:
        """The next weight download stops at half its bytes, as a lost connection would; the hub
        then stays unreachable for downloads until uncut()."""
        (self.dir / "cut").write_text("")

    def hold(self, repo: str) -> None:
        """The next listing of `repo` waits (the host has made its checks) until release()."""
        (self.dir / "held").unlink(missing_ok=True)
        (self.dir / "hold").write_text(repo)

    def wait_held(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not (self.dir / "held").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no listing was held within {timeout:.0f}s")
            time.sleep(0.1)

    def release(self) -> None:
        (self.dir / "hold").unlink(missing_ok=True)

    def slow(self, rate: int | None) -> None:
        """Weight downloads at about `rate` bytes a second (None: at full speed)."""
        if rate:
            (self.dir / "slow").write_text(str(rate))
        else:
            (self.dir / "slow").unlink(missing_ok=True)

    def uncut(self) -> None:
        for name in ("cut", "cut-done"):
            (self.dir / name).unlink(missing_ok=True)

    def served(self) -> int:
        """Bytes of file content the gate has sent so far."""
        try:
            return int((self.dir / "served").read_text() or 0)
        except (OSError, ValueError):
            return 0

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(10)
