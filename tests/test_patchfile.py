"""Patch files as text (specops.sglang.patchfile): cutting, applying, base checks and rebasing of
diffs against SGLang's files, no host needed."""
import base64
import hashlib

import pytest

from specops.errors import UsageError
from specops.sglang import patchfile
from specops.sglang.patchfile import Base, Conflict, PatchError

REL = "srt/models/deepseek_v2.py"
SHA_OLD = "a" * 64
SHA_NEW = "b" * 64


def module(n=60, top=(), change=None):
    """A stand-in for an SGLang file: numbered functions, optional lines above them."""
    lines = list(top) + [f"def f{i}():\n    return {i}\n" for i in range(n)]
    text = "".join(lines)
    for old, new in (change or {}).items():
        assert old in text
        text = text.replace(old, new)
    return text


def edit(text):
    """The patch's edits: one near the top, one near the bottom."""
    return text.replace("return 3\n", "return 3  # patched\n").replace("return 50\n", "return -50\n")


def test_make_then_apply_round_trips():
    up = module()
    diff = patchfile.make(REL, up, edit(up), "0.5.23", SHA_OLD)
    assert diff.startswith(f"# specops-base: sglang 0.5.23 sha256:{SHA_OLD}\n--- a/sglang/{REL}\n+++ b/sglang/{REL}\n")
    assert diff.count("\n@@ -") == 2
    assert patchfile.apply(diff, up, REL, "0.5.23") == edit(up)
    assert patchfile.base_of(diff) == Base("0.5.23", SHA_OLD)


def test_apply_finds_hunks_moved_by_lines_added_above():
    up = module()
    diff = patchfile.make(REL, up, edit(up), "0.5.23", SHA_OLD)
    # The next release adds lines at the top and between the two hunks.
    moved = module(top=["import os\n"] * 7, change={"def f20():\n": "# new\n# lines\ndef f20():\n"})
    assert patchfile.apply(diff, moved, REL, "0.5.24") == edit(moved)


def test_a_hunk_whose_context_changed_is_refused_naming_it():
    up = module()
    diff = patchfile.make(REL, up, edit(up), "0.5.23", SHA_OLD)
    header = [line for line in diff.splitlines() if line.startswith("@@")][1]
    changed = module(change={"return 49\n": "return 49  # upstream changed this\n"})
    with pytest.raises(PatchError) as e:
        patchfile.apply(diff, changed, REL, "0.5.24")
    assert str(e.value) == (f"patch sglang/{REL}.patch: hunk 2 of 2 ({header}) does not apply to "
                            f"sglang 0.5.24's {REL} (cut from sglang 0.5.23)")
    assert isinstance(e.value, UsageError) and "\n" not in str(e.value)


def test_apply_needs_the_context_exactly_even_in_one_line_hunks():
    # difflib writes "@@ -1 +1,2 @@" for one-line ranges, which whatthepatch alone misreads.
    diff = patchfile.make(REL, "a\n", "a\nb\n", "0.5.23", SHA_OLD)
    assert "@@ -1 +1,2 @@" in diff
    assert patchfile.apply(diff, "a\n", REL, "0.5.23") == "a\nb\n"
    with pytest.raises(PatchError, match=r"hunk 1 of 1 \(@@ -1 \+1,2 @@\)"):
        patchfile.apply(diff, "x\n", REL, "0.5.23")


def test_files_without_a_final_newline_round_trip():
    up = module(n=5).rstrip("\n")
    for edited in (up.replace("return 4", "return 44"),   # near the end: still none
                   up.replace("return 1\n", "return 11\n"),  # far from the end
                   up + "\n",                              # one added
                   module(n=5).replace("return 4\n", "return 44")):  # one taken away
        diff = patchfile.make(REL, up, edited, "0.5.23", SHA_OLD)
        assert patchfile.apply(diff, up, REL, "0.5.23") == edited
    diff = patchfile.make(REL, up, up + "\n", "0.5.23", SHA_OLD)
    assert "\\ No newline at end of file\n" in diff


