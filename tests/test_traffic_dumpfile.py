"""The agent's inert reader of SGLang's request dump (specops/agent/bench/dumpfile.py): on a dump
the simulator wrote, in 0.5.23's shape, and on files crafted to run code; the checks a dump file
must pass, and a file cut short told from a bad one.  No fleet."""
import json
import os
import pickle
import stat
import sys
import time
import urllib.request

import pytest

from specops.agent.bench import dumpfile
from support.sim import KEY, SPEC, configure, dumped, server


class Marker:
    """Loading this runs a command: what a pickle can do."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def chat(base, text, n):
    body = {"messages": [{"role": "user", "content": text}], "max_completion_tokens": n}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def generate(base, text, n):
    body = {"text": text, "sampling_params": {"max_new_tokens": n}}
    req = urllib.request.Request(base + "/generate", data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def test_a_dump_the_server_wrote_is_read_inertly_into_prompts_with_their_max_new_tokens(tmp_path):
    folder = tmp_path / "dump"
    with server(tmp_path, *SPEC) as base:
        configure(base, {"dump_requests_folder": str(folder), "dump_requests_threshold": 3})
        generate(base, "fun main() in kotlin", 5)
        chat(base, "Port this kotlin code", 7)
        generate(base, "plain words", 6)
        [path] = dumped(folder, 1)
        before = set(sys.modules)
        fd = os.open(folder, os.O_RDONLY)
        try:  # the server writes it from a thread (while it runs: a killed server leaves it cut short)
            end = time.monotonic() + 30
            while True:
                try:
                    requests = dumpfile.load(dumpfile.read(fd, path.name, str(path)), str(path))
                    break
                except (EOFError, pickle.UnpicklingError):
                    assert time.monotonic() < end, "the dump file never became whole"
                    time.sleep(0.1)
        finally:
            os.close(fd)
    prompts = [p for fields, *_ in requests for p in dumpfile.prompts(fields)]
    assert prompts[0] == {"text": "fun main() in kotlin", "max_new_tokens": 5}
    # the chat request reached the dump as its templated prompt's token ids (serving_chat._engine_prompt)
    assert set(prompts[1]) == {"input_ids", "max_new_tokens"} and prompts[1]["max_new_tokens"] == 7
    assert len(prompts[1]["input_ids"]) == 4 and all(isinstance(i, int) for i in prompts[1]["input_ids"])
    assert prompts[2] == {"text": "plain words", "max_new_tokens": 6}
    assert all(c <= f for _, _, c, f in requests)
    # none of SGLang's (the simulator's) modules was imported to read it
    assert not [m for m in set(sys.modules) - before if m.startswith("sglang")]


def test_a_pickle_that_would_run_code_is_refused_and_nothing_in_it_runs(tmp_path):
    marker = tmp_path / "ran"
    for top in ({"requests": [Marker(marker)]}, Marker(marker), {"requests": [(Marker(marker), {}, 1.0, 2.0)]}):
        with pytest.raises(dumpfile.Refused):
            dumpfile.load(pickle.dumps(top), "x.pkl")
    assert not marker.exists()
    assert pickle.loads(pickle.dumps(Marker(marker))) == 0 and marker.exists()  # the planted code does run elsewhere


def test_a_truncated_dump_is_told_from_a_bad_one(tmp_path):
    data = pickle.dumps({"requests": []})
    with pytest.raises((EOFError, pickle.UnpicklingError)):
        dumpfile.load(data[:-3], "x.pkl")  # still being written: tried again
    with pytest.raises(dumpfile.Refused):
        dumpfile.load(pickle.dumps([1, 2]), "x.pkl")


def st(mode=stat.S_IFREG | 0o640, uid=0, nlink=1, size=10):
    return os.stat_result((mode, 1, 1, nlink, uid, 0, size, 0, 0, 0))


@pytest.mark.parametrize("given, said", [
    (st(mode=stat.S_IFLNK | 0o777), "a symbolic link"),
    (st(mode=stat.S_IFIFO | 0o600), "not a regular file"),
    (st(uid=1000), "owned by uid 1000, not root"),
    (st(nlink=2), "has 2 names"),
    (st(mode=stat.S_IFREG | 0o660), "writable by others"),
    (st(size=dumpfile.MAX_BYTES + 1), "more than a dump holds"),
])
def test_each_check_on_a_dump_file(given, said):
    assert said in dumpfile.check_stat(given, "f.pkl")
    assert dumpfile.check_stat(st(), "f.pkl") is None


def test_a_link_planted_for_a_dump_file_is_never_followed(tmp_path):
    (tmp_path / "secret").write_bytes(pickle.dumps({"requests": []}))
    os.symlink(tmp_path / "secret", tmp_path / "x.pkl")
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(dumpfile.Refused, match="a symbolic link"):
            dumpfile.read(fd, "x.pkl", "x.pkl")
    finally:
        os.close(fd)


def test_a_loader_error_of_any_kind_refuses_and_the_shape_is_checked_item_by_item():
    with pytest.raises(dumpfile.Refused, match="AttributeError"):
        dumpfile.load(b"\x80\x02K\x01(K\x02e.", "x.pkl")  # APPENDS to a number
    with pytest.raises(dumpfile.Refused, match="uses EXT1"):
        dumpfile.load(b"\x80\x02\x82\x01.", "x.pkl")
    with pytest.raises(dumpfile.Refused, match="memo index"):
        dumpfile.load(b"\x80\x02r\x00\x00\x00\x40N.", "x.pkl")  # would allocate gigabytes
    with pytest.raises(dumpfile.Refused, match="not a pickle"):
        dumpfile.load(b"\x80\x02\xff.", "x.pkl")

    ok = Request()
    ok.__dict__.update(text="t", sampling_params={"max_new_tokens": 3})

    def dump(requests):  # as SGLang pickles it: the class under its real name (protocol 2 writes it inline)
        data = pickle.dumps({"requests": requests}, protocol=2)
        return data.replace(f"{__name__}\nRequest\n".encode(), b"sglang.srt.managers.io_struct\nGenerateReqInput\n")
    assert dumpfile.load(dump([(ok, {}, 1.0, 2.0)]), "x")[0][0]["text"] == "t"
    for bad in ((ok, {}, "then", 2.0), (ok, [], 1.0, 2.0), (ok, {}, 1.0), ({"text": "t"}, {}, 1.0, 2.0)):
        with pytest.raises(dumpfile.Refused, match="request 0 is not"):
            dumpfile.load(dump([bad]), "x")


class Request:
    """Pickled under GenerateReqInput's real name (test_a_loader_error...)."""


def test_a_file_that_stays_cut_short_is_refused_once_it_has_had_its_time():
    from specops.agent.bench import dumpdir
    assert dumpdir.truncated(EOFError()) and dumpdir.truncated(pickle.UnpicklingError("pickle data was truncated"))
    assert not dumpdir.truncated(pickle.UnpicklingError("invalid load key, 'x'."))
