"""Inventory loading, precedence, selection and validation: no fleet needed."""
import re

import pytest

from specops import inventory
from specops.errors import UsageError
from roles import VOCABULARY
from support.inventories import run_without_connecting, write


def test_precedence_all_parent_child_host(tmp_path):
    inv = inventory.load(write(tmp_path, {
        "hosts.yml": """
            all:
              vars: {venv: /all, ssh_port: 22, torch: {version: "2.9.1", cuda: auto}}
              children:
                parent:
                  vars: {venv: /parent, ssh_user: p}
                  children:
                    child:
                      vars: {venv: /child}
                      hosts:
                        a: {ssh_user: hostuser}
                        b:
            """,
        "group_vars/child.yml": "ssh_port: 2222\n",
        "host_vars/b.yml": "torch: {cuda: cu128}\n",
    }), VOCABULARY)
    a, b = inv.hosts["a"], inv.hosts["b"]
    assert a["venv"] == "/child" and b["venv"] == "/child"          # child group beats parent and all
    assert a["ssh_user"] == "hostuser" and b["ssh_user"] == "p"     # host beats groups
    assert a["ssh_port"] == 2222                                    # group_vars file applies
    assert b["torch"] == {"version": "2.9.1", "cuda": "cu128"}      # mappings merge key by key
    assert set(inv.groups) == {"all", "parent", "child"}
    assert [h.name for h in inv.select(group="parent")] == ["a", "b"]


def test_selection_by_host_group_and_all(tmp_path):
    inv = inventory.load(write(tmp_path, {"hosts.yml": """
        all:
          children:
            g1: {hosts: {a: , b: }}
            g2: {hosts: {c: }}
        """}), VOCABULARY)
    assert [h.name for h in inv.select()] == ["a", "b", "c"]
    assert [h.name for h in inv.select(host="c,a")] == ["c", "a"]
    assert [h.name for h in inv.select(group="g2")] == ["c"]
    with pytest.raises(UsageError, match="unknown host 'zz'"):
        inv.select(host="a,zz")
    with pytest.raises(UsageError, match="unknown group 'nope'"):
        inv.select(group="nope")


def test_example_inventory_loads():
    inv = inventory.load(inventory.Path(__file__).parent.parent / "inventory.example" / "hosts.yml", VOCABULARY)
    ct129 = inv.hosts["ct129"]
    assert ct129["address"] == "10.1.230.172" and ct129["ssh_user"] == "root"
    assert "gpu_boxes" in ct129.groups and ct129["torch"]["cuda"] == "auto"


BAD = {
    "yaml syntax": ("hosts.yml", "all:\n  hosts:\n    a: {address: [1, 2\n", r"hosts.yml:\d+: invalid YAML"),
    "unknown host key": ("hosts.yml", "all:\n  hosts:\n    a: {adress: 1.2.3.4}\n",
                         r"hosts.yml: all.hosts.a.adress: unknown key \(did you mean 'address'\?\)"),
    "wrong type": ("hosts.yml", "all:\n  hosts:\n    a: {ssh_port: twenty}\n",
                   r"all.hosts.a.ssh_port: must be an integer, not a string"),
    "bool is not a port": ("hosts.yml", "all:\n  hosts:\n    a: {ssh_port: yes}\n",
                           r"ssh_port: must be an integer, not a boolean"),
    "unknown group key": ("hosts.yml", "all:\n  childs: {}\n", r"all.childs: unknown key"),
    "top level": ("hosts.yml", "gpu_boxes: {}\n", r"the top level must be a single key 'all'"),
    "service without model": ("hosts.yml", "all:\n  hosts:\n    a:\n      services: [{name: s}]\n",
                              r"hosts.yml: a: services\[0\].model_path: required key is missing \(kind sglang\)"),
    "router without workers": ("hosts.yml", "all:\n  hosts:\n    a:\n      services: [{name: r, kind: router}]\n",
                               r"a: services\[0\].workers: required key is missing \(kind router\)"),
    "bad enum": ("hosts.yml", "all:\n  hosts:\n    a: {host_key_policy: yolo}\n",
                 r"host_key_policy: must be one of reject, accept-new"),
    "bad group_vars": ("group_vars/all.yml", "venv: [1]\n", r"group_vars/all.yml: venv: must be a string"),
    # Issue 38: a typo in an Ansible connection key was ignored, and the run logged in as someone else.
    "ansible key typo": ("hosts.yml", "all:\n  hosts:\n    a: {ansible_usr: ubuntu}\n",
                         r"hosts.yml: all.hosts.a.ansible_usr: unknown key \(did you mean 'ansible_user'\?\)"),
    "ansible key typo in group_vars": ("group_vars/all.yml", "ansible_hsot: 10.0.0.1\n",
                                       r"group_vars/all.yml: ansible_hsot: unknown key "
                                       r"\(did you mean 'ansible_host'\?\)"),
    "an INI file beside hosts.yml": ("hosts.ini", "a\n", r"both hosts.yml and hosts.ini could be the inventory: "
                                                         r"keep one there, or give -i \S+/hosts.ini$"),
    "spec algorithm": ("hosts.yml", "all:\n  hosts:\n    a:\n      services:\n"
                                    "        - {name: s, model_path: /m, speculative: {algorithm: MEDUSA}}\n",
                       r"speculative.algorithm: must be one of EAGLE"),
}