def test_apply_keeps_the_installed_line_endings():
    up = module(n=10)
    diff = patchfile.make(REL, up, edit(up), "0.5.23", SHA_OLD)
    crlf = up.replace("\n", "\r\n")
    assert patchfile.apply(diff, crlf, REL, "0.5.23") == edit(up).replace("\n", "\r\n")


def test_a_blank_context_line_that_lost_its_space_still_applies():
    up = "a\n\nb\nc\n"
    diff = patchfile.make(REL, up, "a\n\nB\nc\n", "0.5.23", SHA_OLD)
    assert "\n \n" in diff
    assert patchfile.apply(diff.replace("\n \n", "\n\n"), up, REL, "0.5.23") == "a\n\nB\nc\n"


def test_a_diff_of_another_file_or_of_several_files_or_of_nothing_is_refused():
    up = module()
    diff = patchfile.make(REL, up, edit(up), "0.5.23", SHA_OLD)
    other = diff.replace(f"sglang/{REL}", "sglang/srt/models/llama.py")
    with pytest.raises(PatchError, match=r"\.patch changes a/sglang/srt/models/llama.py, "
                                         r"not sglang/srt/models/deepseek_v2.py$"):
        patchfile.apply(other, up, REL, "0.5.23")
    body = diff.split("\n", 1)[1]
    with pytest.raises(PatchError, match=r"changes 2 files"):
        patchfile.apply(diff + body.replace(f"sglang/{REL}", "sglang/srt/models/llama.py"), up, REL, "0.5.23")
    with pytest.raises(PatchError, match=r"has no hunks"):
        patchfile.apply("# specops-base: sglang 0.5.23\n", up, REL, "0.5.23")
    # A site-packages path names the same file.
    site = diff.replace(f"a/sglang/{REL}", f"a/venv/lib/python3.11/site-packages/sglang/{REL}")
    assert patchfile.apply(site, up, REL, "0.5.23") == edit(up)


def test_base_of_reads_either_order_and_says_none_when_absent():
    assert patchfile.base_of(f"# specops-base: sglang 0.5.23 sha256:{SHA_OLD}\n") == Base("0.5.23", SHA_OLD)
    assert patchfile.base_of(f"# specops-base: sha256:{SHA_OLD.upper()} sglang 0.5.23\n") == Base("0.5.23", SHA_OLD)
    assert patchfile.base_of("# specops-base: sglang 0.5.3rc0\n") == Base("0.5.3rc0", None)
    assert patchfile.base_of(f"# specops-base: sha256:{SHA_OLD}\n") == Base(None, SHA_OLD)
    whole = "# Copyright\n" * 20 + "# specops-base: sglang 0.5.23\nimport torch\n"
    assert patchfile.base_of(whole) == Base("0.5.23", None)
    assert patchfile.base_of("import torch\n") is None
    assert patchfile.base_of("x = 1\n" * 30 + "# specops-base: sglang 0.5.23\n") is None  # too far down
    with pytest.raises(PatchError, match="unreadable base line"):
        patchfile.base_of("# specops-base: sglang\n")


