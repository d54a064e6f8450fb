"""The simulator's request dump, in SGLang 0.5.23's shape (sandbox/sglang_sim/sglang/sim_dump.py):
/configure_logging turns it on and off on the running server; each finished /generate is held,
and a pickle is written per threshold.  Each server runs locally on a loopback port; no fleet."""
import json
import subprocess
import sys
import time

from support.sim import KEY, SIM, SPEC, configure, dumped, generate, server


def test_the_dump_is_off_until_configured_then_a_pickle_per_threshold_then_off_again(tmp_path):
    folder = tmp_path / "dump"
    with server(tmp_path, *SPEC) as base:
        generate(base, 8, False)
        assert not folder.exists()  # off by default
        assert configure(base, {"dump_requests_folder": str(folder), "dump_requests_threshold": 3}) == (200, b"")
        for stream in (False, True, False):
            generate(base, 8, stream, words=4)
        [first] = dumped(folder, 1)
        # a stand-alone reader, as the agent would be: only sglang (the simulator's) importable
        code = ("import pickle, sys, json; d = pickle.load(open(sys.argv[1], 'rb')); "
                "print(json.dumps([sorted(d), type(d['server_args']).__name__, d['server_args'].api_key, "
                "[(type(o).__module__ + '.' + type(o).__name__, o.text, o.sampling_params, o.stream, sorted(out), "
                "f > c) for o, out, c, f in d['requests']]]))")
        res = subprocess.run([sys.executable, "-c", code, str(first)], capture_output=True, text=True,
                             env={"PYTHONPATH": str(SIM)})
        keys, args_type, key, requests = json.loads(res.stdout)
        assert keys == ["config_updates", "requests", "resolved_config", "server_args"] and args_type == "ServerArgs"
        assert key == KEY  # the real dump pickles ServerArgs itself, the keys with it
        assert requests == [["sglang.srt.managers.io_struct.GenerateReqInput", "w w w w", {"max_new_tokens": 8},
                             stream, ["meta_info", "text"], True] for stream in (False, True, False)]
        generate(base, 8, False)  # one held, then the dump turned off: not written while it is off
        assert configure(base, {"dump_requests_folder": ""})[0] == 200
        for _ in range(4):
            generate(base, 8, False)
        time.sleep(0.5)
        assert dumped(folder, 2, timeout=1) == [first] and sorted(tmp_path.rglob("*.pkl")) == [first]
        # ... but still held, as SGLang keeps it: the next dump turned on (anyone's) writes it first
        later = tmp_path / "later"
        configure(base, {"dump_requests_folder": str(later), "dump_requests_threshold": 2})
        generate(base, 8, False, words=2)
        [second] = dumped(later, 1)
        code = ("import pickle, sys, json, time; time.sleep(0.3); d = pickle.load(open(sys.argv[1], 'rb')); "
                "print(json.dumps([o.text for o, *_ in d['requests']]))")
        res = subprocess.run([sys.executable, "-c", code, str(second)], capture_output=True, text=True,
                             env={"PYTHONPATH": str(SIM)})
        assert json.loads(res.stdout) == ["w w w", "w w"], res.stderr
