"""The check beyond compiling (specops.sglang.patchlint): a patched file may add no name that
would fail at run time, compared with its upstream file; pyflakes in process, no host needed."""
import sys

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


def edited_diff(edited, upstream=UPSTREAM):
    return patchfile.make(REL, upstream, edited, "0.5.23", "a" * 64)


def test_an_edited_file_its_diff_does_not_give_back_is_refused_naming_the_line():
    """A diff keeps sglang's line endings (patchfile.apply): an edited line saved with CRLF (an
    editor's) comes back with LF, and --edited would write a patch of another file than the one
    checked.  Refused, naming the line and how it differs."""
    edited = UPSTREAM.replace("SCALE = 2\n", "SCALE = 3\r\n")
    with pytest.raises(PatchError) as e:
        patchlint.check_edited(edited_diff(edited), UPSTREAM, edited, REL, "0.5.23")
    assert str(e.value) == (f"patch {NAME}.patch: applied to sglang 0.5.23's file, the diff does not give back the "
                            f"edited file: its line 4 is 'SCALE = 3\\n', the edited file's 'SCALE = 3\\r\\n'")


BROKEN = "def scaled(x):\n    return x if\n"


def test_an_edited_file_that_does_not_compile_is_refused_only_where_its_upstream_compiles():
    """Compiled with the controller's Python: an upstream that does not compile with it (syntax
    newer than this Python; a broken line stands in for it here) leaves the verdict to the host's,
    and the file is not refused for that."""
    edited = UPSTREAM.replace("def scaled(x):\n    return x * SCALE\n", BROKEN)
    with pytest.raises(PatchError) as e:
        patchlint.check_edited(edited_diff(edited), UPSTREAM, edited, REL, "0.5.23")
    assert str(e.value) == (f"patch {NAME}.patch: the patched file does not compile: line 16: invalid syntax "
                            f"(sglang 0.5.23's own does, with Python {sys.version_info[0]}.{sys.version_info[1]})")
    newer = UPSTREAM + "\n\n" + BROKEN
    edited = newer.replace("SCALE = 2\n", "SCALE = 3\n")
    patchlint.check_edited(edited_diff(edited, newer), newer, edited, REL, "0.5.23")


def test_a_file_holding_a_nul_byte_is_refused_naming_its_line():
    """Python names no line for it (3.11.7 raises a SyntaxError whose lineno is None: the refusal
    read "line None: source code string cannot contain null bytes"): the line is found here."""
    edited = UPSTREAM.replace("SCALE = 2\n", "SCALE = 2\0\n")
    with pytest.raises(PatchError) as e:
        patchlint.check_edited(edited_diff(edited), UPSTREAM, edited, REL, "0.5.23")
    assert str(e.value).startswith(f"patch {NAME}.patch: the patched file does not compile: line 4: a NUL byte")


@pytest.mark.parametrize("edited", [
    UPSTREAM.replace("def scaled(x):\n    return x * SCALE\n", BROKEN),
    UPSTREAM.replace("SCALE = 2\n", "<<<<<<< patched\nSCALE = 3\n||||||| base\n=======\nSCALE = 2\n>>>>>>> new\n"),
])
def test_deploys_check_refuses_a_diff_whose_patched_file_does_not_compile(edited):
    """The review's finding 6: `deploy --check` said `patches against sglang 0.5.23: ok` for a diff
    that gives `return x if`, or keeps a merge's markers; only --edited compiled.  Deploy's check
    (patches.applied, patchlint.apply_checked) compiles the patched file too."""
    from types import SimpleNamespace
    from specops.sglang import patches
    with pytest.raises(PatchError, match=rf"^patch {NAME}\.patch: the patched file does not compile: line \d+: "):
        patches.applied(SimpleNamespace(name="box"), edited_diff(edited), UPSTREAM, REL, "0.5.23")
