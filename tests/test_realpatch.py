"""Patches against SGLang's real files: the seeds' capture patch cut from the real 0.5.21
`deepseek_v2.py` and carried onto the real 0.5.23's, a real conflict, and the `residual` variant
that compiles and would fail only at run time (the wheels: sandbox/real_sglang, cached)."""
import re

import pytest

from sandbox import real_sglang
from specops.sglang import patchfile, patchlint
from roles import VOCABULARY
from support import seedpatch

REL = seedpatch.REL


@pytest.fixture(scope="module")
def real():
    return {v: real_sglang.file_of(v, REL) for v in ("0.5.21", "0.5.23")}


def sha(text):
    return patchfile.upstream_sha256(text.encode())


def cut(real, edited, version="0.5.21"):
    return patchfile.make(REL, real[version], edited, version, sha(real[version]))


def resolve_markers(merged, line):
    """What a person does with each diff3 conflict: the block replaced by the line they write."""
    block = re.compile(r"<<<<<<< [^\n]*\n.*?\n\|\|\|\|\|\|\| [^\n]*\n.*?\n=======\n.*?>>>>>>> [^\n]*\n", re.S)
    assert len(block.findall(merged)) == 1, merged
    return block.sub(lambda m: line, merged)


def test_the_capture_patch_rebases_from_0_5_21_onto_0_5_23_as_the_same_edit_by_hand(real):
    assert len(real["0.5.23"].splitlines()) - len(real["0.5.21"].splitlines()) > 100  # the file moved
    diff = cut(real, seedpatch.capture(real["0.5.21"]))
    rebased, conflicts = patchfile.rebase(diff, real["0.5.21"], real["0.5.23"], REL, "0.5.23", sha(real["0.5.23"]))
    assert conflicts == []
    assert patchfile.base_of(rebased) == patchfile.Base("0.5.23", sha(real["0.5.23"]))
    by_hand = seedpatch.capture(real["0.5.23"])
    assert patchfile.apply(rebased, real["0.5.23"], REL, "0.5.23") == by_hand
    assert rebased == cut(real, by_hand, "0.5.23")  # byte for byte the diff a person would cut there
    assert patchlint.apply_checked(rebased, real["0.5.23"], REL, "0.5.23") == by_hand  # and it lints clean


def test_a_real_conflict_is_named_by_its_hunk_with_diff3_markers(real):
    diff = cut(real, seedpatch.conflicting(real["0.5.21"]))
    with pytest.raises(patchfile.PatchError, match=r"hunk 1 of 3 \(@@ -2724,7 \+2724,7 @@\) does not apply to "
                                                   r"sglang 0.5.23's srt/models/deepseek_v2.py "
                                                   r"\(cut from sglang 0.5.21\)"):
        patchfile.apply(diff, real["0.5.23"], REL, "0.5.23")
    merged, conflicts = patchfile.rebase(diff, real["0.5.21"], real["0.5.23"], REL, "0.5.23", sha(real["0.5.23"]))
    assert [str(c) for c in conflicts] == ["hunk 1 of 3 (@@ -2724,7 +2724,7 @@) against sglang 0.5.23's line 2810"]
    assert real["0.5.23"].splitlines()[2809] == "            capture_gathered=captured_last_layer_outputs,"
    assert ("<<<<<<< patched (sglang 0.5.21)\n"
            "            captured_last_layer_outputs=None if self.layer_id < 0 else captured_last_layer_outputs,\n"
            "||||||| sglang 0.5.21 (the patch's base)\n"
            "            captured_last_layer_outputs=captured_last_layer_outputs,\n"
            "=======\n"
            "            capture_gathered=captured_last_layer_outputs,\n"
            ">>>>>>> sglang 0.5.23\n") in merged
    # the hunks that merged cleanly are in the merge file already: resolving the one conflict
    # gives the whole edit on 0.5.23
    resolved = resolve_markers(merged, "            capture_gathered=None if self.layer_id < 0 else "
                                       "captured_last_layer_outputs,\n")
    assert resolved == seedpatch.resolve(real["0.5.23"])


def test_the_residual_variant_is_refused_naming_the_name_and_its_line(real):
    diff = cut(real, seedpatch.capture(real["0.5.21"], residual=True))
    patched = patchfile.apply(diff, real["0.5.23"], REL, "0.5.23")
    compile(patched, REL, "exec")  # compiling cannot see it
    line = next(n for n, text in enumerate(patched.splitlines(), 1) if "hidden_states + residual" in text)
    with pytest.raises(patchfile.PatchError, match=rf"would fail at run time on sglang 0.5.23: line {line}: "
                                                   rf"undefined name 'residual'"):
        patchlint.apply_checked(diff, real["0.5.23"], REL, "0.5.23")
    plain = cut(real, seedpatch.capture(real["0.5.21"]))
    assert patchlint.apply_checked(plain, real["0.5.23"], REL, "0.5.23") == seedpatch.capture(real["0.5.23"])


def test_patch_check_plans_against_the_new_versions_wheel_before_its_stack_is_built(real, tmp_path):
    """The first role's plan, with the real wheels as the host's wheelhouse: the residual variant
    and a hunk with no place are refused (naming `inv patch --rebase`), the clean patch passes,
    and a built stack is left to model_patches."""
    from roles import patch_check
    from specops.ops import Context, Facts
    patches = tmp_path / "patches"
    (patches / REL).parent.mkdir(parents=True)
    host = inventory_host(tmp_path, patch_dir=str(patches), wheelhouse=str(real_sglang.wheels()),
                          sglang={"version": "0.5.23"}, torch={"version": "2.9.1"},
                          services=[{"name": "sglang", "model_path": "/m", "patches": [REL + ".patch"]}])

    def plan(edited, stacks=()):
        (patches / (REL + ".patch")).write_text(cut(real, edited))
        (op,) = patch_check.ops(host)
        assert op.wants().wheel_files == {}  # the controller reads the wheelhouse: nothing for the host to fetch
        return op.plan(Facts({"stacks": list(stacks)}), Context("box", False))
    with pytest.raises(patchfile.PatchError, match=r"line \d+: undefined name 'residual'"):
        plan(seedpatch.capture(real["0.5.21"], residual=True))
    with pytest.raises(patchfile.HunkError, match=r"hunk 1 of 3 .* does not apply .*; carry it onto sglang "
                                                  r"0.5.23 with: inv patch --host box srt/models/deepseek_v2.py "
                                                  r"--rebase"):
        plan(seedpatch.conflicting(real["0.5.21"]))
    assert plan(seedpatch.capture(real["0.5.21"])).summary == "ok"
    from specops.sglang import stack
    built = [{"path": stack.venv_of(host), "packages": {"sglang": "0.5.23"}}]
    assert plan(seedpatch.capture(real["0.5.21"], residual=True), built).summary == "ok"  # model_patches' job now


def inventory_host(tmp_path, **hv):
    from specops import inventory
    import yaml
    (tmp_path / "inv").mkdir()
    (tmp_path / "inv" / "hosts.yml").write_text(
        yaml.safe_dump({"all": {"hosts": {"box": {"address": "192.0.2.10", **hv}}}}))
    (host,) = inventory.load(tmp_path / "inv", VOCABULARY).select("box", None)
    return host
