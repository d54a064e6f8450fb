"""The simulator's opt-in noise (sandbox/sglang_sim/sglang/sim_noise.py, and the warm-up in
sim_perf.py): a planted slow start slows exactly one start of its settings, taken off its file
atomically and never through a link; the random draw is reproducible and differs from start to
start; the warm-up is paid by the first N requests only.  In-process, no server, no fleet."""
import json
import os
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sandbox" / "sglang_sim"))
from sglang import sim_noise  # noqa: E402
from sglang.sim_perf import Model  # noqa: E402

SETTINGS = [3, 1, 4]


def plant(path, *entries):
    path.write_text(json.dumps([{"settings": s, "factor": f, "starts": n} for s, f, n in entries]))


def test_a_planted_slow_start_slows_one_start_of_its_settings_and_the_next_is_normal(tmp_path):
    slow = tmp_path / "slow.json"
    plant(slow, ([5, 1, 6], 0.5, 1), (SETTINGS, 0.4, 1))
    env = {"SGLANG_SIM_SLOW_FILE": str(slow)}
    before = slow.stat().st_ino
    assert sim_noise.start_speed([2, 1, 3], env) == 1.0  # other settings: nothing taken
    assert sim_noise.start_speed(None, env) == 1.0  # no speculation: never planted
    assert sim_noise.start_speed(SETTINGS, env) == 0.4
    assert json.loads(slow.read_text()) == [{"settings": [5, 1, 6], "factor": 0.5, "starts": 1},
                                            {"settings": SETTINGS, "factor": 0.4, "starts": 0}]
    assert slow.stat().st_ino != before and os.listdir(tmp_path) == ["slow.json"]  # replaced whole, no temp left
    assert sim_noise.start_speed(SETTINGS, env) == 1.0
    assert sim_noise.start_speed([5, 1, 6], env) == 0.5


def test_starts_at_once_take_exactly_the_planted_count(tmp_path):
    slow = tmp_path / "slow.json"
    plant(slow, (SETTINGS, 0.4, 3))
    got, gate = [], threading.Barrier(8)

    def start():
        gate.wait()
        got.append(sim_noise.planted(SETTINGS, str(slow)))
    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == [0.4] * 3 + [1.0] * 5
    assert json.loads(slow.read_text())[0]["starts"] == 0


def test_a_link_in_place_of_the_slow_file_is_not_followed(tmp_path, caplog):
    target = tmp_path / "elsewhere.json"
    plant(target, (SETTINGS, 0.4, 1))
    text = target.read_text()
    (tmp_path / "slow.json").symlink_to(target)
    assert sim_noise.start_speed(SETTINGS, {"SGLANG_SIM_SLOW_FILE": str(tmp_path / "slow.json")}) == 1.0
    assert target.read_text() == text and (tmp_path / "slow.json").is_symlink()
    assert "a symbolic link, not followed" in caplog.text


def test_the_random_draw_is_reproducible_and_differs_from_start_to_start(tmp_path):
    def starts(name, noise, n=6):
        env = {"SGLANG_SIM_NOISE": noise, "SGLANG_SIM_NOISE_STARTS": str(tmp_path / name),
               "SGLANG_SIM_SLOW_FILE": str(tmp_path / "none.json")}
        return [sim_noise.start_speed(SETTINGS, env) for _ in range(n)]
    first = starts("a.json", "jitter=0.03,slow=0.5,seed=7")
    assert first == starts("b.json", "jitter=0.03,slow=0.5,seed=7")  # another host, the same starts
    assert len(set(first)) == 6 and all(0.35 * 0.85 < f < 1.15 for f in first)
    assert any(f < 0.7 for f in first) and any(f > 0.85 for f in first)  # some slow, some not
    assert first != starts("c.json", "jitter=0.03,slow=0.5,seed=8")
    assert json.loads((tmp_path / "a.json").read_text()) == {"3,1,4": 6}
    assert starts("d.json", "") == [1.0] * 6 and not (tmp_path / "d.json").exists()  # off: nothing drawn
    for typo in ("jiter=0.1", "slow=often"):
        with pytest.raises(ValueError, match=typo):
            starts("e.json", typo)


def test_the_speed_divides_every_step(monkeypatch):
    monkeypatch.setenv("SGLANG_SIM_ACCEPT_LENGTH", "2")
    normal, slow = Model("EAGLE3", 3, 4), Model("EAGLE3", 3, 4)
    slow.speed = 0.4
    assert [s / 0.4 for s, _ in normal.steps(20)] == pytest.approx([s for s, _ in slow.steps(20)])


def test_only_the_first_requests_after_a_start_pay_the_warm_up(monkeypatch):
    monkeypatch.setenv("SGLANG_SIM_WARMUP_REQUESTS", "2")
    monkeypatch.setenv("SGLANG_SIM_WARMUP_SECONDS", "0.25")
    model = Model(None)
    step = model.step()[0]
    requests = [[s for s, _ in model.steps(5)] for _ in range(4)]
    assert [r[0] - step for r in requests] == pytest.approx([0.25, 0.25, 0, 0])
    assert all(s == step for r in requests for s in r[1:])  # before the first token only
    monkeypatch.delenv("SGLANG_SIM_WARMUP_REQUESTS")
    assert Model(None).take_warmup() == 0.0  # off unless asked
