"""The check beyond compiling (specops.sglang.patchlint): a patched file may add no name that
would fail at run time, compared with its upstream file; pyflakes in process, no host needed."""
import pytest

from specops.sglang import patchfile, patchlint
from specops.sglang.patchfile import PatchError

REL = "srt/models/deepseek_v2.py"
NAME = f"sglang/{REL}"

UPSTREAM = '''\
import torch
from torch import nn

SCALE = 2


class DecoderLayer(nn.Module):
    def forward(self, hidden_states):
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return hidden_states


def scaled(x):
    return x * SCALE
'''
MLP = "        hidden_states = self.mlp(hidden_states)\n"


def test_a_patch_using_an_undefined_name_is_refused_naming_it_and_its_line():
    # The edit, carried from another release, uses `residual` where this one has no such name.
    patched = UPSTREAM.replace(MLP, MLP + "        hidden_states = hidden_states + residual\n")
    assert patchlint.problems(UPSTREAM, patched, NAME) == ["line 12: undefined name 'residual'"]
    assert patched.splitlines()[11] == "        hidden_states = hidden_states + residual"
    diff = patchfile.make(REL, UPSTREAM, patched, "0.5.23", "a" * 64)
    with pytest.raises(PatchError) as e:
        patchlint.apply_checked(diff, UPSTREAM, REL, "0.5.23")
    assert str(e.value) == (f"patch {NAME}.patch: the patched file would fail at run time on sglang 0.5.23: "
                            f"line 12: undefined name 'residual' (pyflakes; the unpatched file has no such problem)")


def test_the_same_edit_without_that_name_passes():
    patched = UPSTREAM.replace(MLP, MLP + "        hidden_states = hidden_states * SCALE\n")
    assert patchlint.problems(UPSTREAM, patched, NAME) == []
    diff = patchfile.make(REL, UPSTREAM, patched, "0.5.23", "a" * 64)
    assert patchlint.apply_checked(diff, UPSTREAM, REL, "0.5.23") == patched
    # Style warnings are not run-time failures: an unused import, names that `import *` may bring.
    assert patchlint.problems(UPSTREAM, "import os\nfrom math import *\n" + patched + "x = tau\n", NAME) == []


def test_a_name_undefined_already_upstream_is_not_reported():
    upstream = UPSTREAM + "\n\ndef legacy():\n    return old_helper()\n"
    # The patch moves that use down by two lines: still upstream's, not the patch's.
    patched = upstream.replace("SCALE = 2\n", "SCALE = 2\nBIAS = 0\n\n")
    assert patchlint.problems(upstream, patched, NAME) == []
    patchlint.check(upstream, patched, REL, "0.5.23")
    # A second use is the patch's: the problems are counted, not only named.
    twice = patched.replace("return old_helper()\n", "return old_helper() + old_helper()\n")
    assert patchlint.problems(upstream, twice, NAME) == ["line 22: undefined name 'old_helper'"]


def test_a_local_used_before_its_assignment_is_caught():
    patched = UPSTREAM.replace("    return x * SCALE\n", "    y = x * SCALE\n    SCALE = 3\n    return y\n")
    assert patchlint.problems(UPSTREAM, patched, NAME) == [
        "line 16: local variable 'SCALE' defined in enclosing scope on line 4 referenced before assignment"]
    # The same problem upstream already has, its lines moved, is not new.
    assert patchlint.problems(patched, "# a comment\n" * 5 + patched, NAME) == []


def test_a_name_missing_from_all_is_caught_and_several_are_listed_to_three():
    patched = "__all__ = ['DecoderLayer', 'Gone']\n" + UPSTREAM + "a = b + c + d + e\n"
    with pytest.raises(PatchError) as e:
        patchlint.check(UPSTREAM, patched, REL, "0.5.23")
    assert str(e.value) == (f"patch {NAME}.patch: the patched file would fail at run time on sglang 0.5.23: "
                            f"line 1: undefined name 'Gone' in __all__; line 18: undefined name 'b'; line 18: "
                            f"undefined name 'c'; … (pyflakes; the unpatched file has no such problems)")
    assert patchlint.problems(UPSTREAM, patched, NAME)[3:] == ["line 18: undefined name 'd'",
                                                               "line 18: undefined name 'e'"]


def test_a_file_that_does_not_parse_or_is_not_python_is_left_alone():
    assert patchlint.problems(UPSTREAM, UPSTREAM + "def broken(:\n    residual\n", NAME) == []
    assert patchlint.problems(UPSTREAM, UPSTREAM + "residual\n", "sglang/srt/configs/model.json") == []
    patchlint.check(UPSTREAM, "residual\n", "srt/layers/kernel.cu", "0.5.23")


def test_an_upstream_file_is_read_once(monkeypatch):
    upstream = UPSTREAM + "# read once\n"
    seen = []
    real = patchlint._messages
    monkeypatch.setattr(patchlint, "_messages", lambda text, filename: seen.append(text) or real(text, filename))
    for host in range(3):
        assert patchlint.problems(upstream, upstream + f"host{host}\n", NAME) == [
            f"line 18: undefined name 'host{host}'"]
    assert seen.count(upstream) == 1 and len(seen) == 4


def test_a_verdict_the_memo_keeps_for_one_upstream_does_not_excuse_the_same_patched_text_on_another(
        tmp_path, monkeypatch):
    """Issue 49 (protective line 12): the memo's key holds the upstream text.  The same patched file
    is clean against a release whose upstream already calls `old_helper` (SGLang's problem, not the
    patch's), and not against a release without it, where the patch brings the call: the first
    verdict, kept by the memo, must not answer for the second."""
    monkeypatch.setenv("SPECOPS_MEMO", str(tmp_path / "memo"))
    monkeypatch.delenv("SPECOPS_NO_MEMO", raising=False)
    has_it = UPSTREAM + "\n\ndef legacy():\n    return old_helper()\n"
    patched = has_it.replace("SCALE = 2\n", "SCALE = 2\nBIAS = 0\n")
    assert patchlint.problems(has_it, patched, NAME) == []
    assert len(list((tmp_path / "memo" / "patchlint").iterdir())) == 1  # the memo is on: the verdict is kept
    assert patchlint.problems(UPSTREAM, patched, NAME) == ["line 21: undefined name 'old_helper'"]
    with pytest.raises(PatchError, match="undefined name 'old_helper'"):
        patchlint.check(UPSTREAM, patched, REL, "0.5.24")
