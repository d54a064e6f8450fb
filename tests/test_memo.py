"""The controller's memo: what it keeps, and what it refuses to trust."""
import os
import shutil

import pytest

from specops import memo, owndir


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECOPS_MEMO", raising=False)
    monkeypatch.delenv("SPECOPS_NO_MEMO", raising=False)
    return tmp_path / "specops"


def counting():
    calls = []

    def compute():
        calls.append(1)
        return b"result %d" % len(calls)
    return compute, calls


def test_a_kept_result_is_not_computed_again(home):
    compute, calls = counting()
    assert memo.cached("k", "n", compute) == b"result 1"
    assert memo.cached("k", "n", compute) == b"result 1"
    assert len(calls) == 1
    assert oct(os.stat(home).st_mode & 0o777) == "0o700"
    assert oct(os.stat(home / "k" / "n").st_mode & 0o777) == "0o600"


def test_parts_are_length_prefixed_so_lists_of_parts_never_collide():
    assert memo.key("ab", "c") != memo.key("a", "bc")
    assert memo.key("a", "b") == memo.key(b"a", "b")


@pytest.mark.parametrize("mode", [0o777, 0o755], ids=["others-write", "others-read"])
def test_a_directory_others_can_write_turns_the_memo_off(home, mode):
    """0700 or nothing: others could change the entries (bytecode run as root), or read every kept
    entry (the review of issue 49: no test held the 0700 check)."""
    home.mkdir(mode=0o700)
    os.chmod(home, mode)
    compute, calls = counting()
    memo.cached("k", "n", compute)
    memo.cached("k", "n", compute)
    assert len(calls) == 2 and not (home / "k").exists()


def test_a_link_in_place_of_an_entry_is_never_followed(home, tmp_path):
    compute, calls = counting()
    memo.cached("k", "n", compute)
    target = tmp_path / "elsewhere"
    target.write_bytes(__import__("hashlib").sha256(b"planted").digest() + b"planted")  # a valid entry's form
    (home / "k" / "n").unlink()
    (home / "k" / "n").symlink_to(target)
    assert memo.get("k", "n") is None
    assert memo.cached("k", "n", compute) == b"result 2"
    assert target.read_bytes().endswith(b"planted")  # replaced the link, not written through it
    assert not (home / "k" / "n").is_symlink()


def test_a_linked_memo_directory_is_not_used(home, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    home.symlink_to(elsewhere)
    compute, calls = counting()
    memo.cached("k", "n", compute)
    memo.cached("k", "n", compute)
    assert len(calls) == 2 and not list(elsewhere.iterdir())


def test_specops_no_memo_computes_every_time(home, monkeypatch):
    monkeypatch.setenv("SPECOPS_NO_MEMO", "1")
    compute, calls = counting()
    memo.cached("k", "n", compute)
    memo.cached("k", "n", compute)
    assert len(calls) == 2 and not home.exists()


def test_entries_unused_for_max_age_go_when_a_new_one_is_written(home):
    memo.put("k", "old", b"x")
    old = home / "k" / "old"
    os.utime(old, (1, 1))
    memo.put("k", "new", b"y")
    assert not old.exists() and memo.get("k", "new") == b"y"


def test_the_unit_is_rendered_again_when_a_template_or_a_variable_changes(home, tmp_path, monkeypatch):
    from specops.ops import files
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "u.j2").write_text("ExecStart={{ x }}\n")
    monkeypatch.setattr(files, "TEMPLATES", templates)
    monkeypatch.setattr(files, "_jinja", None)
    assert files.render_kept("u.j2", x="a") == "ExecStart=a\n"
    assert files.render_kept("u.j2", x="b") == "ExecStart=b\n"
    (templates / "u.j2").write_text("ExecStart=/bin/{{ x }}\n")
    monkeypatch.setattr(files, "_jinja", None)
    assert files.render_kept("u.j2", x="a") == "ExecStart=/bin/a\n"


def test_the_agent_zip_is_built_again_when_one_of_its_files_changes(home, tmp_path, monkeypatch):
    from specops.remote import shipping
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.py").write_text("A = 1\n")
    monkeypatch.setattr(shipping, "HERE", tree)
    monkeypatch.setattr(shipping, "MEMBERS", ["a.py"])
    shipping.artifact.cache_clear()
    first = shipping.artifact()
    shipping.artifact.cache_clear()
    assert shipping.artifact() == first
    (tree / "a.py").write_text("A = 2\n")
    shipping.artifact.cache_clear()
    assert shipping.artifact()[1] != first[1]
    shipping.artifact.cache_clear()


