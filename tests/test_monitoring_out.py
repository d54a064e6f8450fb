"""`inv monitoring --out DIR` as a writer (fleetwide/prometheus.py `write`): each file put in place
whole by a rename, so a running Prometheus never reads half of one."""
import os
from pathlib import Path

from roles import VOCABULARY
from specops import inventory
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
