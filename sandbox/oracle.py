"""The simulator's performance model (sandbox/sglang_sim/sglang/sim_perf.py), loaded on the
controller by path (its package is named `sglang`, which must not shadow anything here): the
closed-form oracle spec-tune's tests and bench judge the tuner by."""
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "sim_perf", Path(__file__).resolve().parent / "sglang_sim" / "sglang" / "sim_perf.py")
sim_perf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim_perf)
