"""Loaded into the specops process by the benchmark (PYTHONPATH): count SSH channels per host at
paramiko's Transport, independently of specops's own counters, and write them at exit."""
import atexit
import json
import os

import paramiko

_counts = {}
_open = paramiko.Transport.open_channel


def _counting(self, kind, *args, **kwargs):
    host = self.getpeername()[0] if self.sock else "?"
    _counts[host] = _counts.get(host, 0) + 1
    return _open(self, kind, *args, **kwargs)


paramiko.Transport.open_channel = _counting
atexit.register(lambda: open(os.environ["SPECOPS_BENCH_CHANNELS"], "w").write(json.dumps(_counts)))
