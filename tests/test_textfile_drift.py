"""The textfile's drift and run-in-progress figures against what a crashed run, a gone or
replaced managed file, a planted link or a FIFO leave (specops/agent/textfile.py).  No fleet."""
import json
import os

from specops import protocol
from specops.agent import textfile
from support.textfile import parse, release


def _written(tmp_path):
    """The textfile write() leaves in tmp_path/tf, parsed."""
    out = tmp_path / "tf"
    out.mkdir(exist_ok=True)
    textfile.write(protocol.Textfile(directory=str(out)))
    return parse((out / "specops.prom").read_text())


FILES_DRIFT = ("specops_drift", frozenset({("service", "sglang"), ("kind", "files")}))


def test_a_crashed_run_s_expired_lock_is_no_run_in_progress_and_a_live_one_is(tmp_path, monkeypatch):
    """Issue 49 (protective line 7): SpecopsDrift is silenced while specops_run_in_progress is 1.
    A lock whose lease ran out (its controller died) is held by no run: 0, and drift shows again;
    a lock renewed within its lease is 1."""
    release(tmp_path, monkeypatch)
    lock_dir = tmp_path / "lock"
    monkeypatch.setattr(textfile.lock, "LOCK_DIR", str(lock_dir))
    lock_dir.mkdir(mode=0o700)
    holder = {"who": "alice", "pid": 1, "task": "deploy", "token": "t", "lease": 60}
    (lock_dir / "holder.json").write_text(json.dumps(dict(holder, renewed=textfile.time.time() - 3600)))
    assert textfile.lock.peek()["held"] and textfile.lock.peek()["expired"]
    assert _written(tmp_path)[("specops_run_in_progress", frozenset())] == 0
    (lock_dir / "holder.json").write_text(json.dumps(dict(holder, renewed=textfile.time.time())))
    assert _written(tmp_path)[("specops_run_in_progress", frozenset())] == 1


def test_a_managed_file_gone_or_no_longer_a_regular_file_is_files_drift(tmp_path, monkeypatch):
    """Issue 49 (protective line 8): a managed file that cannot be read as the release's copy, because
    it is gone or because a directory stands in its place (unreadable as a file, even to root), is
    drift of kind files, not taken for a file that matches."""
    _, env = release(tmp_path, monkeypatch)
    assert _written(tmp_path)[FILES_DRIFT] == 0
    env.unlink()
    assert _written(tmp_path)[FILES_DRIFT] == 1
    env.mkdir()
    assert _written(tmp_path)[FILES_DRIFT] == 1


def test_a_managed_file_is_read_as_safefs_reads_no_link_followed_and_no_fifo_waited_on(tmp_path, monkeypatch):
    """Issue 49 (protective line 9): a link planted at a managed path, even to a copy of the release's
    bytes, is not the managed file: drift, not followed.  A FIFO planted there is drift too, found
    at once: the timer's refresh and a run's last request must not wait on it for a writer."""
    import threading
    _, env = release(tmp_path, monkeypatch)
    copy = tmp_path / "copy.env"
    copy.write_bytes(env.read_bytes())
    env.unlink()
    env.symlink_to(copy)
    assert _written(tmp_path)[FILES_DRIFT] == 1
    env.unlink()
    os.mkfifo(env)
    got = []
    writer = threading.Thread(target=lambda: got.append(_written(tmp_path)), daemon=True)
    writer.start()
    writer.join(timeout=10)
    hung = writer.is_alive()
    if hung:  # a reader blocked in open(): a writer that opens and closes lets it go (EOF)
        os.close(os.open(env, os.O_WRONLY | os.O_NONBLOCK))
        writer.join(timeout=10)
    assert not hung, "the textfile's write waited on a FIFO at a managed path"
    assert got[0][FILES_DRIFT] == 1
