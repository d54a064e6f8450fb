"""All or nothing (issue 45): a deploy that fails while it applies leaves the host on one
release, the previous one verified or the new one; a failure before the switch touches nothing
that serves; a switch cut off is undone by the next run that takes the lock."""
import json

import pytest

from sandbox import aptrepo, hub as hub_mod, provision
from sandbox.provision import DEMO_PATCH, sandbox_service
from specops import protocol
from specops.layout import APPLY_JOURNAL as JOURNAL, FAULTS, LAUNCHER
from support.hosts import unit_prop
from support.reliability import record_bytes
from support.releases import UNIT, current, first_release, inventory, server_info, serving
from support.site import run_inv

pytestmark = pytest.mark.fleet


def spec(steps, draft):
    return {"algorithm": "EAGLE3", "draft_model_path": "/models/tiny-llama-eagle3", "num_steps": steps,
            "eagle_topk": 1, "num_draft_tokens": draft}


@pytest.mark.reliability("apply-fault", "fault")
def test_a_failed_package_install_touches_nothing_that_serves(sandbox, record_property):
    """The issue's repro: release 1 verified; then new draft settings and `monitoring: true` on a
    host whose only apt source has no node exporter.  --check says so first; the deploy fails
    before the switch, and the host still serves release 1, verified, with no drift."""
    h = sandbox.reset("t1")
    aptrepo.serve(h, [], remove=False)  # a package source that answers, and has no node exporter
    one = inventory(sandbox, "one", {"t1": {"services": [sandbox_service(speculative=spec(3, 4))]}})
    res, _ = run_inv(sandbox, one, "deploy", "--host", "t1")
    assert res.returncode == 0, res.stdout[-3000:]
    release1, before = current(h), serving(h)

    two = inventory(sandbox, "two", {"t1": {"services": [sandbox_service(speculative=spec(2, 3))], "monitoring": True}})
    res = sandbox.inv("deploy", "--host", "t1", "--check", inventory=two)
    assert res.returncode == 1, res.stdout[-3000:]
    assert "prometheus-node-exporter: no candidate in the host's package lists" in res.stdout, res.stdout[-3000:]
    assert serving(h) == before

    res, rep = run_inv(sandbox, two, "deploy", "--host", "t1")
    record_bytes(record_property, h, {UNIT: before["unit"]})
    assert res.returncode == 1, res.stdout[-3000:]
    error = rep["t1"]["error"]
    assert "apt-get install prometheus-node-exporter" in error and "while preparing, before the switch" in error
    assert "nothing that serves was touched" in error, error
    assert serving(h) == before  # the unit file is release 1's, and the server never restarted
    assert current(h) == release1
    res = sandbox.inv("verify", "--host", "t1", inventory=one)
    assert res.returncode == 0, res.stdout[-3000:]
    status = sandbox.inv("status", "--host", "t1", inventory=one)
    assert status.returncode == 0 and "STALE" not in status.stdout and "mismatch" not in status.stdout.lower(), \
        status.stdout
    listing = sandbox.inv("releases", "--host", "t1", inventory=one).stdout
    attempt = [line for line in listing.splitlines() if "rolled-back" in line]
    assert attempt and "apt-get install prometheus-node-exporter" in attempt[-1], listing


# ---- the fault matrix: a fault at each kind of action a deploy batch holds ----

def fault(h, kind, how="fail", nth=1):
    """Ask the host's agent to fail (or die) at its nth action of `kind` (specops/agent/faults.py)."""
    h.run("sh", "-c", f"umask 077; cat > {FAULTS}", input=json.dumps({"kind": kind, "how": how, "nth": nth}))


def fired(h):
    return h.run("test", "-e", FAULTS, check=False).returncode != 0


def on_release(sandbox, h, inv, release, before, drift_ok=(), restarted=True):
    """The host serves `release` as `inv` says, verified, with no drift but `drift_ok`'s words, no
    switch journal left; and what serves is as `before` (its unit file, its arguments; the
    server itself, unless `restarted` may have restarted it)."""
    assert current(h) == release
    assert h.run("test", "-e", JOURNAL, check=False).returncode != 0  # the undo was done with it
    now = serving(h)
    keys = ("unit", "steps") if restarted else ("unit", "steps", "pid", "invocation")
    assert {k: now[k] for k in keys} == {k: before[k] for k in keys}
    res = sandbox.inv("verify", "--host", h.name, inventory=inv)
    assert res.returncode == 0, res.stdout[-3000:]
    status = sandbox.inv("status", "--host", h.name, "--strict", inventory=inv)
    drift = [line for line in status.stdout.splitlines() if line.split()[:2] == [h.name, "sglang"]]  # its row
    assert drift and (status.returncode == 0 or all(any(w in line for w in drift_ok) for line in drift)), \
        status.stdout
    return now