def test_check_whole_file_wants_the_installed_upstream_file():
    with pytest.raises(PatchError) as e:
        patchfile.check_whole_file("import torch\n", REL, "0.5.23", SHA_OLD, False)
    assert str(e.value) == (f"patch sglang/{REL} says no base: add a line '# specops-base: sglang <version>' "
                            f"naming the sglang version it was cut from, or set patch_any_base")
    with pytest.raises(PatchError) as e:
        patchfile.check_whole_file("# specops-base: sglang 0.5.23\n", REL, "0.5.24", SHA_NEW, False)
    assert str(e.value) == (f"patch sglang/{REL} was cut from sglang 0.5.23; the installed file is "
                            f"sglang 0.5.24's (sha256 bbbbbbbb…)")
    with pytest.raises(PatchError, match=r"cut from sglang 0.5.23 \(sha256 aaaaaaaa…\); .* sglang 0.5.23's"):
        patchfile.check_whole_file(f"# specops-base: sglang 0.5.23 sha256:{SHA_OLD}\n", REL, "0.5.23", SHA_NEW, False)
    patchfile.check_whole_file("# specops-base: sglang 0.5.23\n", REL, "0.5.23", SHA_OLD, False)
    # The sha256 decides: a release that left the file alone still fits.
    patchfile.check_whole_file(f"# specops-base: sglang 0.5.23 sha256:{SHA_OLD}\n", REL, "0.5.24", SHA_OLD, False)
    patchfile.check_whole_file("import torch\n", REL, "0.5.24", SHA_NEW, True)
    patchfile.check_whole_file("# specops-base: sglang 0.4.0\n", REL, "0.5.24", SHA_NEW, True)


def test_rebase_onto_an_upstream_changed_elsewhere_gives_a_patch_for_it():
    old = module()
    diff = patchfile.make(REL, old, edit(old), "0.5.23", SHA_OLD)
    new = module(top=["import os\n"] * 4, change={"return 30\n": "return 30  # upstream\n"})
    text, conflicts = patchfile.rebase(diff, old, new, REL, "0.5.24", SHA_NEW)
    assert conflicts == []
    assert text.startswith(f"# specops-base: sglang 0.5.24 sha256:{SHA_NEW}\n--- a/sglang/{REL}\n")
    assert patchfile.apply(text, new, REL, "0.5.24") == edit(new)
    assert "return 30  # upstream\n" in edit(new)


def test_rebase_onto_an_upstream_changed_at_the_same_lines_shows_conflicts():
    old = module()
    diff = patchfile.make(REL, old, edit(old), "0.5.23", SHA_OLD)
    new = module(change={"return 50\n": "return 500\n"})
    text, conflicts = patchfile.rebase(diff, old, new, REL, "0.5.24", SHA_NEW)
    assert conflicts == [Conflict(2, 2, "@@ -99,7 +99,7 @@", (102, 102), "0.5.24")]
    assert ("<<<<<<< patched (sglang 0.5.23)\n    return -50\n"
            "||||||| sglang 0.5.23 (the patch's base)\n    return 50\n"
            "=======\n    return 500\n>>>>>>> sglang 0.5.24\n") in text
    assert "return 3  # patched\n" in text  # the hunk that did not conflict is merged


def test_a_conflict_names_its_hunk_and_its_lines_in_the_new_upstream():
    old = module()
    edited = edit(old).replace("return 30\n", "return -30\n")
    diff = patchfile.make(REL, old, edited, "0.5.23", SHA_OLD)
    # The new release adds 5 lines at the top and rewrites f30's line (old line 62) as two.
    new = module(top=["import os\n"] * 5, change={"    return 30\n": "    y = 30\n    return y\n"})
    text, conflicts = patchfile.rebase(diff, old, new, REL, "0.5.24", SHA_NEW)
    assert [str(c) for c in conflicts] == ["hunk 2 of 3 (@@ -59,7 +59,7 @@) against sglang 0.5.24's lines 67-68"]
    assert "".join(new.splitlines(True)[66:68]) == "    y = 30\n    return y\n"
    assert ("<<<<<<< patched (sglang 0.5.23)\n    return -30\n"
            "||||||| sglang 0.5.23 (the patch's base)\n    return 30\n"
            "=======\n    y = 30\n    return y\n>>>>>>> sglang 0.5.24\n") in text
    assert text.count("<<<<<<<") == 1 and "return 3  # patched\n" in text and "return -50\n" in text


