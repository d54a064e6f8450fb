"""The user's prompt files (specops/prompts.py) and the load that sends them (flows/specbench.py
Load): a JSON list of strings or JSONL of {"prompt"} / {"messages"} lines; a malformed line refused
in one line naming it; a load's share sampled reproducibly; the set named in the result by its
digest and counts.  No fleet needed."""
import hashlib
import json

import pytest

from specops import prompts
from specops.errors import SpecopsError
from specops.flows.specbench import Load

CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]}


def write(tmp_path, text, name="p.jsonl"):
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return str(path)


def test_a_json_list_of_strings_is_read_as_before(tmp_path):
    path = write(tmp_path, json.dumps(["a", "b"]), "p.json")
    assert prompts.read(path).prompts == ["a", "b"]
    assert len(prompts.read().prompts) == len(json.loads(prompts.DEFAULT.read_text()))  # files/prompts.json


def test_jsonl_lines_are_prompts_or_messages_in_file_order(tmp_path):
    lines = ['{"prompt": "one", "id": 7}', "", "   ", json.dumps({**CHAT, "meta": {"x": 1}}),
             json.dumps({"messages": [{"role": "tool", "content": "42", "tool_call_id": "c1"}]})]
    assert prompts.read(write(tmp_path, "\n".join(lines) + "\n")).prompts == [
        "one", CHAT, {"messages": [{"role": "tool", "content": "42"}]}]  # other keys left out


def test_a_file_an_editor_started_with_a_byte_order_mark_is_read(tmp_path):
    bom = b"\xef\xbb\xbf"
    assert prompts.read(write(tmp_path, bom + b'{"prompt": "one"}\n')).prompts == ["one"]
    assert prompts.read(write(tmp_path, bom + b'["a"]', "p.json")).prompts == ["a"]


@pytest.mark.parametrize("lines, where, why", [
    (['{"prompt": "a"}', '{"prompt": "b" "c"}'], "line 2", "not JSON (Expecting ',' delimiter at column 16)"),
    (['{"prompt": "a"}', "", '{"text": "b"}'], "line 3",
     'needs "prompt" (a string) or "messages" (a list of {role, content})'),
    (['"just a string"'], "line 1", 'in a JSON object, not a string'),
    (['{"prompt": 3}'], "line 1", '"prompt" is a number, not a string'),
    (['{"prompt": "a", "messages": []}'], "line 1", 'has both "prompt" and "messages"'),
    (['{"messages": "hi"}'], "line 1", '"messages" is a string'),
    (['{"prompt": "a"}', '{"messages": []}'], "line 2", '"messages" is empty'),
    (['{"messages": [{"role": "bot", "content": "x"}]}'], "line 1",
     'messages[0]: role "bot" is not one of system, user, assistant, tool'),
    (['{"messages": [{"role": "user", "content": "x"}, {"role": "user"}]}'], "line 1",
     "messages[1]: content is null, not a string"),
    (['{"messages": [{"role": "user", "content": ["x"]}]}'], "line 1", "messages[0]: content is a list"),
    (['{"messages": [["user", "x"]]}'], "line 1", "messages[0] is a list, not an object"),
])
def test_a_malformed_line_is_refused_in_one_line_that_names_it(tmp_path, lines, where, why):
    path = write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(SpecopsError) as e:
        prompts.read(path)
    said = str(e.value)
    assert said.startswith(f"prompts {path} {where}: ") and why in said and "\n" not in said, said


