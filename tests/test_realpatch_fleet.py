"""The seeds' capture patch, cut from SGLang 0.5.21's real `deepseek_v2.py`, carried onto a host
whose new stack (the simulator's 0.5.26, which carries 0.5.23's real file) is not built yet: a
variant with a run-time name error refused before anything moves, a real conflict refused, then
rebased, resolved, made a patch with `--edited` and deployed; the clean patch rebased and
applied; and the same rebase on an air-gapped host, from its wheelhouse alone.

The rebase's base comes from the real 0.5.21 wheel on the sandbox index (read by range requests
on the host); the new file from the 0.5.26 wheel, or its stack once built."""
import re
import socket
import threading

import pytest

from sandbox import fleet, provision, real_sglang
from specops.sglang import patchfile, stack
from support import seedpatch
from support.hosts import sha256_on

pytestmark = pytest.mark.fleet
REL = seedpatch.REL
NEW = "0.5.26"  # the simulator release that carries the real 0.5.23 deepseek_v2.py
REAL = {v: real_sglang.file_of(v, REL) for v in ("0.5.21", "0.5.23")}
UNIT = "/etc/systemd/system/sglang.service"


def cut(edited, version="0.5.21"):
    return patchfile.make(REL, REAL[version], edited, version, patchfile.upstream_sha256(REAL[version].encode()))


def host_vars(index, version, patch_dir, patches=()):
    return {"services": [provision.sandbox_service(patches=list(patches))], "sglang": {"version": version},
            "torch": {"version": "2.9.1", "cuda": "auto", "index_url": f"{index.url}/whl/{{variant}}"},
            "package_index": f"{index.url}/simple", "patch_dir": str(patch_dir)}


def run(sandbox, hv, *args, task="deploy"):
    inv = sandbox.inventory({"t5": hv}, group_vars={"venv": None})
    res = sandbox.inv(task, "--host", "t5", *args, inventory=inv, timeout=600)
    return res, res.stdout + res.stderr


def installed(h, hv):
    return h.path(f"{stack.venv_of(hv)}/lib/python3.11/site-packages/sglang/{REL}").read_text()


@pytest.fixture
def patches(tmp_path):
    root = tmp_path / "patches"
    (root / REL).parent.mkdir(parents=True)
    return root


