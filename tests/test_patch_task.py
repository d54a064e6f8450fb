"""`inv patch` as a user types it, parsed by invoke as `inv` parses it, against the real SGLang
0.5.21 and 0.5.23 wheels as the host's wheelhouse (sandbox/real_sglang, cached).  No host is
reached: its probe is stood in for (no stack built), so every file comes from the wheelhouse on
the controller, as it does for an air-gapped host whose new stack is still to be built."""
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from invoke import Program

import tasks
from specops import again
from sandbox import real_sglang
from specops.ops import Facts
from specops.run import HostRun
from specops.sglang import patchfile
from support import ROOT, seedpatch
from support.inventories import run_without_connecting

REL = seedpatch.REL
MERGE = "deepseek_v2.py.merge-0.5.23"


@pytest.fixture(scope="module")
def real():
    return {v: real_sglang.file_of(v, REL) for v in ("0.5.21", "0.5.23")}


@pytest.fixture
def box(tmp_path, monkeypatch):
    """An inventory of one host, `box`, that asks for sglang 0.5.23 and has the real wheels as its
    wheelhouse; its patches in tmp_path/patches.  The run's probe answers "no stack built"."""
    patches = tmp_path / "patches"
    (patches / REL).parent.mkdir(parents=True)
    (tmp_path / "inv").mkdir()
    (tmp_path / "inv" / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box": {
        "address": "127.0.0.1", "ssh_port": 9, "wheelhouse": str(real_sglang.wheels()),
        "sglang": {"version": "0.5.23"}, "torch": {"version": "2.9.1"}, "patch_dir": str(patches),
        "services": [{"name": "sglang", "model_path": "/m", "patches": [REL + ".patch"]}]}}}}))
    monkeypatch.setattr(HostRun, "probe", lambda self, ops, extra=None, lock=False: Facts({"stacks": []}))
    monkeypatch.chdir(tmp_path)
    return patches


def inv(capsys, *words):
    """`inv WORDS` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    try:
        Program(namespace=tasks.ns, binary="inv[oke]").run(["inv", *words])
        code = 0
    except SystemExit as e:
        code = e.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def cut(real, edited, version="0.5.21"):
    return patchfile.make(REL, real[version], edited, version, patchfile.upstream_sha256(real[version].encode()))


def patch(capsys, *words):
    return inv(capsys, "patch", "--inventory", "inv", "--host", "box", REL, *words)


def conflicted(real, box, capsys):
    """The seeds' conflicting patch, cut from 0.5.21 and rebased onto 0.5.23: its merge file."""
    (box / (REL + ".patch")).write_text(cut(real, seedpatch.conflicting(real["0.5.21"])))
    code, out, err = patch(capsys, "--rebase")
    assert code == 1 and "1 conflict(s)" in out + err, out + err
    return box / "srt/models" / MERGE, out + err


def resolved(merged: str, line: str) -> str:
    block = re.compile(r"<<<<<<< [^\n]*\n.*?>>>>>>> [^\n]*\n", re.S)
    return block.sub(lambda m: line, merged)


RESOLUTION = "            capture_gathered=None if self.layer_id < 0 else captured_last_layer_outputs,\n"


def test_a_merge_file_still_holding_its_conflict_markers_is_refused_and_the_patch_kept(real, box, capsys):
    """Issue 50, 7: `--edited` made a patch of the markers themselves, said it succeeded, and wrote
    it over the patch; now it is refused before connecting (a bad input: exit 2), naming the line."""
    merge, _ = conflicted(real, box, capsys)
    kept = (box / (REL + ".patch")).read_bytes()
    at = next(n for n, text in enumerate(merge.read_text().splitlines(), 1) if text.startswith("<<<<<<<"))
    code, out, err = patch(capsys, "--edited", str(merge))
    assert (code, out) == (2, ""), out + err
    assert err == (f"error: {merge}: line {at} is a conflict marker (<<<<<<< patched (sglang 0.5.21)): resolve "
                   f"each conflict, keeping no markers, then --edited it again; nothing written\n")
    assert (box / (REL + ".patch")).read_bytes() == kept
    assert sorted(p.name for p in (box / "srt/models").iterdir()) == sorted(["deepseek_v2.py.patch", MERGE])
    # resolved, it makes the patch the same edit made on 0.5.23 by hand cuts
    merge.write_text(resolved(merge.read_text(), RESOLUTION))
    code, out, err = patch(capsys, "--edited", str(merge))
    assert code == 0, out + err
    assert (box / (REL + ".patch")).read_text() == cut(real, seedpatch.resolve(real["0.5.23"]), "0.5.23")