def write_bad(path, case):
    """The case's file, plus a valid hosts.yml when the bad file is another one."""
    rel, text, pattern = BAD[case]
    files = {rel: text}
    if rel != "hosts.yml":
        files["hosts.yml"] = "all:\n  hosts:\n    a: {}\n"
    write(path, files)
    return pattern


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_inventory_is_one_line_naming_file_and_key(tmp_path, case):
    pattern = write_bad(tmp_path, case)
    with pytest.raises(UsageError) as e:
        inventory.load(tmp_path, VOCABULARY)
    msg = str(e.value)
    assert "\n" not in msg
    assert str(tmp_path) in msg
    assert re.search(pattern, msg), msg


@pytest.mark.parametrize("args,pattern", [
    (["deploy", "--host", "nosuch"], "unknown host 'nosuch'"),
    (["deploy", "--group", "nosuch"], "unknown group 'nosuch'"),
    (["facts", "--host", "a", "--group", "g"], "give --host or --group, not both"),
    # A task that changes hosts never defaults to every host of an inventory (issue 11, bug 6).
    (["deploy"], "choose the hosts: --host NAME, --group NAME or --all"),
    (["bootstrap"], "choose the hosts: --host NAME, --group NAME or --all"),
    (["stop"], "choose the hosts: --host NAME, --group NAME or --all"),
    (["rollback"], "choose the hosts: --host NAME, --group NAME or --all"),
    (["deploy", "--all", "--host", "a"], "give --all, or --host/--group, not both"),
])
@pytest.mark.reliability("bad-inventory", "bad-input")
def test_cli_usage_errors_exit_2_without_connecting(tmp_path, args, pattern, record_property):
    from support.reliability import record_inputs
    record_inputs(record_property, "inv " + " ".join(args))
    res, attempts = run_without_connecting(tmp_path, """
        all:
          children:
            g:
              hosts:
                a: {{address: 127.0.0.1, ssh_port: {port}, connect_timeout: 2}}
        """, *args)
    assert res.returncode == 2, res.stderr
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and pattern in lines[0], res.stderr
    assert attempts == 0


