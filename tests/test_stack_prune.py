"""Which stacks a release pruning keeps: the agent's own code (specops/agent/releases.py,
converge/stacks.py) on a directory of the test's (tests/conftest.py's agent_dirs).  No fleet."""
import json
import os


def release(rel, st, stamp, venv, status="deployed"):
    d = rel / stamp
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"stamp": stamp, "status": status,
                                                 "venv": str(st / venv) if venv else None}))


def make_stack(st, name):
    (st / name).mkdir()
    (st / name / "specops-stack.json").write_text("{}")


def test_pruning_keeps_every_stack_a_kept_release_names(agent_dirs):
    releases, stacks, rel, st = agent_dirs
    a, b, c = "a" * 16, "b" * 16, "c" * 16
    for name in (a, b, c):
        make_stack(st, name)
    release(rel, st, "r01", c)
    for i in range(2, 7):
        release(rel, st, f"r0{i}", b)       # r06: the deployed release before current
    release(rel, st, "r07", a)              # current
    for i in range(8, 14):                  # newer attempts, undone (a rollback never goes to one)
        release(rel, st, f"r{i:02d}", None, status="rolled-back")
    os.symlink("r07", rel / "current")
    releases._prune()
    assert sorted(os.listdir(st)) == [a, b]  # c: its release went
    # the newest 5 deployed, and apart from them the newest 5 attempts: these never push those out
    assert sorted(n for n in os.listdir(rel) if n != "current") == [
        "r03", "r04", "r05", "r06", "r07", "r09", "r10", "r11", "r12", "r13"]


def test_a_release_that_cannot_be_read_stops_pruning(agent_dirs):
    releases, stacks, rel, st = agent_dirs
    make_stack(st, "a" * 16)
    make_stack(st, "b" * 16)
    release(rel, st, "r1", "a" * 16)
    (rel / "r2").mkdir()
    (rel / "r2" / "manifest.json").write_text("{half")  # it might name b: b stays
    os.symlink("r1", rel / "current")
    releases._prune()
    assert sorted(os.listdir(st)) == ["a" * 16, "b" * 16]


def test_a_stack_without_its_file_or_outside_the_directory_is_never_pruned(agent_dirs, monkeypatch, tmp_path):
    releases, stacks, rel, st = agent_dirs
    units = tmp_path / "units"
    units.mkdir()
    monkeypatch.setattr(stacks, "UNIT_DIR", str(units))
    make_stack(st, "c" * 16)
    (units / "x.service").write_text(f"[Service]\nExecStart={st / ('c' * 16)}/bin/python -m x\n")
    make_stack(st, "a" * 16)
    (st / ("b" * 16)).mkdir()               # not a complete stack of ours (no specops-stack.json)
    (st / "mine").mkdir()                   # not a stack's name
    release(rel, st, "r1", "a" * 16)
    os.symlink("r1", rel / "current")
    assert stacks.prune({str(st / ("z" * 16))}) == [str(st / ("a" * 16))]
    assert sorted(os.listdir(st)) == ["b" * 16, "c" * 16, "mine"]  # c: a unit file runs it