def try_faults(sandbox, h, kinds, one, two, release1, before, tried, drift_ok=(), after=None):
    """Deploy `two` once per kind, failing at that kind's first action: every attempt fails, the
    fault fired, and the host is left on release 1 (`one`), verified; a failed preparation never
    restarted the server.  `after(kind)`: the scenario's own look at the host after each."""
    for kind in kinds:
        kind, nth, restarts = (*kind, True)[:3] if isinstance(kind, tuple) else (kind, 1, True)
        fault(h, kind, nth=nth)
        res, rep = run_inv(sandbox, two, "deploy", "--host", h.name)
        assert fired(h), f"{kind}: no action of this kind in the deploy:\n{res.stdout[-3000:]}"
        assert res.returncode == 1 and "a fault injected on request" in rep[h.name]["error"], res.stdout[-3000:]
        prepare = protocol.wire._ACTIONS[kind].PHASE == protocol.PREPARE
        assert ("nothing that serves was touched" in rep[h.name]["error"]) == prepare, rep[h.name]["error"]
        on_release(sandbox, h, one, release1, before, drift_ok, restarted=restarts and not prepare)
        if after:
            after(kind)
        tried.append(kind)


TRIED = []  # the kinds the matrix's scenarios have failed at, in order
SCENARIOS = set()  # the matrix's tests that ran (the check of every kind needs them all)


@pytest.mark.reliability("apply-fault", "fault")
def test_faults_in_files_units_packages_and_patches(sandbox):
    """A patch (its upstream kept), a system user, node exporter from the host's apt source, a new
    directory, a file's mode, every file written, purged, a timer enabled, systemd reloaded, the
    server restarted: a fault at each leaves release 1 serving."""
    SCENARIOS.add("test_faults_in_files_units_packages_and_patches")
    h = sandbox.reset("t2")
    aptrepo.serve(h, [], remove=False, debs=(aptrepo.controller_deb("prometheus-node-exporter"),))
    h.run("apt-get", "update", "-qq")
    one, release1, before = first_release(sandbox, h, "one",
                                          {"t2": {"services": [sandbox_service(speculative=spec(3, 4))]}})
    svc = sandbox_service(speculative=spec(2, 3), patches=[DEMO_PATCH], user="sglang-svc")
    two = inventory(sandbox, "two", {"t2": {"services": [svc], "monitoring": {"textfile_dir": "/var/lib/specops-tf"}}})
    # preparations first, in the order they run (each done stays done: a later attempt has none)
    try_faults(sandbox, h, ["keep-upstream", "run", "apt-install", "mkdir"], one, two, release1, before, TRIED)
    h.run("chmod", "0600", LAUNCHER)  # the launcher's content is right; its mode is not
    try_faults(sandbox, h, ["attrs"], one, two, release1, before, TRIED, drift_ok=("launch.py",))
    h.run("chmod", "0644", LAUNCHER)
    def no_timer(kind):
        """The timer this deploy made and enabled, started: none of it stays."""
        assert not h.path("/etc/systemd/system/timers.target.wants/specops-textfile.timer").is_symlink(), kind
        assert h.run("systemctl", "is-active", "specops-textfile.timer", check=False).stdout.strip() != "active", kind
    # the third write: two files are already renamed into place when it fails
    try_faults(sandbox, h, [("write", 1, False)], one, two, release1, before, TRIED)  # nothing replaced yet
    try_faults(sandbox, h, [("write", 3), "purge", "enable", "daemon-reload", "restart"], one, two, release1, before,
               TRIED, after=no_timer)
    res, _ = run_inv(sandbox, two, "deploy", "--host", "t2")  # and with no fault, release 2
    assert res.returncode == 0, res.stdout[-3000:]
    assert server_info(h)["speculative_num_steps"] == 2