def test_a_conflict_two_hunks_reach_names_both():
    old = module()
    edited = old.replace("return 20\n", "return -20\n").replace("return 30\n", "return -30\n")
    diff = patchfile.make(REL, old, edited, "0.5.23", SHA_OLD)
    assert diff.count("\n@@ -") == 2
    # Upstream rewrote f20 through f30 (old lines 41-62) into one function.
    body = "".join(f"def f{i}():\n    return {i}\n" for i in range(20, 31))
    new = old.replace(body, "def f20_to_30(i):\n    return i\n")
    text, conflicts = patchfile.rebase(diff, old, new, REL, "0.5.24", SHA_NEW)
    assert [(c.hunk, c.of, c.new_lines) for c in conflicts] == [(1, 2, (41, 42)), (2, 2, (41, 42))]
    assert [c.header for c in conflicts] == [line for line in diff.splitlines() if line.startswith("@@")]
    assert text.count("<<<<<<<") == 1


def test_a_conflict_where_upstream_removed_the_lines_says_so():
    assert str(Conflict(1, 2, "@@ -9,7 +9,6 @@", (40, 39), "0.5.24")) == (
        "hunk 1 of 2 (@@ -9,7 +9,6 @@) against sglang 0.5.24's removal of its lines, before line 40")
    assert str(Conflict(1, 1, "@@ -9,7 +9,6 @@", (40, 40))) == (
        "hunk 1 of 1 (@@ -9,7 +9,6 @@) against the new upstream's line 40")


def test_rebase_refuses_a_patch_upstream_already_has():
    old = module()
    diff = patchfile.make(REL, old, edit(old), "0.5.23", SHA_OLD)
    with pytest.raises(PatchError, match="already has its changes"):
        patchfile.rebase(diff, old, edit(old), REL, "0.5.24", SHA_NEW)


def test_make_refuses_no_change():
    with pytest.raises(PatchError, match="unchanged"):
        patchfile.make(REL, "a\n", "a\n", "0.5.23", SHA_OLD)


def test_digests():
    """The agent reads the installed file's sha256 from its wheel's RECORD (urlsafe base64)."""
    from specops.agent.converge import upstream
    data = b"def f():\n    return 1\n"
    hexdigest = hashlib.sha256(data).hexdigest()
    assert patchfile.upstream_sha256(data) == hexdigest
    record = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")
    assert upstream.record_digest_to_hex(record) == hexdigest
    assert upstream.record_digest_to_hex("md5=abcd") is None
    assert upstream.record_digest_to_hex("") is None
    assert upstream.record_digest_to_hex("sha256=abc") is None


def test_the_agent_finds_a_file_in_its_packages_record(tmp_path):
    from specops.agent.converge import upstream
    data = b"MODEL_CODE = 'upstream'\n"
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")
    for version, line in (("0.5.22", "sglang/srt/models/llama.py,sha256=AAAA,3\n"),
                          ("0.5.23", f"sglang/srt/models/llama.py,sha256={digest},{len(data)}\n")):
        (tmp_path / f"sglang-{version}.dist-info").mkdir()
        (tmp_path / f"sglang-{version}.dist-info" / "RECORD").write_text(line)
    got = upstream.record_sha256(str(tmp_path), "sglang", "0.5.23", "srt/models/llama.py")
    assert got == hashlib.sha256(data).hexdigest()  # the installed version's RECORD, not another's
    assert upstream.record_sha256(str(tmp_path), "sglang", "0.5.23", "srt/models/other.py") is None
    assert upstream.record_sha256(str(tmp_path), "sglang", "0.5.22", "srt/models/llama.py") is None  # malformed


