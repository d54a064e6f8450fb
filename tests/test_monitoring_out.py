"""`inv monitoring --out DIR` as a writer (fleetwide/prometheus.py `write`): each file put in place
whole by a rename, so a running Prometheus never reads half of one; and only into a directory no
one but the user and root can change."""
import os
import threading
from pathlib import Path

import pytest

from roles import VOCABULARY
from specops import inventory
from specops.errors import SpecopsError, UsageError
from specops.fleetwide import prometheus

EXAMPLE = Path(__file__).resolve().parent.parent / "inventory.example"


def test_each_file_is_put_in_place_whole_by_a_rename(tmp_path, monkeypatch):
    """A reader that opened the old file reads it whole; the new one is a new file, complete when
    it takes the name."""
    inv = inventory.load(EXAMPLE, VOCABULARY)
    out = tmp_path / "prom"
    prometheus.write(inv, out, "15s")
    held = {p: (open(p, "rb"), p.read_bytes(), p.stat().st_ino) for p in out.rglob("*") if p.is_file()}
    renamed = []
    for name in ("rename", "replace"):
        def put(src, dst, real=getattr(os, name)):
            renamed.append((str(dst), Path(src).read_bytes()))  # what takes the name, as it is then
            real(src, dst)
        monkeypatch.setattr(os, name, put)
    texts, _ = prometheus.files(inv, "30s", out=out)
    prometheus.write(inv, out, "30s")
    monkeypatch.undo()
    assert sorted(renamed) == sorted((str(out / rel), text.encode()) for rel, text in texts.items())
    assert b"30s" in (out / prometheus.CONFIG).read_bytes()
    for path, (f, old, inode) in held.items():
        with f:
            assert f.read() == old, path
        assert path.stat().st_ino != inode, path


def _write(out):
    return prometheus.write(inventory.load(EXAMPLE, VOCABULARY), out, "15s")


def test_a_directory_others_can_write_is_refused_and_a_link_planted_in_it_not_followed(tmp_path):
    """The review's reproduction: a link at the temporary name in a 0777 directory had its
    target overwritten with the configuration."""
    shared, target = tmp_path / "shared", tmp_path / "target"
    shared.mkdir()
    os.chmod(shared, 0o777)
    target.write_text("untouched")
    planted = {f".prometheus.yml.{os.getpid()}.tmp", f".prometheus.yml.{os.getpid()}.{threading.get_ident()}.tmp"}
    for name in planted:
        (shared / name).symlink_to(target)
    with pytest.raises(UsageError, match=rf"^--out {shared}: {shared} is writable by others than its owner "
                                         r"\(mode 0777\): nothing written \(only into a directory no one but "
                                         r"you and root can change\)$"):
        _write(shared)
    assert target.read_text() == "untouched" and set(os.listdir(shared)) == planted
    with pytest.raises(UsageError, match=f"{shared} is writable by others"):
        _write(shared / "new" / "prom")  # nothing made where anyone could have put a link first
    assert set(os.listdir(shared)) == planted