def test_a_real_conflict_is_resolved_and_deployed_onto_a_stack_never_built(sandbox, pkg_index, patches, tmp_path):
    h = sandbox.reset("t5")
    res, out = run(sandbox, host_vars(pkg_index, "0.5.23", patches))
    assert res.returncode == 0 and "sglang verified" in out, out[-3000:]
    hv = host_vars(pkg_index, NEW, patches, [REL + ".patch"])
    new_stack = stack.venv_of(hv)
    before = sha256_on(h, UNIT)
    diff = patches / (REL + ".patch")

    # 1. the variant that compiles but names `residual`, which 0.5.21 took out: refused before anything moves
    diff.write_text(cut(seedpatch.capture(REAL["0.5.21"], residual=True)))
    patched = patchfile.apply(diff.read_text(), REAL["0.5.23"], REL, NEW)
    line = next(n for n, t in enumerate(patched.splitlines(), 1) if "hidden_states + residual" in t)
    res, out = run(sandbox, hv)
    assert res.returncode == 1, out[-3000:]
    assert f"would fail at run time on sglang {NEW}: line {line}: undefined name 'residual'" in out, out[-3000:]
    assert not h.path(new_stack).exists() and sha256_on(h, UNIT) == before
    res, out = run(sandbox, hv, REL, "--rebase", task="patch")  # a clean merge, and still refused
    assert res.returncode == 1, out[-3000:]
    assert (f"wrote {diff}.{NEW}, but it must not be used as it is: patch sglang/{REL}.patch: the patched file "
            f"would fail at run time on sglang {NEW}: line {line}: undefined name 'residual'") in out, out[-3000:]

    # 2. a genuinely conflicting edit: refused naming the hunk, nothing built
    diff.write_text(cut(seedpatch.conflicting(REAL["0.5.21"])))
    res, out = run(sandbox, hv)
    assert res.returncode == 1, out[-3000:]
    # no --inventory given ($SPECOPS_INVENTORY chose it): none in the command, which, pasted there, reads the same
    assert (f"hunk 1 of 3 (@@ -2724,7 +2724,7 @@) does not apply to sglang {NEW}'s {REL} (cut from sglang 0.5.21); "
            f"carry it onto sglang {NEW} with: inv patch --host t5 {REL} --rebase") in out, out[-3000:]
    assert not h.path(new_stack).exists() and sha256_on(h, UNIT) == before

    # 3. --rebase: the base from the real 0.5.21 wheel, the new file from 0.5.26's, both on the index
    res, out = run(sandbox, hv, REL, "--rebase", task="patch")
    assert res.returncode == 1, out[-3000:]
    merge = patches / "srt/models" / f"deepseek_v2.py.merge-{NEW}"
    assert (f"1 conflict(s) rebasing deepseek_v2.py.patch from sglang 0.5.21 onto {NEW}: hunk 1 of 3 "
            f"(@@ -2724,7 +2724,7 @@) against sglang {NEW}'s line 2810") in out, out[-3000:]
    merged = merge.read_text()
    assert "||||||| sglang 0.5.21 (the patch's base)\n" in merged and merged.count("<<<<<<< ") == 1

    # 4. resolved by hand, made a patch with --edited: the stack is still not built (the dead end was here)
    block = re.compile(r"<<<<<<< [^\n]*\n.*?>>>>>>> [^\n]*\n", re.S)
    merge.write_text(block.sub(lambda m: "            capture_gathered=None if self.layer_id < 0 else "
                                         "captured_last_layer_outputs,\n", merged))
    res, out = run(sandbox, hv, REL, "--edited", str(merge), task="patch")
    assert res.returncode == 0, out[-3000:]
    assert f"a diff against sglang {NEW}'s {REL}" in out
    assert patchfile.base_of(diff.read_text()) == patchfile.Base(
        NEW, patchfile.upstream_sha256(REAL["0.5.23"].encode()))
    assert not h.path(new_stack).exists()

    # 5. deploy: the new stack built, the patch applied to its real file, verified; then nothing to change
    res, out = run(sandbox, hv)
    assert res.returncode == 0 and "sglang verified" in out, out[-3000:]
    assert installed(h, hv) == seedpatch.resolve(REAL["0.5.23"])
    assert f"{new_stack}/bin/python" in h.path(UNIT).read_text()
    res, out = run(sandbox, hv, "--json", str(tmp_path / "second.json"))
    assert res.returncode == 0 and '"changed": 0' in (tmp_path / "second.json").read_text(), out[-3000:]

    # 6. the seeds' patch itself, cut from 0.5.21: rebased clean onto the built stack's real file,
    #    equal to the same edit made there by hand, and applied
    diff.write_text(cut(seedpatch.capture(REAL["0.5.21"])))
    res, out = run(sandbox, hv, REL, "--rebase", task="patch")
    assert res.returncode == 0, out[-3000:]
    rebased = diff.with_name(diff.name + f".{NEW}")
    by_hand = seedpatch.capture(REAL["0.5.23"])
    assert patchfile.apply(rebased.read_text(), REAL["0.5.23"], REL, NEW) == by_hand
    rebased.replace(diff)
    res, out = run(sandbox, hv)
    assert res.returncode == 0 and "sglang verified" in out, out[-3000:]
    assert installed(h, hv) == by_hand


class _Canary:
    """Listens where a host that asked the public index would land (pypi.org, mapped in the host's
    /etc/hosts to this address), and counts who came."""

    def __init__(self, address):
        self.socks, self.came = [], []
        for port in (80, 443):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, port))
            s.listen(8)
            s.settimeout(0.2)
            self.socks.append(s)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        while not self.stop.is_set():
            for s in self.socks:
                try:
                    conn, peer = s.accept()
                    self.came.append(peer)
                    conn.close()
                except OSError:
                    pass

    def close(self):
        self.stop.set()
        self.thread.join(5)
        for s in self.socks:
            s.close()