@pytest.mark.parametrize("mistake, problem, wrong", [
    # a line left broken: it does not compile
    ((RESOLUTION, RESOLUTION.rstrip(",\n") + " if\n"), r"does not compile: line (\d+): ",
     "captured_last_layer_outputs if"),
    # a name 0.5.21 took out of DeepseekV2Model.forward: compiles, fails only when the line runs
    (("if embedding:\n            aux_hidden_states.append(hidden_states)\n",
      "if embedding:\n            aux_hidden_states.append(hidden_states + residual)\n"),
     r"would fail at run time on sglang 0.5.23: line (\d+): undefined name 'residual'", "hidden_states + residual"),
])
def test_an_edited_file_that_would_fail_is_refused_naming_its_line_and_the_patch_kept(real, box, capsys,
                                                                                       mistake, problem, wrong):
    """Issue 50, 8: `--edited` runs deploy's check (it compiles; pyflakes finds no name the
    unpatched file lacks) and refuses the file, naming the line; nothing is written, no temporary
    file is left."""
    merge, _ = conflicted(real, box, capsys)
    kept = (box / (REL + ".patch")).read_bytes()
    good = resolved(merge.read_text(), RESOLUTION)
    assert good.count(mistake[0]) == 1
    edited = good.replace(*mistake)
    merge.write_text(edited)
    code, out, err = patch(capsys, "--edited", str(merge))
    said = out + err
    assert code == 1, said
    m = re.search(rf"box +FAILED: refused {re.escape(str(merge))}, nothing written: .*{problem}", said)
    assert m, said
    assert wrong in edited.splitlines()[int(m.group(1)) - 1]
    assert (box / (REL + ".patch")).read_bytes() == kept
    assert sorted(p.name for p in (box / "srt/models").iterdir()) == sorted(["deepseek_v2.py.patch", MERGE])


def test_deploys_patch_check_refuses_a_diff_that_keeps_the_markers(real, box, capsys):
    """The review's finding 6: a diff made of the merge file as it is (by hand, not --edited) got
    `patches against sglang 0.5.23: ok` from `deploy --check` (patch_check, a stack not built).
    Its patched file does not compile: refused, naming a marker's line (the one Python stops at)."""
    from roles import VOCABULARY, patch_check
    from specops import cli
    merge, _ = conflicted(real, box, capsys)
    (box / (REL + ".patch")).write_text(cut(real, merge.read_text(), "0.5.23"))
    (host,) = cli.select(cli.Selection(inventory="inv", host="box"), VOCABULARY)
    with pytest.raises(patchfile.PatchError) as e:
        patch_check.ops(host)[0].plan(Facts({"stacks": []}), None)
    at = re.search(r"the patched file does not compile: line (\d+): ", str(e.value))
    assert at and re.match(r"(<{7}|\|{7}|={7}|>{7})( |$)", merge.read_text().splitlines()[int(at[1]) - 1]), e.value


def test_a_patch_is_written_whole_or_not_at_all(real, box, capsys, monkeypatch):
    """The new patch goes under another name first and is renamed over the old one: a write that
    fails (a full disk, here its fsync) leaves the old patch whole, and nothing beside it."""
    merge, _ = conflicted(real, box, capsys)
    merge.write_text(resolved(merge.read_text(), RESOLUTION))
    kept = (box / (REL + ".patch")).read_bytes()

    def full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    code, out, err = patch(capsys, "--edited", str(merge))
    assert code == 1 and "No space left on device" in out + err, out + err
    assert (box / (REL + ".patch")).read_bytes() == kept
    assert sorted(p.name for p in (box / "srt/models").iterdir()) == sorted(["deepseek_v2.py.patch", MERGE])