@pytest.mark.parametrize("mode", [0o775, 0o1777], ids=["group-writable", "sticky"])
def test_dir_writable_by_others_is_refused_sticky_too_but_a_sticky_directory_above_it_is_not(tmp_path, mode):
    out = tmp_path / "prom"
    out.mkdir()
    os.chmod(out, mode)
    with pytest.raises(UsageError, match=f"--out {out}: {out} is writable by others than its owner"):
        _write(out)
    assert os.listdir(out) == []
    os.chmod(out, 0o755)
    os.rename(out, tmp_path / "sticky")
    os.chmod(tmp_path / "sticky", 0o1777)  # as /tmp: no one else can rename or remove what is ours in it
    written, _ = _write(tmp_path / "sticky" / "prom")
    assert len(written) == 7


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's directory is made with chown, as root")
def test_a_directory_of_another_user_is_refused_dir_or_one_of_its_own(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(UsageError, match=f"^--out {theirs}: {theirs} is another user's \\(uid 65534\\): "):
        _write(theirs)
    assert os.listdir(theirs) == []
    ours = tmp_path / "ours"
    (ours / "targets").mkdir(parents=True)  # made by someone else, who would rewrite the targets afterwards
    os.chown(ours / "targets", 65534, 65534)
    with pytest.raises(UsageError, match=f"--out {ours}: {ours / 'targets'} is another user's"):
        _write(ours)
    assert [p for p in ours.rglob("*") if not p.is_dir()] == []  # no file, before or after the refusal


def test_a_link_before_a_dotdot_is_refused_and_a_plain_dotdot_followed(tmp_path, monkeypatch):
    anyones = tmp_path / "anyones"
    (anyones / "sub").mkdir(parents=True)
    os.chmod(anyones, 0o777)
    (tmp_path / "x").symlink_to(anyones / "sub")
    with pytest.raises(UsageError, match=f"{tmp_path / 'x'} is a link"):
        _write(f"{tmp_path}/x/../prom")  # the kernel reads it as anyones/prom
    assert os.listdir(anyones) == ["sub"]
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    written, _ = _write("../prom")
    assert (tmp_path / "prom" / "prometheus.yml").is_file() and str(written[0]).startswith("../prom/")


def test_a_file_at_a_temporary_name_in_dir_is_not_written_through_and_the_run_fails(tmp_path):
    out, target = tmp_path / "prom", tmp_path / "target"
    out.mkdir()
    target.write_text("untouched")
    for plant in (os.link, os.symlink):
        tmp = out / f".prometheus.yml.{os.getpid()}.{threading.get_ident()}.tmp"
        plant(target, tmp)
        with pytest.raises(SpecopsError, match=f"^--out {out}: .*File exists: '{tmp}'$"):
            _write(out)
        assert target.read_text() == "untouched" and not (out / "prometheus.yml").exists(), plant
        tmp.unlink()
    written, _ = _write(out)
    assert {p.stat().st_mode & 0o133 for p in written} == {0}  # 0644, less the umask: writable by the user only


def test_a_link_planted_at_a_missing_name_after_the_check_is_never_followed(tmp_path, monkeypatch):
    """The race a local user can run (review of issue 49): the check passes for the directory
    above, then a link takes the missing name before mkdir: nothing is made where it points,
    and the link is refused.  A directory someone else made there first is refused too."""
    from specops import owndir
    base, elsewhere = tmp_path / "base", tmp_path / "elsewhere"
    base.mkdir(mode=0o755)
    elsewhere.mkdir()
    checked = owndir.untrusted

    def then_plant(path, sticky=True):
        why = checked(path, sticky)
        if Path(path) == base and not os.path.lexists(base / "race"):
            os.symlink(elsewhere, base / "race")
        return why
    monkeypatch.setattr(owndir, "untrusted", then_plant)
    with pytest.raises(OSError):
        owndir.make(base / "race" / "prom", 0o755)
    assert list(elsewhere.iterdir()) == []
    monkeypatch.undo()
    if os.geteuid() == 0:  # another user's directory at the name: refused, nothing made inside
        (base / "race").unlink()
        theirs = base / "theirs"

        def then_make(path, sticky=True):
            why = checked(path, sticky)
            if Path(path) == base and not theirs.exists():
                theirs.mkdir()
                os.chown(theirs, 65534, 65534)
            return why
        monkeypatch.setattr(owndir, "untrusted", then_make)
        assert owndir.make(theirs / "prom", 0o755) == f"{theirs} is another user's (uid 65534)"
        assert list(theirs.iterdir()) == []


def test_files_and_directories_are_not_writable_by_others_whatever_the_umask(tmp_path):
    """0644 files and 0755 directories asked of the kernel, so a umask of 0 gives the same."""
    inv = inventory.load(EXAMPLE, VOCABULARY)
    old = os.umask(0)
    try:
        prometheus.write(inv, tmp_path / "prom", "15s")
    finally:
        os.umask(old)
    modes = {p: p.stat().st_mode & 0o777 for p in (tmp_path / "prom").rglob("*")}
    assert modes and all(m == (0o755 if p.is_dir() else 0o644) for p, m in modes.items()), modes
