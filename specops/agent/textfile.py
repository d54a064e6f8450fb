"""node_exporter's textfile: what this host runs, as specops deployed it, for Prometheus.

Written after every deploy, rollback and verify (protocol.Textfile, the run's last request), and
every minute by the monitoring role's timer (`python3 -m`-less: main() from the agent's zip, no
host lock, no change but this file), so that drift made by hand and restarts show without a run.

What it says, per service of the current release (docs/monitoring.md lists every series):
the release (stamp, stack, SGLang version, weights digest, who deployed it from which commits), the
spec settings and the CUDA-graph choice deployed, what the release's spec-bench or spec-tune measured
and its gate, the unit's state and systemd's restart count, the last verify's verdict, and drift: a
managed file that differs from the release's copy, or a server that started before its files (or
weights) changed.

Never a secret: names, versions, digests and numbers only (no env file, argument or key is read
into it).  Written whole to a temporary name in the same directory, fsync'd, then renamed: the
collector never reads a torn file; the directory must be root's alone (safefs).
"""
import os
import sys
import time

from specops import protocol
from specops.agent import lock, safefs
from specops.agent.converge.venvs import resolve_key
from specops.agent.host import run_quiet, sha256, wall_time
from specops.agent.releases import current_manifest, read_perf
from specops.agent.services.running import stale_check
from specops.agent.services.verdicts import verdicts
from specops.layout import TEXTFILE_NAME

# name → (type, help): every series the file may hold, in the order written.
SERIES = [
    (
        "specops_release_info",
        "gauge",
        "The release a service runs: stamp, stack, SGLang version, weights digest, "
        "who deployed it and the commits of specops and the inventory.",
    ),
    ("specops_spec_num_steps", "gauge", "speculative_num_steps deployed."),
    ("specops_spec_eagle_topk", "gauge", "speculative_eagle_topk deployed."),
    ("specops_spec_num_draft_tokens", "gauge", "speculative_num_draft_tokens deployed."),
    ("specops_cuda_graph_deployed", "gauge", "1 when the release runs with CUDA graphs."),
    ("specops_release_accept_length", "gauge", "Accept length the release's spec-bench or spec-tune measured."),
    ("specops_release_speedup", "gauge", "Speedup over no speculation the release's spec-bench or spec-tune measured."),
    ("specops_gate_min_accept_length", "gauge", "The release's gate: the least accept length it had to reach."),
    ("specops_verified", "gauge", "1 when the last verify of the service passed."),
    ("specops_unit_active", "gauge", "1 when the service's systemd unit is active."),
    ("specops_unit_restarts_total", "counter", "systemd's restarts of the unit since it was last started on purpose."),
    (
        "specops_drift",
        "gauge",
        "1 when the host differs from the release: kind files (a managed file changed) "
        "or stale (the server runs older code or weights than its files).",
    ),
    (
        "specops_run_in_progress",
        "gauge",
        "1 while a specops run holds the host lock (its changes are not yet a release).",
    ),
    ("specops_textfile_timestamp_seconds", "gauge", "When specops last wrote this file."),
]
SPEC = {"specops_spec_num_steps": "speculative_num_steps", "specops_spec_eagle_topk": "speculative_eagle_topk",
        "specops_spec_num_draft_tokens": "speculative_num_draft_tokens"}


def _label(value):
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def sample(name, labels, value):
    inner = ",".join('%s="%s"' % (k, _label(v)) for k, v in labels.items())
    return "%s{%s} %s" % (name, inner, repr(float(value)) if not isinstance(value, bool) else int(value))


def render(samples):
    """The exposition text: # HELP and # TYPE once per series that has samples, then its samples."""
    out = []
    for name, kind, doc in SERIES:
        mine = [s for n, s in samples if n == name]
        if mine:
            out += ["# HELP %s %s" % (name, doc), "# TYPE %s %s" % (name, kind)] + mine
    return "\n".join(out) + "\n"


def measured(stamp, service, spec):
    """What the release measured for what it runs (protocol.release_figure), or None."""
    return protocol.release_figure((read_perf(stamp) or {}).get(service), (read_perf(stamp, "tune") or {}).get(service),
                                   spec)


FRESH_S = 10.0  # a unit fact this agent read this recently (verify's, just before) is used as it is


def unit_state(name):
    """ActiveState, NRestarts and ExecMainStartTimestamp (wall clock) of the unit: what this agent
    process read of it in the last FRESH_S (the verify before a deploy's textfile: systemctl show
    and PID 1's answer cost each host ~10 ms, 20 hosts' a third of a second on two cores), else
    asked now (not through the probe's unit_fact: importing the probe costs the timer ~30 ms)."""
    probe = sys.modules.get("specops.agent.converge.probe")
    seen = probe.SEEN.get(name) if probe else None
    if seen and time.monotonic() - seen[0] < FRESH_S:
        return seen[1]
    _, out = run_quiet(["systemctl", "show", name, "-p", "ActiveState,NRestarts,ExecMainStartTimestampMonotonic"])
    fact = dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)
    fact["ExecMainStartTimestamp"] = wall_time(fact.pop("ExecMainStartTimestampMonotonic", "0"))
    return fact