@pytest.mark.reliability("apply-fault", "fault")
def test_faults_in_a_start_and_a_removal(sandbox):
    """A unit started that was stopped, and a file removed (an op no role has yet: a role of the
    test's own, run by the real deploy pipeline in-process)."""
    SCENARIOS.add("test_faults_in_a_start_and_a_removal")
    from support.site import role
    from specops.flows import pipeline
    from specops.ops import Absent
    import roles
    h = sandbox.reset("t4")
    one, release1, before = first_release(sandbox, h, "one", {"t4": {"services": [sandbox_service()]}})
    h.run("systemctl", "stop", "sglang")
    fault(h, "start-unit")
    res, rep = run_inv(sandbox, one, "deploy", "--host", "t4")
    assert fired(h) and res.returncode == 1 and "a fault injected on request" in rep["t4"]["error"], res.stdout
    assert unit_prop(h, "sglang", "ActiveState") == "inactive" and current(h) == release1  # as it was
    TRIED.append("start-unit")
    res, _ = run_inv(sandbox, one, "deploy", "--host", "t4")
    assert res.returncode == 0, res.stdout[-3000:]

    h.run("sh", "-c", "echo old > /etc/specops-leftover.conf")
    leftover = role("leftover", lambda host: [Absent("/etc/specops-leftover.conf")])
    release, then = current(h), serving(h)
    fault(h, "remove")
    reports, out = sandbox.apply(one, [*roles.DEPLOY, leftover], host="t4", body=pipeline.deploy)
    assert fired(h) and "a fault injected on request" in (reports[0].error or ""), out
    assert h.path("/etc/specops-leftover.conf").read_text() == "old\n"
    on_release(sandbox, h, one, release, then, restarted=False)  # it removed nothing: nothing restarted
    TRIED.append("remove")

    # node_exporter from the controller's .deb (a host with no mirror): failed, it is not installed
    deb = inventory(sandbox, "deb", {"t4": {"services": [sandbox_service()], "monitoring": True,
                                            "debs": str(aptrepo.DEBS)}})
    try_faults(sandbox, h, ["dpkg-install"], one, deb, current(h), serving(h), TRIED)
    assert h.run("dpkg-query", "-W", "prometheus-node-exporter", check=False).returncode != 0


@pytest.mark.reliability("apply-fault", "fault")
def test_faults_in_a_venvs_packages(sandbox, pkg_index):
    """pip into the venv the host manages itself, and the import check after it: the server is
    never restarted; what pip installed in place stays, and is said (a user's venv is not undone)."""
    SCENARIOS.add("test_faults_in_a_venvs_packages")
    h = sandbox.reset("t3")
    stack = lambda cuda: {"torch": {"version": "2.9.1", "cuda": cuda,  # noqa: E731
                                    "index_url": f"{pkg_index.url}/whl/{{variant}}"},
                          "fla": {"version": "0.6.0"}, "sglang": {"version": "0.5.23"},
                          "package_index": f"{pkg_index.url}/simple"}
    one, release1, before = first_release(sandbox, h, "one",
                                          {"t3": {"services": [sandbox_service()], **stack("cu128")}}, timeout=900)
    two = inventory(sandbox, "two", {"t3": {"services": [sandbox_service()], **stack("cu126")}})
    try_faults(sandbox, h, ["pip-install"], one, two, release1, before, TRIED)
    fault(h, "expect")
    res, rep = run_inv(sandbox, two, "deploy", "--host", "t3", timeout=900)
    assert fired(h) and res.returncode == 1, res.stdout[-3000:]
    assert "left in place (not undone): pip install" in rep["t3"]["error"], rep["t3"]["error"]
    assert serving(h)["invocation"] == before["invocation"]  # not restarted
    on_release(sandbox, h, one, release1, before, drift_ok=("packages",))
    TRIED.append("expect")


@pytest.fixture(scope="module")
def hub(fleet):
    h = hub_mod.Hub(fleet.site).start()
    yield h
    h.stop()


@pytest.mark.reliability("apply-fault", "fault")
def test_faults_in_a_stack_build_and_weights(sandbox, pkg_index, hub):
    """A new SGLang's stack built beside the one that serves, and new weights fetched from a hub
    or pushed from the controller into directories nothing serves from yet, then recorded."""
    SCENARIOS.add("test_faults_in_a_stack_build_and_weights")
    h = sandbox.reset("t5")
    stacks = {"venv": None}  # specops builds the host's stacks
    hosts = lambda version, svc: {"t5": {"services": [svc],  # noqa: E731
                                         "torch": {"version": "2.9.1", "cuda": "auto",
                                                   "index_url": f"{pkg_index.url}/whl/{{variant}}"},
                                         "sglang": {"version": version}, "package_index": f"{pkg_index.url}/simple"}}
    one, release1, before = first_release(sandbox, h, "one", hosts("0.5.23", sandbox_service()), stacks, timeout=900)
    two = inventory(sandbox, "two", hosts("0.5.24", sandbox_service()), stacks)
    try_faults(sandbox, h, ["build-stack"], one, two, release1, before, TRIED)
    copy = provision.controller_models() / "tiny-llama"
    pushed = sandbox_service(model_path="/models/tiny-llama-b", weights={"source": "controller", "path": str(copy)})
    three = inventory(sandbox, "three", hosts("0.5.23", pushed), stacks)
    try_faults(sandbox, h, ["record-weights"], one, three, release1, before, TRIED)
    fetched = sandbox_service(model_path="/models/tiny-llama-c",
                              weights={"source": "hf", "repo": "sandbox/tiny-llama", "revision": "main",
                                       "endpoint": hub.url})
    four = inventory(sandbox, "four", hosts("0.5.23", fetched), stacks)
    try_faults(sandbox, h, ["fetch-weights"], one, four, release1, before, TRIED)


