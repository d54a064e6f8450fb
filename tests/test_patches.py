"""Patch paths and draft-config lint at plan time: no fleet."""
import pytest

from roles import draft_config, model_patches
from specops.errors import UsageError
from specops.sglang import patches
from specops.ops.handlers import restart
from specops.inventory import Host
from specops.ops import PlanError
from support.reliability import record_inputs


LLAMA = "srt/models/llama.py"
IDS = "eagle_config.eagle_aux_hidden_state_layer_ids"


def host(**svc):
    base = {"name": "sglang", "model_path": "/models/t",
            "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/models/d"}}
    return Host("h", {"venv": "/opt/v", "services": [{**base, **svc}]})


@pytest.mark.reliability("traversal", "bad-input")
@pytest.mark.parametrize("rel", ["../../etc/passwd", "/etc/passwd", "srt/../../../etc/passwd",
                                 "srt/models/../../../x.py", "srt\\models\\llama.py", "srt//models/llama.py"])
def test_patch_path_traversal_refused_at_plan_time(rel, record_property):
    record_inputs(record_property, rel)
    with pytest.raises(UsageError, match="must be a plain relative path|points outside"):
        model_patches.ops(host(patches=[rel]))


def test_missing_patch_refused():
    with pytest.raises(UsageError, match="not found"):
        model_patches.ops(host(patches=["srt/models/nope.py"]))


def test_patch_ops_compile_with_the_venv_interpreter_and_purge():
    file_op, purge = model_patches.ops(host(patches=[LLAMA]))
    assert file_op.path == "pkg:/opt/v:sglang/srt/models/llama.py"
    assert file_op.validate[0] == "/opt/v/bin/python" and file_op.validate[-1] == "{}..."  # all patches in one run
    assert file_op.notify == (restart("sglang"),) and purge.source == file_op.path


def test_minus_one_needs_a_patch_that_captures_embeddings():
    with pytest.raises(UsageError, match="-1 .*deploy a patch that declares embedding capture"):
        draft_config.ops(host(draft_config={IDS: [-1, 2, 30]}))
    ops = draft_config.ops(host(draft_config={IDS: [-1, 2, 30]}, patches=[LLAMA]))
    assert [type(o).__name__ for o in ops] == ["JsonKeys", "LayerIdLint"]


def test_layer_ids_range():
    draft_config.check_layer_ids([2, 16, 29], False, 32, "s")
    with pytest.raises(PlanError, match=r"ids \[31\] are never captured: the target has 32 layers"):
        draft_config.check_layer_ids([2, 16, 31], False, 32, "s")
    with pytest.raises(PlanError, match="list of integers"):
        draft_config.check_layer_ids("2,3", False, 32, "s")
    with pytest.raises(PlanError, match=r"ids \[-2\]"):
        draft_config.check_layer_ids([-2, 3], True, None, "s")
    with pytest.raises(PlanError) as e:  # the draft's own ids: named with its file, as another target's
        draft_config.check_layer_ids([2, 58], False, 32, "s", draft="/models/x")
    assert str(e.value) == ("s: the draft /models/x (its config.json: /models/x/config.json) was made for another "
                            f"target: {IDS} ids [58] are never captured: the target has 32 layers, so ids must be "
                            "in -1..30; use a draft made for this target")
    with pytest.raises(PlanError, match=r"^s: draft /models/x: .* ids \[-2\] are never captured"):
        draft_config.check_layer_ids([-2, 3], True, 32, "s", draft="/models/x")  # never valid: no target's


def test_the_lint_says_whose_ids_miss_the_target():
    """The draft's own config.json, or the inventory's draft_config: only the first is a draft
    made for another target."""
    import base64
    import json
    from specops.ops import Facts, JsonKeys

    def facts(ids):
        doc = lambda d: {"exists": True, "type": "file",  # noqa: E731
                         "content_b64": base64.b64encode(json.dumps(d).encode()).decode()}
        return Facts({"files": {
            "/models/t/config.json": doc({"num_hidden_layers": 32}),
            "/models/d/config.json": doc({"eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}})}})
    svc = host().vars["services"][0]
    with pytest.raises(PlanError, match=r"^sglang: the draft /models/d \(its config.json: /models/d/config.json\) "
                                        r"was made for another target: .* ids \[58\] are never captured"):
        draft_config.LayerIdLint(svc, None, False).plan(facts([2, 58]), None)
    edit = JsonKeys("/models/d/config.json", {IDS: [2, 58]})
    with pytest.raises(PlanError, match=r"^sglang: eagle_config.eagle_aux_hidden_state_layer_ids ids \[58\] are never"):
        draft_config.LayerIdLint(svc, edit, False).plan(facts([2, 58]), None)


def test_draft_config_needs_a_draft_model():
    h = Host("h", {"services": [{"name": "s", "model_path": "/m", "draft_config": {IDS: [1]}}]})
    with pytest.raises(UsageError, match="draft_config needs speculative.draft_model_path"):
        draft_config.ops(h)


def test_example_patches_declare_capture_and_match_upstream_size():
    from pathlib import Path
    sim = Path(model_patches.__file__).parent.parent / "sandbox/sglang_sim/sglang"
    for rel in (LLAMA, "srt/models/deepseek_v2.py"):
        patch = patches.PATCH_DIR / rel
        assert patches.EMBEDDING_CAPTURE_MARKER in patch.read_text()
        assert patch.stat().st_size == (sim / rel).stat().st_size
