"""Stand-in for SGLang's srt/model_loader/loader.py: where a start begins loading the model.

The simulator reads no weights: sim_startup.load calls load_model() first thing, before any
loading line (in the scheduler child with SGLANG_SIM_SHARDS, else in the server), and here it
returns at once.  A release that fails to load replaces this file in its overlay
(versions/0.5.25), so the shared code never asks which release it is.
"""


def load_model():
    """Nothing to do: the wait and SGLang's loading lines are sim_startup's."""