def test_a_rebase_removes_what_an_earlier_rebase_onto_the_same_version_wrote(real, box, capsys):
    """Issue 50, 9: a conflicting rebase left an earlier clean `.patch.0.5.23` beside its new
    `.merge-0.5.23` (which of the two is the rebase?); each outcome now removes the other's file."""
    diff = box / (REL + ".patch")
    diff.write_text(cut(real, seedpatch.capture(real["0.5.21"])))
    code, out, err = patch(capsys, "--rebase")
    assert code == 0, out + err
    assert sorted(p.name for p in diff.parent.iterdir()) == ["deepseek_v2.py.patch", "deepseek_v2.py.patch.0.5.23"]
    _, said = conflicted(real, box, capsys)
    assert sorted(p.name for p in diff.parent.iterdir()) == sorted(["deepseek_v2.py.patch", MERGE])
    assert " (removed deepseek_v2.py.patch.0.5.23, an earlier rebase's). Resolve them in " in said
    diff.write_text(cut(real, seedpatch.capture(real["0.5.21"])))
    code, out, err = patch(capsys, "--rebase")
    assert code == 0 and f"move it over deepseek_v2.py.patch (removed {MERGE}, an earlier rebase's)\n" in out, out
    assert sorted(p.name for p in diff.parent.iterdir()) == ["deepseek_v2.py.patch", "deepseek_v2.py.patch.0.5.23"]


def hint(said: str, before: str) -> list[str]:
    """The command a message names after `before`, as words."""
    return shlex.split(said.split(before, 1)[1].splitlines()[0].strip())


def test_the_hints_repeat_the_inventory_and_the_host_and_pasted_they_run(real, box, capsys, tmp_path,
                                                                         monkeypatch):
    """Issue 50, 1: `carry it onto sglang 0.5.24 with: inv patch --host sandbox ... --rebase`
    dropped the --inventory the user gave; pasted, it read another inventory, or none."""
    from roles import VOCABULARY, patch_check
    from specops import cli
    (box / (REL + ".patch")).write_text(cut(real, seedpatch.conflicting(real["0.5.21"])))
    (host,) = cli.select(cli.Selection(inventory="inv", host="box"), VOCABULARY)
    with pytest.raises(patchfile.HunkError) as e, again.chosen("inv"):  # as `inv deploy --inventory inv` runs
        patch_check.ops(host)[0].plan(Facts({"stacks": []}), None)
    words = hint(str(e.value), "carry it onto sglang 0.5.23 with: ")
    assert words == ["inv", "patch", "--inventory", "inv", "--host", "box", REL, "--rebase"]
    code, out, err = inv(capsys, *words[1:])
    assert code == 1 and f"Resolve them in {box / 'srt/models' / MERGE}" in out + err, out + err
    then = hint(out + err, "then: ")
    assert then == ["inv", "patch", "--inventory", "inv", "--host", "box", REL, "--edited",
                    str(box / "srt/models" / MERGE)]
    merge = box / "srt/models" / MERGE
    merge.write_text(resolved(merge.read_text(), RESOLUTION))
    code, out, err = inv(capsys, *then[1:])
    assert code == 0 and "a diff against sglang 0.5.23's" in out + err, out + err
    # no --inventory given (the default one, or $SPECOPS_INVENTORY's): a hint names none either
    with again.chosen(None):
        assert again.command("patch", REL, "--rebase", host="box") == f"inv patch --host box {REL} --rebase"

    # a patch that does not fit the file it names as its base: no merge starts; its edit is made again
    (box / (REL + ".patch")).write_text(patchfile.make(REL, real["0.5.23"], seedpatch.resolve(real["0.5.23"]),
                                                       "0.5.21", ""))
    code, out, err = patch(capsys, "--rebase")
    assert code == 1 and "does not apply to sglang 0.5.21's" in out + err, out + err
    fetch = shlex.split(re.search(r"make its edit on sglang 0\.5\.23's \((.*?) writes it\)", out + err).group(1))
    assert fetch == ["inv", "patch", "--inventory", "inv", "--host", "box", REL, "--fetch"], fetch
    code, out, err = inv(capsys, *fetch[1:])
    assert code == 0 and (tmp_path / "deepseek_v2.py").read_text() == real["0.5.23"], out + err