def changed_files(check, snapshot):
    """Managed files of the service that differ from the release's copy (or are gone, or are
    no longer a regular file reached through root's links: read as safefs reads, never hanging)."""
    out = []
    for key in check.get("managed") or []:
        path = resolve_key(key)
        want = (snapshot.get(path) or {}).get("sha256") if path else None
        try:
            data = safefs.read_file(path) if want else None
        except (OSError, safefs.UnsafePath):
            data = None
        if want and (data is None or sha256(data).hexdigest() != want):
            out.append(path)
    return out


class _Check:
    """What stale_check reads of a ServiceCheck, from the manifest's copy."""
    def __init__(self, check):
        self.managed, self.weights = check.get("managed") or [], check.get("weights") or []


def collect(manifest):
    """(series name, sample line) for every service of the release `manifest`, the host as it is now."""
    out, stamp = [], manifest["stamp"]
    checks = {c["name"]: c for c in manifest.get("verify") or [] if isinstance(c, dict)}
    sglang = (manifest.get("packages") or {}).get("sglang") or ""
    seen = verdicts()
    for name in manifest.get("services") or []:
        svc, check = {"service": name}, checks.get(name) or {}
        spec = (manifest.get("spec") or {}).get(name) or {}
        watch = (manifest.get("watch") or {}).get(name) or {}
        digests = [(manifest.get("weights") or {}).get(d, {}).get("digest") or "" for d in check.get("weights") or []]
        out.append(("specops_release_info", sample("specops_release_info", dict(
            svc, stamp=stamp, sglang_version=sglang, venv=manifest.get("venv") or "",
            weights_digest=",".join(d[:16] for d in digests), **protocol.provenance_labels(manifest)), 1)))
        for series, field in SPEC.items():
            if spec.get(field) is not None:
                out.append((series, sample(series, svc, spec[field])))
        if "cuda_graph" in watch:
            out.append(
                ("specops_cuda_graph_deployed", sample("specops_cuda_graph_deployed", svc, bool(watch["cuda_graph"])))
            )
        got = measured(stamp, name, spec)
        if got:
            accept, speedup, source = got
            out.append(("specops_release_accept_length", sample("specops_release_accept_length",
                                                                dict(svc, source=source), accept)))
            if speedup:
                out.append(("specops_release_speedup", sample("specops_release_speedup", dict(svc, source=source),
                                                              speedup)))
        if watch.get("gate_min_accept_length") is not None:
            out.append(("specops_gate_min_accept_length", sample("specops_gate_min_accept_length", svc,
                                                                 watch["gate_min_accept_length"])))
        if name in seen:
            out.append(("specops_verified", sample("specops_verified", svc, bool(seen[name].get("ok")))))
        unit = unit_state(name)
        out.append(("specops_unit_active", sample("specops_unit_active", svc, unit.get("ActiveState") == "active")))
        out.append(("specops_unit_restarts_total", sample("specops_unit_restarts_total", svc,
                                                          int(unit.get("NRestarts") or 0))))
        report = protocol.ServiceReport(name=name)
        if unit.get("ActiveState") == "active":
            stale_check(_Check(check), report, unit)
        for kind, on in (("files", changed_files(check, manifest.get("files") or {})), ("stale", report.stale)):
            out.append(("specops_drift", sample("specops_drift", dict(svc, kind=kind), bool(on))))
    held = lock.peek()
    out.append(("specops_run_in_progress", "specops_run_in_progress %d" % (held["held"] and not held["expired"])))
    out.append(("specops_textfile_timestamp_seconds", "specops_textfile_timestamp_seconds %r" % time.time()))
    return out


def write(req):
    """Answer a protocol.Textfile (and the timer's refresh): the whole file, renamed into place."""
    cpu = time.process_time() + sum(os.times()[2:4])  # with its children's (systemctl show)
    manifest = current_manifest()
    samples = collect(manifest) if manifest else []
    text = render(samples).encode()
    try:
        fd, real = safefs.open_dir(req.directory)
    except safefs.Missing:
        return protocol.TextfileResult(path=None)
    try:
        tmp = ".%s.%d.tmp" % (TEXTFILE_NAME, os.getpid())  # a dotfile: the collector reads *.prom only
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd)
        try:
            with os.fdopen(out, "wb") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, TEXTFILE_NAME, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=fd)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)
    return protocol.TextfileResult(path=real.rstrip("/") + "/" + TEXTFILE_NAME, series=len(samples), bytes=len(text),
                                   cpu_s=round(time.process_time() + sum(os.times()[2:4]) - cpu, 4))


def main(argv):
    """The timer's refresh: `main([directory])`; one line on failure, for the journal."""
    import sys
    try:
        res = write(protocol.Textfile(directory=argv[0]))
    except Exception as e:  # the journal gets one line; the next tick tries again
        sys.exit("specops textfile: %s: %s" % (type(e).__name__, e))
    print("specops textfile: %s" % ("%d series in %s" % (res.series, res.path) if res.path else
                                    "no directory %s: nothing written" % argv[0]))