def test_a_hunk_is_placed_only_where_it_is_unambiguous():
    up = "x = 1\nA\nB\nC\ny = 2\nA\nB\nC\n"
    diff = patchfile.make(REL, "A\nB\nC\n", "A\nB2\nC\n", "0.5.23", SHA_OLD)
    with pytest.raises(PatchError) as e:
        patchfile.apply(diff, up, REL, "0.5.24")  # the context stands twice, neither at its line
    assert str(e.value) == (f"patch sglang/{REL}.patch: hunk 1 of 1 (@@ -1,3 +1,3 @@) is ambiguous in sglang "
                            f"0.5.24's {REL}: its lines stand at lines 2 and 6")
    with pytest.raises(PatchError, match=r"its lines stand at lines 2, 6, 10, …$"):
        patchfile.apply(diff, up + "z = 3\nA\nB\nC\n" * 2, REL, "0.5.24")
    # At its stated line it goes there, whatever else matches below.
    assert patchfile.apply(diff, "A\nB\nC\nA\nB\nC\n", REL, "0.5.24") == "A\nB2\nC\nA\nB\nC\n"
    no_context = "--- a/sglang/%s\n+++ b/sglang/%s\n@@ -2 +2 @@\n-B\n+B2\n" % (REL, REL)
    with pytest.raises(PatchError, match=r"no context lines, .* cut it with context \(as --edited does\)$"):
        patchfile.apply(no_context, "A\nB\nC\n", REL, "0.5.23")


def test_an_ambiguous_hunk_is_carried_on_by_inv_patch_rebase_as_its_hint_says():
    """Issue 50, 10: the refusal said "cut it with more context (diff -U5)", which inv patch does
    not do.  On a deploy it says what inv patch does (--rebase), and that places the hunk: a
    three-way merge aligns the whole file the patch was cut from, far more context than any -U."""
    from specops.inventory import Host
    from specops.sglang import patches
    up = module()
    diff = patchfile.make(REL, up, edit(up), "0.5.23", SHA_OLD)
    block = "def f2():\n    return 2\ndef f3():\n    return 3\ndef f4():\n    return 4\ndef f5():\n    return 5\n"
    # the next release adds lines at the top and, further down, a copy of the lines around f3
    new = module(top=["import os\n"] * 7, change={"def f30():\n": block + "def f30():\n"})
    with pytest.raises(patchfile.HunkError) as e:
        patches.applied(Host("box", {}), diff, new, REL, "0.5.24")
    assert str(e.value).endswith("is ambiguous in sglang 0.5.24's srt/models/deepseek_v2.py: its lines stand at "
                                 f"lines 12 and 68; carry it onto sglang 0.5.24 with: inv patch --host box {REL} "
                                 f"--rebase"), str(e.value)
    rebased, conflicts = patchfile.rebase(diff, up, new, REL, "0.5.24", SHA_NEW)
    by_hand = new.replace("return 3\n", "return 3  # patched\n", 1).replace("return 50\n", "return -50\n")
    assert conflicts == [] and patchfile.apply(rebased, new, REL, "0.5.24") == by_hand  # the f3 it was cut at


def test_a_hunk_never_goes_where_an_earlier_hunk_already_went():
    """Two hunks whose context stands twice, both saying line 1: the second goes after the first,
    never back over the lines the first one placed."""
    diff = (f"--- a/sglang/{REL}\n+++ b/sglang/{REL}\n"
            "@@ -1,3 +1,3 @@\n A\n-B\n+B1\n C\n"
            "@@ -1,3 +1,3 @@\n A\n-B\n+B2\n C\n")
    assert patchfile.apply(diff, "A\nB\nC\nx\nA\nB\nC\n", REL, "0.5.24") == "A\nB1\nC\nx\nA\nB2\nC\n"


def test_a_hunk_that_ends_the_file_goes_at_its_end_even_where_its_lines_stand_earlier():
    """'\\ No newline at end of file' anchors a hunk at the end: the same lines at its stated line
    are not where it goes."""
    diff = patchfile.make(REL, "A\nB", "A\nB2", "0.5.23", SHA_OLD)
    assert "\\ No newline" in diff
    assert patchfile.apply(diff, "A\nB\nx\nA\nB", REL, "0.5.24") == "A\nB\nx\nA\nB2"
