"""What a starting SGLang writes, as specops reads it: its tqdm bars (made here by the tqdm and
the formats SGLang 0.5.23 uses, so the bytes are the real ones), the launcher's relay that makes
each redraw a journal line, the phase each line names, and the failure tail that shows each bar
at its last state.  No fleet."""
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tqdm import tqdm

from specops.agent.host import last_states
from specops.agent.services.startup import Startup
from specops.kinds.sglang import PROGRESS

LAUNCHER = Path(__file__).resolve().parent.parent / "specops" / "remote" / "hostfiles" / "launch.py"
sys.path.insert(0, str(LAUNCHER.parent))
import launch  # noqa: E402  (a host file: run there as a script)

# sglang/srt/utils/common.py, 0.5.23
BAR_FORMAT = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]"


class Writes(io.StringIO):
    """A stream that keeps each write apart, as each reaches the pipe (tqdm flushes each)."""

    def __init__(self):
        super().__init__()
        self.writes = []

    def write(self, s):
        if s:
            self.writes.append(s.encode())
        return len(s)


def loading_bar(shards):
    """The bytes SGLang's weight loader writes (weight_utils.py: desc, BAR_FORMAT, a free position)."""
    out = Writes()
    for _ in tqdm(range(shards), desc="Loading safetensors checkpoint shards", bar_format=BAR_FORMAT,
                  position=tqdm._get_free_pos(), file=out, mininterval=0):
        pass
    return out.writes


def capture_bar(batch_sizes):
    """The bytes its CUDA graph runner writes (decode_cuda_graph_runner.py: tqdm's default bar,
    the description set per batch size)."""
    out = Writes()
    bar = tqdm(list(reversed(batch_sizes)), file=out, mininterval=0)
    for bs in bar:
        bar.set_description("Capturing batches (bs=%d avail_mem=30.00 GB)" % bs)
    bar.close()
    return out.writes


def phase(line):
    return Startup(None, None, PROGRESS, 0).phase_of(line)


def relayed(writes, chunks="each"):
    lines = launch.Lines()
    data = writes if chunks == "each" else [b"".join(writes)]
    out = [line for chunk in data for line in lines.feed(chunk)] + lines.flush()
    return [(line.startswith(launch.REDRAW),
             line[len(launch.REDRAW) if line.startswith(launch.REDRAW) else 0:].decode().rstrip("\n"))
            for line in out]


def test_the_relay_passes_on_the_last_words_of_a_server_already_gone():
    """The server has gone, a leftover of it still holds the pipe (no end of input): what the
    server wrote last is still in the pipe, and reaches the journal before the relay ends."""
    import os
    dead = subprocess.Popen(["true"])
    dead.wait()
    read, write = os.pipe()  # `write` stays open: the leftover
    try:
        os.write(write, b"Traceback: the server's last words\n")
        res = subprocess.run([sys.executable, launch.__file__, "--relay", str(dead.pid)], stdin=read,
                             capture_output=True, timeout=60)
    finally:
        os.close(read)
        os.close(write)
    assert res.stdout == b"Traceback: the server's last words\n", res


@pytest.mark.parametrize("chunks", ["each", "all at once"])
def test_the_relay_makes_each_redraw_a_line_whose_count_is_read(chunks):
    rows = relayed(loading_bar(5), chunks)
    # each a redraw, but the last when its newline came in the same read: the bar's last state, kept
    assert all(redraw for redraw, _ in rows[:-1]) and rows[-1][0] == (chunks == "each")
    phases = [phase(text) for _, text in rows]
    assert [p for i, p in enumerate(phases) if phases[i - 1:i] != [p]] == [f"loading weights {i}/5" for i in range(6)]
    assert phases.count("loading weights 5/5") == 2  # tqdm draws the last state again as it closes