@pytest.mark.parametrize("args, said", [
    (["patch", REL, "--rebase"], "choose the hosts: --host NAME, --group NAME or --all (groups: gpu)"),
    (["patch", "--host", "nope", REL, "--rebase"], "unknown host 'nope' (known: a, b)"),
    (["patch", "--group", "gpu", REL, "--rebase"], "inv patch reads one host's SGLang: give --host"),
    (["patch", "--host", "a", REL], "give one of --fetch, --edited PATH, --rebase"),
    (["patch", "--host", "a", REL, "--edited", "/nonexistent/llama.py"], "/nonexistent/llama.py: cannot read it"),
    (["patch", "--host", "a", REL, "--edited", "{tmp}/merged.py"], "merged.py: line 2 is a conflict marker (<<<<<<<)"),
    # a resolution that took out every marker but one: diff3's base marker, or a conflict's end
    (["patch", "--host", "a", REL, "--edited", "{tmp}/base_left.py"],
     "base_left.py: line 3 is a conflict marker (||||||| sglang 0.5.21 (the patch's base))"),
    (["patch", "--host", "a", REL, "--edited", "{tmp}/end_left.py"],
     "end_left.py: line 3 is a conflict marker (>>>>>>> sglang 0.5.23)"),
    (["patch", "--host", "a", REL, "--edited", "{tmp}/latin1.py"], "latin1.py line 2: not UTF-8 text"),
    (["patch", "--host", "a", "../x.py", "--rebase"], "../x.py: name a file inside the sglang package"),
    (["patch", "--host", "a", REL, "--rebase", "--inventory", "/nonexistent"], "/nonexistent: inventory not found"),
])
def test_a_usage_error_is_one_line_and_exit_2_before_any_connection(tmp_path, args, said):
    """Issue 50, 1: no host, an unknown host, no --host ended in a Python traceback, exit 1.  An
    --edited file with any one conflict marker left, or not UTF-8, is one of these too (the compile
    check would find a marker only after connecting, exit 1)."""
    (tmp_path / "merged.py").write_text("x = 1\n<<<<<<<\nx = 2\n=======\nx = 3\n>>>>>>>\n")
    (tmp_path / "base_left.py").write_text("x = 1\nx = 2\n||||||| sglang 0.5.21 (the patch's base)\nx = 3\n")
    (tmp_path / "end_left.py").write_text("x = 1\nx = 2\n>>>>>>> sglang 0.5.23\nx = 3\n")
    (tmp_path / "latin1.py").write_bytes("x = 1\n# é\n".encode("latin-1"))
    res, attempts = run_without_connecting(tmp_path, """
        all:
          children:
            gpu:
              hosts:
                a: {{address: 127.0.0.1, ssh_port: {port}, connect_timeout: 2}}
                b: {{address: 127.0.0.1, ssh_port: {port}, connect_timeout: 2}}
        """, *(a.format(tmp=tmp_path) for a in args))
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], \
        res.stderr
    assert attempts == 0 and res.stdout == ""


@pytest.mark.skipif((ROOT / "inventory").exists(), reason="this clone has an inventory/ of its own")
def test_without_an_inventory_inv_patch_says_so_in_one_line():
    env = {k: v for k, v in os.environ.items() if k != "SPECOPS_INVENTORY"}
    res = subprocess.run([sys.executable, "-m", "invoke", "patch", "--host", "sandbox", REL, "--rebase"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert (res.returncode, res.stdout) == (2, ""), res.stderr
    assert res.stderr.startswith("error: no inventory: give -i DIR|FILE") and res.stderr.count("\n") == 1


def test_help_is_shown_wherever_help_is_asked_for():
    """Issue 50, 10: `inv patch --help` took --help for FILE and said "give one of --fetch, ...",
    exit 2; as other tasks, it shows the task's help, exit 0, wherever --help stands."""
    def inv(*words):
        return subprocess.run([sys.executable, "-m", "invoke", *words], cwd=ROOT, capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
    shown = inv("--help", "patch")
    assert shown.returncode == 0 and "Docstring:" in shown.stdout and "--rebase" in shown.stdout, shown.stderr
    for words in (["patch", "--help"], ["patch", "--host", "x", "--help"], ["patch", REL, "--help"],
                  ["patch", "--help", "--host", "x", "--rebase"], ["patch", "-h", "x", "--edited", "y", "--help"],
                  # where an option's value goes: invoke gives it the next word, --help too
                  ["patch", REL, "--edited", "--help"], ["patch", REL, "-i", "--help", "--fetch"],
                  ["patch", REL, "--host", "--help", "--fetch"]):
        res = inv(*words)
        assert (res.returncode, res.stdout, res.stderr) == (0, shown.stdout, ""), words
    res = inv("patch", "--help", REL)  # FILE after --help: invoke's parser gave --help FILE's place
    assert (res.returncode, res.stdout, res.stderr) == (0, shown.stdout, ""), res.stderr