def test_hosts_asking_at_once_compute_it_once(home):
    import threading
    import time
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.05)
        return b"r"
    threads = [threading.Thread(target=memo.cached, args=("k", "n", slow)) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1


def test_no_secret_of_the_env_file_reaches_the_memo(home):
    from specops.kinds import unitfile
    svc = {"name": "sglang", "api_key": "sk-hunter2-api", "env_secret": {"HF_TOKEN": "hf_hunter2_token"}}
    text = unitfile.env_text(svc)
    assert 'HF_TOKEN="hf_hunter2_token"' in text and "sk-hunter2-api" in text and "\0" not in text
    kept = [p.read_bytes() for p in home.rglob("*") if p.is_file()]
    assert kept and not any(b"hunter2" in data for data in kept)
    assert unitfile.env_text({**svc, "api_key": "sk-other"}).count("sk-other") == 1


def test_a_diff_is_computed_once_for_every_host_whose_file_is_the_same(monkeypatch):
    from specops.ops import base
    calls = []
    real = base._unified_diff
    monkeypatch.setattr(base, "_unified_diff", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(base, "_DIFFS", {})
    one = [base.unified_diff(b"a\n", b"b\n", "f.py") for _ in range(20)]
    assert len(calls) == 1 and "-a\n+b\n" in one[0]
    assert base.unified_diff(b"a\n", b"c\n", "f.py") != one[0]
    assert "g.py" in base.unified_diff(b"a\n", b"b\n", "g.py")
    assert base.unified_diff(None, b"b\n", "f.py") == real(None, b"b\n", "f.py")
    assert len(calls) == 4


def test_a_torn_entry_or_a_fifo_in_its_place_is_computed_again_without_blocking(home):
    compute, calls = counting()
    memo.cached("k", "n", compute)
    entry = home / "k" / "n"
    entry.write_bytes(entry.read_bytes()[:-3])  # a crash mid-write of an older specops, a full disk
    assert memo.cached("k", "n", compute) == b"result 2"
    entry.unlink()
    os.mkfifo(entry)
    assert memo.get("k", "n") is None  # O_NONBLOCK: no writer, no wait


def test_a_directory_above_the_memo_that_others_can_write_turns_it_off_unless_sticky(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("SPECOPS_MEMO", str(shared / "memo"))
    monkeypatch.delenv("SPECOPS_NO_MEMO", raising=False)
    os.chmod(shared, 0o777)  # anyone could swap the memo for a directory of theirs
    compute, calls = counting()
    memo.cached("k", "n", compute)
    memo.cached("k", "n", compute)
    assert len(calls) == 2 and not (shared / "memo").exists()
    os.chmod(shared, 0o1777)  # sticky, as /tmp: no one can rename what is ours
    memo.cached("k", "n", compute)
    memo.cached("k", "n", compute)
    assert len(calls) == 3


def test_a_kind_directory_that_is_a_link_or_open_to_others_is_not_used(home, tmp_path):
    memo.put("k", "n", b"x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (home / "k2").symlink_to(elsewhere)
    compute, calls = counting()
    memo.cached("k2", "n", compute)
    memo.cached("k2", "n", compute)
    assert len(calls) == 2 and not list(elsewhere.iterdir())
    os.chmod(home / "k", 0o755)
    assert memo.get("k", "n") is None


def test_a_group_writable_directory_above_the_memo_turns_it_off(tmp_path, monkeypatch):
    """Entries' sha256 covers their content, not their name: a group member who could swap one
    valid entry for another would choose the bytecode that runs as root."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o775)  # the group's, not the world's
    monkeypatch.setenv("SPECOPS_MEMO", str(shared / "memo"))
    monkeypatch.delenv("SPECOPS_NO_MEMO", raising=False)
    assert owndir.untrusted(shared) == f"{shared} is writable by others than its owner (mode 0775)"
    compute, calls = counting()
    memo.cached("k", "n", compute)
    memo.cached("k", "n", compute)
    assert len(calls) == 2 and not (shared / "memo").exists()


def test_a_file_planted_at_the_temporary_name_is_not_written_through(home, tmp_path):
    """O_EXCL: a hard link at the name (which O_NOFOLLOW does not see) or a symbolic one."""
    import threading
    memo.put("k", "first", b"x")  # the directories made
    target = tmp_path / "target"
    for plant in (os.link, os.symlink):
        target.write_bytes(b"untouched")
        tmp = home / "k" / f".n.{os.getpid()}.{threading.get_ident()}.tmp"
        plant(target, tmp)
        memo.put("k", "n", b"data")
        assert target.read_bytes() == b"untouched", plant
        assert memo.get("k", "n") is None  # not written: computed again next time
        tmp.unlink(missing_ok=True)


def test_a_link_before_a_dotdot_in_the_memo_path_turns_it_off(tmp_path, monkeypatch):
    """base/x/../y with x a link into a directory anyone can write: the kernel follows x before
    the `..`, so the memo would be made there; its path is checked as the kernel reads it."""
    base, anyones = tmp_path / "base", tmp_path / "anyones"
    base.mkdir(mode=0o700)
    (anyones / "sub").mkdir(parents=True)
    os.chmod(anyones, 0o777)
    (base / "x").symlink_to(anyones / "sub")
    monkeypatch.setenv("SPECOPS_MEMO", f"{base}/x/../y")
    monkeypatch.delenv("SPECOPS_NO_MEMO", raising=False)
    for y_too in (False, True):  # base/y/k there as well: what the text of the path names is trusted
        if y_too:
            shutil.rmtree(anyones / "y", ignore_errors=True)
            (base / "y").mkdir(mode=0o700)
            (base / "y" / "k").mkdir(mode=0o700)
        compute, calls = counting()
        memo.cached("k", "n", compute)
        memo.cached("k", "n", compute)
        assert len(calls) == 2 and os.listdir(anyones) == ["sub"], y_too
        assert owndir.untrusted(f"{base}/x/../y") == f"{base}/x is a link"