def test_an_air_gapped_host_rebases_from_its_wheelhouse_and_one_with_no_source_is_refused(
        sandbox, pkg_index, patches, tmp_path):
    h = sandbox.reset("t5")
    wheelhouse = tmp_path / "wheelhouse"
    provision.sim_wheel(wheelhouse, NEW)
    (wheelhouse / real_sglang.wheel("0.5.21").name).symlink_to(real_sglang.wheel("0.5.21"))
    address = fleet.service_address(sandbox.fleet.site)
    h.path("/etc/hosts").write_text(h.path("/etc/hosts").read_text() + f"{address} pypi.org files.pythonhosted.org\n")
    diff = patches / (REL + ".patch")
    diff.write_text(cut(seedpatch.capture(REAL["0.5.21"])))
    canary = _Canary(address)
    try:
        # a wheelhouse and no index at all: the controller reads the wheelhouse; nothing is asked of an index
        gapped = {**host_vars(pkg_index, NEW, patches, [REL + ".patch"]), "wheelhouse": str(wheelhouse)}
        del gapped["package_index"], gapped["torch"]["index_url"]
        res, out = run(sandbox, gapped, REL, "--rebase", task="patch")
        assert res.returncode == 0, out[-3000:]
        rebased = diff.with_name(diff.name + f".{NEW}")
        assert patchfile.apply(rebased.read_text(), REAL["0.5.23"], REL, NEW) == seedpatch.capture(REAL["0.5.23"])
        # neither a wheelhouse nor a reachable index: one clear line, and no other index asked
        dead = {**host_vars(pkg_index, NEW, patches, [REL + ".patch"]), "package_index": f"http://{address}:9/simple"}
        res, out = run(sandbox, dead, REL, "--rebase", task="patch")
        assert res.returncode == 1, out[-3000:]
        assert (f"t5: cannot read sglang {NEW}'s {REL}: http://{address}:9: unreachable "  # scheme and host alone
                f"(Connection refused)") in out, out[-3000:]
        res, out = run(sandbox, dead)  # the deploy's check says the same, before anything moves
        assert res.returncode == 1 and f"http://{address}:9: unreachable (Connection refused)" in out
        assert not h.path(stack.venv_of(dead)).exists()
    finally:
        canary.close()
    assert canary.came == []


def test_the_file_under_a_whole_file_patch_is_read_from_its_wheel_and_must_be_the_one_installed(
        sandbox, pkg_index, patches, tmp_path):
    """A whole-file patch keeps no upstream copy: `--edited` reads the file from the version's
    wheel, and refuses one whose sha256 is not what the installed package's RECORD says."""
    import shutil
    llama = "srt/models/llama.py"
    (patches / llama).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(provision.HERE.parent / "files" / "patches" / llama, patches / llama)
    sandbox.reset("t5")
    hv = host_vars(pkg_index, "0.5.23", patches, [llama])
    res, out = run(sandbox, hv)
    assert res.returncode == 0 and "sglang verified" in out, out[-3000:]
    upstream = (provision.SIM_SRC / "sglang" / llama).read_text()
    edited = tmp_path / "llama.py"
    edited.write_text(upstream.replace('MODEL_CODE = "upstream"', 'MODEL_CODE = "patched: mine"'))
    res, out = run(sandbox, hv, llama, "--edited", str(edited), task="patch")
    assert res.returncode == 0, out[-3000:]
    made = (patches / (llama + ".patch")).read_text()
    assert patchfile.base_of(made) == patchfile.Base("0.5.23", patchfile.upstream_sha256(upstream.encode()))
    assert patchfile.apply(made, upstream, llama, "0.5.23") == edited.read_text()
    # a wheel of that version with another file than the one installed: refused, naming both
    house = tmp_path / "house"
    other = provision.sim_wheel(house, "0.5.24")
    other.rename(house / other.name.replace("0.5.24", "0.5.23"))
    res, out = run(sandbox, {**hv, "wheelhouse": str(house)}, llama, "--edited", str(edited), task="patch")
    assert res.returncode == 1, out[-3000:]
    assert re.search(rf"t5: sglang 0.5.23's wheel has another {llama} \(sha256 \w+…\) than the one installed in "
                     rf"{stack.venv_of(hv)} \(\w+…\)", out), out[-3000:]
