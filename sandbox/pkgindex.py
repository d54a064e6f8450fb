"""The sandbox's package index: PEP 503 pages served to the hosts over their veth.

Layout as the real world has it: /whl/<variant>/ per torch variant (like
download.pytorch.org/whl/cu128) and /simple/ for everything else (like PyPI).  It holds
the stand-in CUDA torch wheels, the SGLang simulator (each release of simulator.SIM_VERSIONS),
the real CPU torch from PIP_FIND_LINKS, the real flash-linear-attention with its dependencies,
the real huggingface_hub the hosts fetch weights with, the real sglang-router, the real uv
that builds the hosts' stacks, and the real sglang 0.5.21 (read, never installed).  Files are
served with range requests honoured, as real indexes' file hosts do.
"""
from __future__ import annotations

import hashlib
import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from sandbox import base, fleet, real_sglang, simulator, torch_standin
from specops.layout import HF_PIN, UV_PIN

STANDIN_TORCH = ("2.9.1", ["cu126", "cu128", "cpu"])
REAL = ["torch==2.13.0", "flash-linear-attention==0.6.0"]
HUB = [f"huggingface-hub=={HF_PIN}"]
ROUTER = ["sglang-router==0.3.2"]  # the real router (a Rust binary in a wheel; runs on CPU)
# The real sglang 0.5.21: a release whose files a patch is cut from and rebased off, read by range
# requests on the hosts, never installed (no inventory pins it; the simulator has no 0.5.21).  The
# real 0.5.23 is not here: a cp311 wheel would win over the simulator's 0.5.23 in uv's eyes.
REAL_SGLANG = "0.5.21"
UV = [f"uv=={UV_PIN}"]  # a Rust binary in a py3-none-manylinux wheel, no dependencies
PORT = 8631


def _project(wheel: Path) -> str:
    return re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()


@base.built_once
def real_wheels(wanted: list[str] = REAL, name: str = "real") -> Path:
    """Real wheels with their dependencies, cached: by default the CPU torch 2.13.0 and
    flash-linear-attention 0.6.0; HUB is what the hosts' weights tool venv installs."""
    key = hashlib.sha256(" ".join(wanted).encode()).hexdigest()[:10]
    path = base.CACHE / f"wheels-{name}-{key}"
    if (path / ".complete").exists():
        return path
    tmp = Path(str(path) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    base.log(f"downloading {' and '.join(wanted)} with dependencies (cached afterwards)")
    # torch 2.13.0+cpu comes from the file on disk (PIP_FIND_LINKS); the rest from PyPI.
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                    "--only-binary", ":all:", "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64",
                    "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
                    "--platform", "any", "-d", str(tmp), *wanted], check=True)
    (tmp / ".complete").write_text("")
    tmp.rename(path)
    return path


def standin_wheels(path: Path) -> Path:
    """The stand-in torch wheels and the simulator's (every release), built afresh into `path` (the
    site's own: the simulator may have changed since the last run)."""
    shutil.rmtree(path, ignore_errors=True)
    version, variants = STANDIN_TORCH
    for v in variants:
        torch_standin.build(path, version, v)
    for sim in simulator.SIM_VERSIONS:
        simulator.sim_wheel(path, sim)  # with its dependencies (setproctitle) beside it
    return path


def build(root: Path) -> Path:
    """Lay out the index under root; returns root."""
    shutil.rmtree(root, ignore_errors=True)
    (root / "files").mkdir(parents=True)
    by_index: dict[str, dict[str, list[Path]]] = {}
    wheels = [
        *standin_wheels(root.parent / "wheels-standin").glob("*.whl"),
        *real_wheels().glob("*.whl"),
        *real_wheels(HUB, "hub").glob("*.whl"),
        *real_wheels(ROUTER, "router").glob("*.whl"),
        *real_wheels(UV, "uv").glob("*.whl"),
        real_sglang.wheel(REAL_SGLANG),
    ]
    for wheel in sorted(set(wheels), key=lambda w: (w.name, str(w))):
        if (root / "files" / wheel.name).exists():
            continue  # the same wheel from two sets
        try:
            os.link(wheel, root / "files" / wheel.name)  # the cache and the index share a disk
        except OSError:
            shutil.copy(wheel, root / "files" / wheel.name)
        project = _project(wheel)
        local = re.search(r"\+(\w+)-", wheel.name)
        index = f"whl/{local.group(1)}" if project == "torch" and local else "simple"
        by_index.setdefault(index, {}).setdefault(project, []).append(wheel)
    for index, projects in by_index.items():
        for project, files in projects.items():
            page = root / index / project / "index.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            depth = "../" * (index.count("/") + 2)
            links = "".join(f'<a href="{depth}files/{html.escape(w.name)}#sha256='
                            f'{hashlib.sha256(w.read_bytes()).hexdigest()}">{html.escape(w.name)}</a><br>\n'
                            for w in files)
            page.write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    return root


PID_FILE = "index.pid"  # under site.state: the index `inv sandbox.up` left running (JSON)
LOG_FILE = "index.log"


