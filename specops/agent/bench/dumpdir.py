"""A traffic sample's directory on the host: TRAFFIC_DIR/<service>.<random>/ (root's, 0700), a chunk
directory dN in it for each dump file the server writes, the files read as they are whole
(dumpfile.py), and the sample made of them (sample.json, 0600); and the removal of a service's
samples, however a run ended."""
import json
import os
import pickle
import secrets
import shutil
import time

from specops import protocol
from specops.agent import safefs
from specops.agent.bench import dumpfile
from specops.agent.host import ActionError, sha256
from specops.layout import TRAFFIC_DIR

SETTLE = 10.0     # seconds a file that does not load yet may still be being written
SAMPLE = "sample.json"


def remove_samples(name):
    """Every sample directory of service `name` (specops's: in its root-only TRAFFIC_DIR); whether any was there."""
    try:
        fd, _ = safefs.open_dir(TRAFFIC_DIR)
    except safefs.Missing:
        return False
    try:
        found = [n for n in os.listdir(fd) if n.startswith(name + ".")]
    finally:
        os.close(fd)
    for n in found:
        shutil.rmtree(os.path.join(TRAFFIC_DIR, n))  # fd-based: a link in it is removed, never followed
    return bool(found)


def truncated(error):
    """Whether a load failed because the file ends early (still being written), not because of what is in it."""
    return isinstance(error, EOFError) or "truncated" in str(error)


class Reader:
    """The dump files of one sample, read as they are whole.  `since`: the wall-clock time the dump
    was turned on; a request that finished before it was held by the server from an earlier dump
    (SGLang keeps what it held when a dump went off) and is not this traffic's."""

    def __init__(self, name, since):
        safefs.make_dir(TRAFFIC_DIR, 0o700, 0, 0, parents=True)
        self.path = "%s/%s.%s" % (TRAFFIC_DIR, name, secrets.token_hex(4))
        safefs.make_dir(self.path, 0o700, 0, 0)
        self.since, self.requests, self.files, self.stale, self.pending = since, [], 0, 0, {}
        self.chunks = 0

    def next_chunk(self):
        """A fresh chunk directory for the server's next file (two files of one second would share a name)."""
        d = "%s/d%d" % (self.path, self.chunks)
        safefs.make_dir(d, 0o700, 0, 0)
        self.chunks += 1
        return d

    def _chunk_dirs(self, fd):
        return sorted((n for n in os.listdir(fd) if n[:1] == "d" and n[1:].isdigit()), key=lambda n: int(n[1:]))

    def written(self):
        """Whether the newest chunk directory holds a file yet."""
        if not self.chunks:
            return False
        fd, _ = safefs.open_dir("%s/d%d" % (self.path, self.chunks - 1))
        try:
            return bool(os.listdir(fd))
        finally:
            os.close(fd)

    def poll(self, final=False):
        """Read each whole file; one still truncated after SETTLE seconds (or at the end, `final`),
        or one that is not a dump, refuses the sample."""
        fd, _ = safefs.open_dir(self.path)
        try:
            for chunk in self._chunk_dirs(fd):
                cfd = os.open(chunk, safefs.O_DIR, dir_fd=fd)
                try:
                    for name in sorted(os.listdir(cfd)):
                        self._read(cfd, name, "%s/%s/%s" % (self.path, chunk, name), final)
                finally:
                    os.close(cfd)
        finally:
            os.close(fd)

    def _read(self, cfd, name, where, final):
        try:
            requests = dumpfile.load(dumpfile.read(cfd, name, where), where)
        except (EOFError, pickle.UnpicklingError) as e:
            first = self.pending.setdefault(where, time.monotonic())
            if not truncated(e) or final or time.monotonic() - first > SETTLE:
                raise dumpfile.Refused("%s: not a whole pickle of a dump (%s)" % (where, e)) from None
            return
        os.unlink(name, dir_fd=cfd)  # read: only its prompts are kept
        self.pending.pop(where, None)
        self.files += 1
        for fields, _out, created, finished in requests:
            if finished < self.since:
                self.stale += 1
            else:  # the answer is never kept
                self.requests.append((fields, created, finished))

    def sample(self, ended, fetch):
        """sample.json from what was read, and what the controller is told of it."""
        prompts, skipped, ids = [], 0, 0
        for fields, _created, _finished in self.requests:
            made = dumpfile.prompts(fields)
            skipped += not made
            ids += sum("input_ids" in p for p in made)
            prompts += made
        if not prompts:
            raise ActionError(
                "traffic: no request with text or token ids was dumped%s"
                % (" in the time given: more time (--traffic-wait), or traffic" if ended == "time" else "")
            )
        data = json.dumps(prompts).encode()
        fd = os.open(self.path + "/" + SAMPLE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        times = [t for r in self.requests for t in r[1:]]
        return protocol.TrafficSample(path=self.path + "/" + SAMPLE, sha256=sha256(data).hexdigest(),
                                      requests=len(prompts), bytes=len(data), first=min(times) if times else None,
                                      last=max(times) if times else None, files=self.files, ended=ended,
                                      skipped=skipped, token_ids=ids, stale=self.stale,
                                      prompts=prompts if fetch else None)


def read_sample(path, digest):
    """The prompts of a sample this agent wrote (in TRAFFIC_DIR, root's), still as captured."""
    if not path.startswith(TRAFFIC_DIR + "/") or not path.endswith("/" + SAMPLE) or "/../" in path:
        raise ActionError("%s: not a traffic sample" % path)
    data = safefs.read_file(path)
    if data is None or sha256(data).hexdigest() != digest:
        raise ActionError("%s: the traffic sample is gone or changed since it was taken" % path)
    return json.loads(data)