@pytest.mark.reliability("bad-inventory", "bad-input")
@pytest.mark.parametrize("case", sorted(BAD))
def test_cli_bad_inventory_exit_2(tmp_path, case, record_property):
    from support.reliability import record_inputs
    from support.site import Sandbox
    record_inputs(record_property, f"an inventory with {case}")
    pattern = write_bad(tmp_path / "inv", case)
    res = Sandbox(None, tmp_path).inv("deploy", inventory=tmp_path / "inv", timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and re.search(pattern, res.stderr), res.stderr
    assert res.stdout == ""  # no host was contacted, so nothing was reported


def test_a_read_only_task_without_a_selection_is_refused_naming_the_groups(tmp_path):
    """Issue 24 (a new user's rough edge): the README said read-only tasks default to every host;
    none does, and the one-line refusal names the groups to choose from."""
    res, attempts = run_without_connecting(tmp_path, """
        all:
          children:
            g:
              hosts:
                a: {{address: 127.0.0.1, ssh_port: {port}, connect_timeout: 2}}
        """, "status")
    assert res.returncode == 2 and attempts == 0, res.stderr
    assert res.stderr.strip().endswith("choose the hosts: --host NAME, --group NAME or --all (groups: g)"), res.stderr


@pytest.mark.parametrize("args,pattern", [
    (["deploy", "--host", "a", "--max-fail", "abc"], "--max-fail: give a whole number from 0 to 100 (got 'abc')"),
    (["deploy", "--host", "a", "-m", "150"], "--max-fail: give a whole number from 0 to 100 (got '150')"),
    (["deploy", "--host", "a", "--serial", "2.5"], "--serial: give a whole number of at least 0 (got '2.5')"),
    (["status", "--host", "a", "--forks", "x"], "--forks: give a whole number of at least 1 (got 'x')"),
    (["spec-bench", "--host", "a", "--requests", "x"], "--requests: give a whole number of at least 1 (got 'x')"),
    (["spec-bench", "--host", "a", "--concurrency", "1,x"], "--concurrency: give positive whole numbers"),
])
def test_a_number_option_given_no_number_is_a_one_line_usage_error(tmp_path, args, pattern):
    """Issue 24 (a new user's rough edge): `--max-fail abc` ended in invoke's ValueError traceback
    (its parser casts a value to its default's type); now the task refuses it in one line, exit 2."""
    res, attempts = run_without_connecting(tmp_path, """
        all:
          hosts:
            a: {{address: 127.0.0.1, ssh_port: {port}, connect_timeout: 2}}
        """, *args)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {pattern}"), res.stderr
    assert attempts == 0 and res.stdout == ""


def test_packages_are_name_equals_version_and_nothing_an_installer_reads_as_an_option(tmp_path):
    """`-r/etc/shadow` would make uv echo a root-only file's first line: refused before connecting."""
    import json
    from specops import inventory
    from specops.errors import UsageError
    for good in ("numpy==2.1.0", "sglang-router==0.3.2", "Foo.Bar_baz==1.0rc1", "transformers[torch]==4.57.1"):
        (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"box": {"packages": [good]}}}}))
        assert inventory.load(tmp_path / "hosts.yml", VOCABULARY).hosts["box"]["packages"] == [good]
    for bad in ("-r/etc/shadow", "--index-url=http://x", "numpy", "numpy>=2", "numpy==2 ; python_version>'3'",
                "/tmp/x.whl", "numpy==", "file:///etc/shadow#egg=x==1"):
        (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"box": {"packages": [bad]}}}}))
        with pytest.raises(UsageError, match=r"packages\[0\]: a package is name==version"):
            inventory.load(tmp_path / "hosts.yml", VOCABULARY)


def test_a_service_user_is_a_plain_system_user_name_never_root(tmp_path):
    """It reaches useradd and the unit's User=: an option, a path or root is refused before connecting."""
    import json
    from specops import inventory
    from specops.errors import UsageError

    def load(user):
        svc = {"name": "sglang", "model_path": "/models/m", "user": user}
        (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"box": {"services": [svc]}}}}))
        return inventory.load(tmp_path / "hosts.yml", VOCABULARY)
    assert load("sglang-svc").hosts["box"]["services"][0]["user"] == "sglang-svc"
    for bad in ("root", "-o", "--system", "a b", "../x", "Alice", "x" * 40, "a;id", ""):
        with pytest.raises(UsageError, match="a user is a plain system user name"):
            load(bad)