class Index:
    """The index, served on the fleet's service address (reached by hosts via their gateway)."""

    def __init__(self, site: fleet.Site = fleet.DEFAULT_SITE, port: int = PORT):
        self.site, self.port = site, port
        self.root = build(site.state / "index")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return url_of(self.site, self.port)

    def argv(self, fd: int) -> list[str]:
        return [sys.executable, "-m", "sandbox.pkgindex", "serve", fleet.service_address(self.site),
                str(self.port), str(self.root), str(fd)]

    def start(self, detached: bool = False) -> "Index":
        """Serve it.  The port is bound here, before the server starts, and handed to it: nobody
        else's listener can take it in between, and one already there is an error.  `detached`:
        in a session of its own, to outlive this process (`inv sandbox.up`), its pid and start
        time recorded in site.state/index.pid for `stop_recorded`."""
        import socket
        fleet.service_address_up(self.site)
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((fleet.service_address(self.site), self.port))
        except OSError as e:
            listener.close()
            raise RuntimeError(f"cannot serve the package index on {self.url}: {e.strerror} (something not "
                               f"started by the sandbox holds it: stop it first)") from None
        listener.listen(64)
        argv, cwd = self.argv(listener.fileno()), Path(__file__).resolve().parent.parent
        try:
            if detached:
                with open(self.site.state / LOG_FILE, "wb") as log:
                    self.proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                                                 stderr=subprocess.STDOUT, start_new_session=True,
                                                 pass_fds=(listener.fileno(),))
                _record(self.site, self.proc.pid, argv)  # at once: a failed start is cleaned up too
            else:
                self.proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                             pass_fds=(listener.fileno(),))
        finally:
            listener.close()
        from urllib.request import urlopen
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:  # the port listens from the start: it is up once it answers
                urlopen(f"{self.url}/simple/", timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        if detached:
            stop_recorded(self.site)
        raise RuntimeError(f"package index did not start on {self.url}"
                           + (f" (exit status {self.proc.returncode})" if self.proc.poll() is not None else ""))

    def stop(self) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(10)


def url_of(site: fleet.Site, port: int = PORT) -> str:
    return f"http://{fleet.service_address(site)}:{port}"


# ---- the index `inv sandbox.up` leaves running, and `inv sandbox.down` stops ----

def _record(site: fleet.Site, pid: int, argv: list[str]) -> None:
    started = _process(pid)
    (site.state / PID_FILE).write_text(json.dumps({"pid": pid, "start_time": started and started[0],
                                                   "argv": argv}) + "\n")


def _process(pid: int) -> tuple[str, list[str]] | None:
    """(start time in clock ticks since boot, argv) of a live process; None if there is none (or a
    zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    # fields[0] is stat's 3rd field (state): the start time, its 22nd, is fields[19]
    return fields[19], [a.decode(errors="replace") for a in argv.split(b"\0")[:-1]]


def _attributable(rec: dict) -> bool:
    """The recorded process is still the index that was started: the same start time (a pid reused
    since has another) and the command line of `-m sandbox.pkgindex serve ...`, as recorded."""
    now = _process(rec["pid"])
    return (now is not None and rec.get("start_time") is not None and now[0] == rec["start_time"]
            and now[1] == rec.get("argv") and now[1][1:4] == ["-m", "sandbox.pkgindex", "serve"])


def _read_record(site: fleet.Site) -> dict | None:
    try:
        rec = json.loads((site.state / PID_FILE).read_text())
        int(rec["pid"])
        return rec
    except (OSError, ValueError, KeyError, TypeError):
        return None


def recorded(site: fleet.Site) -> int | None:
    """The pid of the site's detached index if it still runs (and is that index), else None."""
    rec = _read_record(site)
    return rec["pid"] if rec and _attributable(rec) else None


def stop_recorded(site: fleet.Site, grace: float = 10) -> str:
    """Stop the site's detached index: SIGTERM, wait, SIGKILL after `grace`; the pid file goes.  A
    pid file whose process is not that index (gone, or its pid reused) is removed and nothing is
    killed.  Returns "stopped", "stale" (a pid file, no such index) or "none" (no pid file)."""
    path = site.state / PID_FILE
    if not path.exists():
        return "none"
    rec = _read_record(site)
    if rec is None or not _attributable(rec):
        path.unlink(missing_ok=True)
        return "stale"
    pid = rec["pid"]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _attributable(rec):
            break
        os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not _attributable(rec):  # gone, or a zombie (its parent reaps it)
                break
            time.sleep(0.05)
    if _attributable(rec):
        raise RuntimeError(f"the package index (pid {pid}) did not stop")
    path.unlink(missing_ok=True)
    return "stopped"


SLOW_S = 12.0  # /slow/... answers like /... after this long (under pip's 15 s timeout): a pip that
# takes tens of seconds for its pages, so a pip that was not killed is told from one that was


def serve(address: str, port: int, root: str, fd: int | None = None) -> None:
    """The index over HTTP, with range requests; /slow/<path> is <path> served late (tests interrupt
    a pip mid-run).  `fd`: the listening socket its starter bound (else it binds address:port)."""
    import functools
    import socket
    from http.server import ThreadingHTTPServer

    from sandbox.httprange import RangeHandler

    class Handler(RangeHandler):  # range requests honoured, as real indexes' file hosts do
        def do_GET(self):
            if self.path.startswith("/slow/"):
                time.sleep(SLOW_S)
                self.path = self.path[len("/slow"):]
            super().do_GET()

    handler = functools.partial(Handler, directory=root)
    if fd is None:
        ThreadingHTTPServer((address, port), handler).serve_forever()
        return
    server = ThreadingHTTPServer((address, port), handler, bind_and_activate=False)
    server.socket.close()
    server.socket = socket.socket(fileno=fd)
    server.server_address = server.socket.getsockname()
    server.serve_forever()


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else None)