def test_every_kind_of_action_has_a_fault_case():
    """Runs last in this file (pytest keeps a file's order): a kind added to the protocol without a
    case above fails here.  Preflight only asks (a refusal is tested where it is made)."""
    if len(SCENARIOS) < 4:
        pytest.skip(f"only {len(SCENARIOS)} of the 4 scenarios ran (-k, --lf)")
    changing = {k for k in protocol.ACTION_KINDS if k not in protocol.CHECK_KINDS}
    missing = changing - set(TRIED)
    assert not missing, f"no fault case for {sorted(missing)}"


@pytest.mark.reliability("switch-cut", "fault")
def test_a_switch_cut_off_between_two_renames_is_named_then_undone_first(sandbox):
    """The agent killed between two renames of a switch: `inv status` names the half-done switch,
    and the next `inv deploy` undoes it before anything else, says so, then deploys."""
    h = sandbox.reset("t3")
    one, release1, before = first_release(sandbox, h, "one",
                                          {"t3": {"services": [sandbox_service(speculative=spec(3, 4))]}})
    two = inventory(sandbox, "two",
                    {"t3": {"services": [sandbox_service(speculative=spec(2, 3), patches=[DEMO_PATCH])]}})
    fault(h, "write", how="kill", nth=2)
    res, rep = run_inv(sandbox, two, "deploy", "--host", "t3")
    assert fired(h) and res.returncode == 1, res.stdout[-3000:]
    assert h.run("test", "-e", "/var/lib/specops/apply.json", check=False).returncode == 0  # the journal stays
    status = sandbox.inv("status", "--host", "t3", inventory=one)
    said = status.stdout + status.stderr
    assert "was cut off in the middle of its switch" in said, said[-3000:]
    assert "the next run that takes the lock (a deploy, rollback, stop...) undoes it first" in said
    assert "HALF-DONE SWITCH of a deploy (cut off at: update /etc/systemd/system/sglang.service)" in status.stdout
    assert current(h) == release1

    res, rep = run_inv(sandbox, two, "deploy", "--host", "t3")
    assert res.returncode == 0, res.stdout[-3000:]
    lines = res.stdout.splitlines()
    undone = next(i for i, line in enumerate(lines)
                  if "undone before this run: 1 file(s) put back, restarted sglang" in line)
    assert not h.run("sh", "-c", "ls -d /etc/systemd/system/.specops-stage-* /opt/sglang/venv/lib/python3.11/"
                                 "site-packages/sglang/srt/models/.specops-stage-* 2>/dev/null", check=False).stdout
    assert undone < next(i for i, line in enumerate(lines) if "[1/" in line)  # before anything of this deploy
    assert server_info(h)["speculative_num_steps"] == 2 and current(h) != release1
    listing = sandbox.inv("releases", "--host", "t3", inventory=two).stdout
    assert "cut off during its switch (task deploy)" in listing, listing

    # Killed just after a rename: the step it began is done, and undone too, by any task that takes the lock.
    release2, unit2 = current(h), serving(h)["unit"]
    three = inventory(sandbox, "three", {"t3": {"services": [sandbox_service(speculative=spec(4, 5))]}})
    fault(h, "write", how="kill-after", nth=1)
    res, rep = run_inv(sandbox, three, "deploy", "--host", "t3")
    assert fired(h) and res.returncode == 1, res.stdout[-3000:]
    assert h.run("test", "-e", JOURNAL, check=False).returncode == 0
    res = sandbox.inv("stop", "--host", "t3", inventory=two)
    assert res.returncode == 0 and "undone before this run: 1 file(s) put back" in res.stdout + res.stderr, res.stdout
    assert (serving(h)["unit"] == unit2 and current(h) == release2
            and unit_prop(h, "sglang", "ActiveState") == "inactive")