@pytest.mark.parametrize("content, why", [
    ("", "empty (no prompts)"), ("\n  \n", "empty (no prompts)"), ("[]", "empty (no prompts)"),
    ('["a", 3]', "item 1 of the JSON list is a number, not a string"),
    ('["a",\n "b"\n "c"]', "line 3: not JSON (Expecting ',' delimiter at column 2)"),
    (b'{"prompt": "a"}\n{"prompt": "\xff"}\n', "line 2: not UTF-8 text"),
    (b'\xef\xbb\xbf{"prompt": "a"}\n\xff\n', "line 2: not UTF-8 text"),  # counted past a byte order mark
])
def test_an_empty_or_broken_file_is_refused(tmp_path, content, why):
    path = write(tmp_path, content)
    with pytest.raises(SpecopsError) as e:
        prompts.read(path)
    sep = " " if why.startswith("line") else ": "
    assert str(e.value).startswith(f"prompts {path}{sep}{why}"), str(e.value)


def test_a_missing_file_is_refused():
    with pytest.raises(SpecopsError, match=r"^prompts /nonexistent/p\.jsonl: No such file or directory$"):
        prompts.read("/nonexistent/p.jsonl")


def test_what_is_not_a_regular_file_is_refused_without_waiting_for_it(tmp_path):
    """--prompts a FIFO (or a device; a directory) is refused at once: reading one could wait for
    ever, or never end.  Read in a thread: were it to block, the test opens the FIFO's other end
    to let it go, and fails."""
    import os
    import threading
    fifo = tmp_path / "p.fifo"
    os.mkfifo(fifo)
    said = []

    def read():
        try:
            prompts.read(str(fifo))
        except SpecopsError as e:
            said.append(str(e))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # an end of file for the blocked open's read
        reader.join(5)
        pytest.fail(f"prompts.read waited on a FIFO ({said})")
    assert said == [f"prompts {fifo}: not a regular file"]
    with pytest.raises(SpecopsError, match=rf"^prompts {tmp_path}: Is a directory$"):
        prompts.read(str(tmp_path))


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """A prompt file is read whole into memory: one larger than prompts.LIMIT (a wrong path: a disk
    image, a log) is refused.  A small limit and a small file stand in for 256 MiB."""
    monkeypatch.setattr(prompts, "LIMIT", 16)
    path = write(tmp_path, json.dumps(["a", "b", "c", "d"]), "p.json")  # 20 bytes
    with pytest.raises(SpecopsError, match=rf"^prompts {path}: 20 bytes, more than a prompt file may hold \(16\)"):
        prompts.read(path)
    monkeypatch.setattr(prompts, "LIMIT", 20)
    assert prompts.read(path).prompts == ["a", "b", "c", "d"]


def test_a_load_samples_its_share_reproducibly_in_file_order(tmp_path):
    path = write(tmp_path, "".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(50)))
    load = Load(requests=8, seed=3, prompts=path)
    picked = load.prompt_list()
    assert len(picked) == 8 == len(set(picked)) and picked == load.prompt_list()
    assert picked == sorted(picked, key=lambda p: int(p[1:]))  # in file order
    others = {tuple(Load(requests=8, seed=s, prompts=path).prompt_list()) for s in range(4, 9)}
    assert tuple(picked) not in others and len(others) > 1
    assert len(Load(requests=64, seed=3, prompts=path).prompt_list()) == 50  # fewer than asked: all of them


def test_the_identity_names_the_set_its_digest_and_counts(tmp_path):
    text = "".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(20))
    path = write(tmp_path, text)
    ident = Load(requests=8, seed=1, prompts=path).identity()
    assert ident["prompts"] == path and ident["prompts_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert (ident["prompts_count"], ident["prompts_sent"]) == (20, 8)
    assert {k: ident[k] for k in ("requests", "seed", "max_new_tokens")} == {"requests": 8, "seed": 1,
                                                                              "max_new_tokens": 128}
    write(tmp_path, text.replace("p19", "p19 "))  # one byte more: another set
    assert Load(requests=8, seed=1, prompts=path).identity()["prompts_sha256"] != ident["prompts_sha256"]
    default = Load().identity()
    assert default["prompts"] == "files/prompts.json"
    assert default["prompts_sha256"] == hashlib.sha256(prompts.DEFAULT.read_bytes()).hexdigest()
