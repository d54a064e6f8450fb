"""Issue 50, item 3: an inventory mistake is named as what it is, where it is made.  A missing
bracket in an INI file is a missing bracket (not a host range), with its file and line; two
listeners on one port name the port, both and the file and key path that set each."""
import re
import textwrap

import pytest

from roles import VOCABULARY, monitoring, sglang_service
from specops import inventory
from specops.errors import UsageError


def write(tmp_path, files):
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text).lstrip())


@pytest.mark.parametrize("line, says", [
    ("[gpu", "'[gpu' is missing its closing bracket: a group is written [gpu]"),
    ("[gpu:vars", "'[gpu:vars' is missing its closing bracket: a group is written [gpu:vars]"),
    ("gpu]", "'gpu]' is missing its opening bracket: a group is written [gpu]"),
    ("[gpu:hosts]", "'[gpu:hosts]' is not a section: write [group], [group:vars] or [group:children]"),
    ("[[gpu]", "'[[gpu]' has a bracket too many: a group is written [gpu]"),
    ("[gpu:vars]]", "'[gpu:vars]]' has a bracket too many: a group is written [gpu:vars]"),
    ("]gpu", "']gpu' has a closing bracket without its opening one: a group is written [group]"),
    ("[a[b]", "'[a[b]' is not a section: write [group], [group:vars] or [group:children]"),
    ("web[01:09]", "host ranges such as 'web[01:09]' are not supported; list the hosts"),
])
def test_a_section_with_a_bracket_missing_is_named_as_such_with_file_and_line(tmp_path, line, says):
    write(tmp_path, {"hosts.ini": f"# the fleet\nlonely ansible_host=10.9.0.9\n\n{line}\nbox1 ansible_host=10.9.0.1\n"})
    with pytest.raises(UsageError) as e:
        inventory.load(tmp_path / "hosts.ini", VOCABULARY)
    assert str(e.value) == f"{tmp_path / 'hosts.ini'}:4: {says}"


SVC = "{name: %s, model_path: /m, port: 30000}"


def test_two_services_on_one_port_name_the_port_both_and_where_each_is_set(tmp_path):
    write(tmp_path, {"hosts.ini": "[gpu]\nbox1 ansible_host=10.9.0.1\n",
                     "group_vars/gpu.yml": f"services:\n  - {SVC % 'a'}\n",
                     "host_vars/box1.yml": f"services:\n  - {SVC % 'a'}\n  - {SVC % 'b'}\n"})
    h = inventory.load(tmp_path, VOCABULARY).hosts["box1"]
    with pytest.raises(UsageError) as e:
        sglang_service.check(h, h["services"])
    file = tmp_path / "host_vars" / "box1.yml"  # the host's list replaced the group's: it is what runs
    assert str(e.value) == (f"box1: port 30000 is taken twice: by sglang 'a' ({file}: services[0]) "
                            f"and by sglang 'b' ({file}: services[1])")


def test_a_clash_across_files_names_each_file_and_key_path(tmp_path):
    """The service in an INI file's [gpu:vars], monitoring (node_exporter's 9100) in the host's line."""
    write(tmp_path, {"hosts.ini": """
        [gpu]
        box1 ansible_host=10.9.0.1 monitoring=True

        [gpu:vars]
        services=[{'name': 'a', 'model_path': '/m', 'port': 9100}]
        """})
    h = inventory.load(tmp_path, VOCABULARY).hosts["box1"]
    ini = tmp_path / "hosts.ini"
    for refusing in (lambda: sglang_service.check(h, h["services"]), lambda: monitoring.ops(h)):
        with pytest.raises(UsageError, match=re.escape(
                f"box1: port 9100 is taken twice: by sglang 'a' ({ini}: all.children.gpu.vars.services[0]) "
                f"and by node_exporter ({ini}: all.children.gpu.hosts.box1.monitoring)")):
            refusing()


def test_a_group_vars_file_wins_over_the_groups_inline_vars_and_is_named(tmp_path):
    write(tmp_path, {"hosts.yml": f"all:\n  vars:\n    services: [{SVC % 'x'}]\n  hosts:\n    box1: {{}}\n",
                     "group_vars/all.yml": f"services: [{SVC % 'a'}, {SVC % 'b'}]\n"})
    h = inventory.load(tmp_path, VOCABULARY).hosts["box1"]
    assert h.origins["services"] == f"{tmp_path / 'group_vars' / 'all.yml'}: services"
    h = inventory.load(tmp_path / "hosts.yml", VOCABULARY).hosts["box1"]
    assert h.origins["services"] == f"{tmp_path / 'group_vars' / 'all.yml'}: services"
    (tmp_path / "group_vars" / "all.yml").unlink()
    h = inventory.load(tmp_path, VOCABULARY).hosts["box1"]
    assert h.origins["services"] == f"{tmp_path / 'hosts.yml'}: all.vars.services"


def test_a_comment_after_a_section_is_a_comment_as_in_ansible(tmp_path):
    """Ansible's INI plugin takes `[gpu]  # ...` as the section; so the line is no mistake here."""
    write(tmp_path, {"hosts.ini": "[gpu]  # the A100s\nbox1 ansible_host=10.9.0.1\n"})
    assert inventory.load(tmp_path / "hosts.ini", VOCABULARY).groups["gpu"] == ["box1"]


LATIN1 = "# é\n".encode("latin-1")  # a comment an editor saved in Latin-1: the byte 0xe9 alone


@pytest.mark.parametrize("files, bad", [
    ({"hosts.yml": b"all:\n  hosts:\n    box1: {address: 10.9.0.1}\n" + LATIN1}, "hosts.yml"),
    ({"hosts.ini": b"[gpu]\n" + LATIN1 + b"box1 ansible_host=10.9.0.1\n"}, "hosts.ini"),
    ({"hosts.yml": b"all:\n  children:\n    gpu:\n      hosts:\n        box1: {address: 10.9.0.1}\n",
      "group_vars/gpu.yml": b"ssh_user: ops\n" + LATIN1}, "group_vars/gpu.yml"),
    ({"hosts.ini": b"[gpu]\nbox1 ansible_host=10.9.0.1\n", "host_vars/box1.yml": LATIN1}, "host_vars/box1.yml"),
])
def test_a_file_that_is_not_utf8_is_named_in_one_line(tmp_path, files, bad):
    """Issue 50: an inventory file saved in another encoding was a UnicodeDecodeError traceback;
    it is a usage error naming the file and the line, as an edited copy or a prompt file is."""
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    with pytest.raises(UsageError) as e:
        inventory.load(tmp_path, VOCABULARY)
    line = files[bad].split(b"\n").index(LATIN1.rstrip(b"\n")) + 1
    assert str(e.value) == f"{tmp_path / bad} line {line}: not UTF-8 text"