def test_the_graph_capture_bar_and_sglangs_own_phase_lines_are_named():
    rows = relayed(capture_bar([1, 2, 4, 8]))
    assert phase(rows[-1][1]) == "capturing CUDA graphs: batch size 1 (4/4)"
    assert "capturing CUDA graphs: batch size 8 (1/4)" in [phase(t) for _, t in rows]
    # The other loaders' bars (weight_utils.py), as tqdm draws them
    for desc, fmt in [("Loading pt checkpoint shards", BAR_FORMAT), ("Multi-thread loading shards", BAR_FORMAT),
                      ("Loading safetensors using Fastsafetensor loader",
                       "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]"),
                      ("Loading safetensors using Runai Model Streamer", None)]:
        out = Writes()
        for _ in tqdm(range(3), desc=desc, bar_format=fmt, file=out, mininterval=0):
            pass
        assert phase(relayed(out.writes)[-1][1]) == "loading weights 3/3", desc
    out = Writes()  # prefill_cuda_graph_runner.py
    bar = tqdm([512, 256], file=out, mininterval=0)
    for n in bar:
        bar.set_description(f"Capturing prefill shape (num_tokens={n} avail_mem=30.00 GB)")
    bar.close()
    assert phase(relayed(out.writes)[-1][1]) == "capturing prefill CUDA graphs: 256 tokens (2/2)"
    # 0.5.23's lines (model_runner.py, kv_cache_configurator.py, cuda_graph_setup.py, eagle_worker_v2.py,
    # http_server.py), with its logger's prefix
    assert [phase("[2026-12-05 10:00:00 TP0] " + line) for line in [
        "Load weight begin. avail mem=79.10 GB",
        "Load weight end. elapsed=3.20 s, type=LlamaForCausalLM, quant=None, avail mem=40.12 GB, mem usage=38.98 GB.",
        "Memory pool end. avail mem=30.05 GB",
        "Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, avail mem=30.05 GB",
        "Capture target verify CUDA graph end. bs=[1, 2, 4, 8], elapsed=0.40 s, mem usage=0.09 GB, avail mem=29.96 GB.",
        "Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=29.96 GB",
        "Capture single-CG draft extend begin. This can take several minutes. ",
        "The server is fired up and ready to roll!"]] == [
        "loading weights", "weights loaded", "KV cache allocated", "capturing target verify CUDA graphs",
        "target verify CUDA graphs captured", "capturing draft decode CUDA graphs",
        "capturing single-CG draft extend CUDA graphs", "ready to roll"]


def test_lines_around_a_redraw_keep_their_own_lines():
    lines = launch.Lines()
    assert lines.feed(b"[t] Load weight begin\n\rLoading: 40% Completed | 2/5") == [
        b"[t] Load weight begin\n", launch.REDRAW + b"Loading: 40% Completed | 2/5\n"]
    assert lines.feed(b"[t] a log line while the bar shows\n") == [b"[t] a log line while the bar shows\n"]
    assert lines.feed(b"abc\r\n\n") == [b"abc\n", b"\n"]  # \r\n ends one line; an empty line stays
    assert lines.feed(b"half a li") == []  # a line not ended waits for its end, as journald's does
    assert lines.feed(b"ne\n") == [b"half a line\n"]
    assert lines.feed(b"no end") == [] and lines.flush() == [b"no end\n"]


def journal_rows(writes, before=(), after=()):
    """journalctl -o json's rows for what went through the relay, as journald stores it (the
    level prefix taken off into PRIORITY)."""
    rows = [{"MESSAGE": m, "PRIORITY": "6"} for m in before]
    for redraw, text in relayed(writes):
        rows.append({"MESSAGE": text, "PRIORITY": "7" if redraw else "6"})
    rows += [{"MESSAGE": m, "PRIORITY": "6"} for m in after]
    return [json.dumps(r) for r in rows]


def test_the_failure_tail_shows_each_bar_at_its_last_state():
    rows = journal_rows(loading_bar(5), before=["[t] Load weight begin."], after=["[t] Load weight end."])
    rows += journal_rows(capture_bar([1, 2]), after=["[t] Capture target decode CUDA graph end."])
    tail = last_states(rows, 25).splitlines()
    assert tail[0] == "[t] Load weight begin." and tail[2] == "[t] Load weight end."
    assert "5/5" in tail[1] and "Capturing batches (bs=1" in tail[3] and "2/2" in tail[3]
    assert len(tail) == 5
    # An unrelayed server's bar (journald got all its redraws as one line), and journalctl's byte
    # array for a message that is not printable text.
    legacy = "\r".join(w.decode() for w in loading_bar(3)).replace("\n", "")
    rows = [json.dumps({"MESSAGE": list(legacy.encode()), "PRIORITY": "6"})]
    assert "| 3/3 [" in last_states(rows, 25) and "0/3" not in last_states(rows, 25)
    assert "\r" not in last_states(rows, 25)


def test_the_relay_carries_a_killed_servers_last_words_and_ends_with_it(tmp_path):
    """The launcher's own relay_stderr, under a server that does what SGLang does on its way out
    (kill_process_tree: SIGKILL to each of its children, then its traceback, then exit), beside
    a leftover that escaped it and writes to the pipe every 0.3 s for a minute.  The relay is
    nobody's child, so it lives to carry the last words, and it ends with the server anyway:
    the unit must stop."""
    script = tmp_path / "server.py"
    script.write_text(f"""
import os, signal, subprocess, sys, time
sys.path.insert(0, {str(LAUNCHER.parent)!r})
import launch
st = os.fstat(2)
os.environ["JOURNAL_STREAM"] = "%d:%d" % (st.st_dev, st.st_ino)  # what systemd sets
launch.relay_stderr()
if os.fork() == 0:  # the leftover: not the server's child, chatty, on the pipe for a minute
    if os.fork() == 0:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        for _ in range(200):
            os.write(2, b"\\rLoading:  50% Completed | 1/2")
            time.sleep(0.3)
    os._exit(0)
os.wait()
sys.stderr.write("server line\\n")
sys.stderr.flush()
scheduler = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
time.sleep(1)
for pid in filter(str.isdigit, os.listdir("/proc")):  # kill_process_tree
    try:
        if open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()[1] == str(os.getpid()):
            os.kill(int(pid), signal.SIGKILL)
    except OSError:
        pass
os.write(2, b"Traceback (most recent call last): the last words\\n")
os._exit(1)
""")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          timeout=90)  # ends when every holder of its stderr has: the server and the relay
    took = time.monotonic() - t0
    lines = proc.stderr.splitlines()
    # (a line may follow a redraw of the leftover's that came in the same read: as a terminal shows it)
    assert [line for line in lines if line.endswith(b"server line")], lines[:5]
    assert [line for line in lines if line.endswith(b"Traceback (most recent call last): the last words")], lines[-5:]
    assert launch.REDRAW + b"Loading:  50% Completed | 1/2" in lines
    assert took < 45, took  # the leftover writes for a minute: the relay ended with the server, not with it


def test_the_live_line_names_the_gpu_memory_the_services_own_processes_gained(monkeypatch):
    """A load that logs nothing for minutes still moves: its GPU memory, counted over the
    service's own current processes only (another user's job growing is not its progress)."""
    from specops.agent.services import gpus, startup
    apps = [{"unit": "sglang", "earlier": False, "mib": 62669}, {"unit": None, "earlier": False, "mib": 9000},
            {"unit": "other", "earlier": False, "mib": 4000}, {"unit": "sglang", "earlier": True, "mib": 700}]
    monkeypatch.setattr(gpus, "gpu_fact", lambda names=(): {"present": True, "apps": apps})
    assert startup._gpu_used("sglang") == 62669
    apps[0]["mib"] = None  # [N/A] per process: the GPUs' whole use, rather than nothing
    monkeypatch.setattr(gpus, "gpu_fact", lambda names=(): {"present": True, "apps": apps,
                                                             "gpus": [{"memory.used": 70000}, {"memory.used": None}]})
    assert startup._gpu_used("sglang") == 70000
    watch = Startup("sglang", None, PROGRESS, 60)
    watch.phase, watch.gpu_at_line, watch.gpu = "loading weights 61/163", 62669, 68096
    assert watch.words() == "loading weights 61/163: GPU memory 61.2 -> 66.5 GiB"
    watch.gpu_at_line = watch.gpu  # a line came since
    assert watch.words() == "loading weights 61/163"


def test_a_redraw_split_over_reads_and_another_processs_line_after_one():
    lines = launch.Lines()
    assert lines.feed(b"\rLoading:  37% Completed | 61/1") == [launch.REDRAW + b"Loading:  37% Completed | 61/1\n"]
    # another process's line, read after the redraw was shown: a line of its own, never collapsed
    assert lines.feed(b"[TP3] Scheduler hit an exception\n") == [b"[TP3] Scheduler hit an exception\n"]
    # both in one read: one line, as a terminal shows it, plain (kept whole in a tail)
    assert lines.feed(b"\rLoading:  38% Completed | 62/163[TP1] error\n") == [
        b"Loading:  38% Completed | 62/163[TP1] error\n"]
    # a tqdm clear (spaces between two carriage returns) makes no line; the line after it is plain
    assert lines.feed(b"\r      \r[t] after the clear\n") == [b"[t] after the clear\n"]
    rows = [json.dumps({"MESSAGE": "[t] Load weight begin.", "PRIORITY": "6"}),
            json.dumps({"MESSAGE": "Loading:  37% Completed | 61/1", "PRIORITY": "7"}),
            json.dumps({"MESSAGE": "[TP3] Scheduler hit an exception", "PRIORITY": "6"}),
            json.dumps({"MESSAGE": ["twice", "given"], "PRIORITY": "6"}),  # journalctl: a field logged twice
            json.dumps({"MESSAGE": None, "PRIORITY": "6"})]  # journalctl: a field over 4096 bytes without --all
    assert last_states(rows, 25).splitlines() == [
        "[t] Load weight begin.", "Loading:  37% Completed | 61/1", "[TP3] Scheduler hit an exception", "twice given"]


def test_two_bars_one_after_the_other_each_keep_their_last_state():
    """A bar's last state, then the next bar's redraws with no line between (tqdm's newline came
    in a read of its own): the first bar's last state stays in the tail."""
    rows = journal_rows(loading_bar(2)) + journal_rows(capture_bar([1, 2]))
    tail = last_states(rows, 25).splitlines()
    assert len(tail) == 2 and "| 2/2 [" in tail[0] and tail[0].startswith("Loading") and \
        tail[1].startswith("Capturing batches (bs=1") and "2/2" in tail[1], tail
