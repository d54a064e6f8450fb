"""Which inventory a task reads (issue 38): a directory's hosts files, YAML or its one Ansible INI
file with group_vars/ and host_vars/ beside it, and the default, which is never the example."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specops import cli, inventory
from specops.errors import UsageError
from specops.inventory.ansible import _one_edit
from roles import VOCABULARY
from support.inventories import write

ROOT = Path(__file__).resolve().parent.parent


VARS_BESIDE = {"group_vars/gpu.yml": "venv: /opt/gpu\n", "host_vars/box1.yml": "ssh_port: 2200\n"}


@pytest.mark.parametrize("name", ["hosts.ini", "hosts", "production"])
def test_a_directory_with_one_ini_file_reads_it_and_the_vars_beside_it(tmp_path, name):
    write(tmp_path, {name: "[gpu]\nbox1 ansible_host=10.9.0.1\nbox2 ansible_host=10.9.0.2\n",
                     "README": "Our GPU boxes, as Ansible knows them.\n", "notes.txt": "x=1\n", **VARS_BESIDE})
    inv = inventory.load(tmp_path, VOCABULARY)
    assert inv.path == tmp_path / name
    b1, b2 = inv.hosts["box1"], inv.hosts["box2"]
    assert (b1["address"], b1["venv"], b1["ssh_port"]) == ("10.9.0.1", "/opt/gpu", 2200)
    assert (b2["venv"], b2.get("ssh_port")) == ("/opt/gpu", None)


def test_two_ini_files_in_a_directory_are_refused_naming_both(tmp_path):
    write(tmp_path, {"hosts": "box1\n", "hosts.ini": "box2\n"})
    with pytest.raises(UsageError) as e:
        inventory.load(tmp_path, VOCABULARY)
    assert str(e.value) == (f"{tmp_path}: hosts, hosts.ini could each be the inventory: "
                            f"give one with -i {tmp_path}/hosts")


def test_a_directory_without_hosts_says_what_it_looks_for(tmp_path):
    write(tmp_path, {"README": "Our GPU boxes, as Ansible knows them.\n", "group_vars/all.yml": "venv: /v\n"})
    with pytest.raises(UsageError, match=r": no hosts.yml or INI inventory \(hosts.ini\) in the inventory directory$"):
        inventory.load(tmp_path, VOCABULARY)


# --- an ansible_* key one typo away from one specops reads ---------------------------------------

@pytest.mark.parametrize("typed,known,one", [
    ("ansible_usr", "ansible_user", True), ("ansible_userr", "ansible_user", True),
    ("ansible_usex", "ansible_user", True), ("ansible_uesr", "ansible_user", True),
    ("ansible_user", "ansible_user", False), ("ansible_ssh_user", "ansible_user", False),
    ("ansible_sure", "ansible_user", False), ("ansible_por", "ansible_host", False),
])
def test_one_edit_is_one_letter_added_dropped_changed_or_two_swapped(typed, known, one):
    assert _one_edit(typed, known) is one


def test_a_typo_of_an_ansible_key_is_refused_and_others_named_with_the_nearest(tmp_path, capsys):
    write(tmp_path, {"typo.ini": "box ansible_host=10.9.0.1 ansible_uesr=ubuntu\n",
                     "old.ini": "box ansible_host=10.9.0.1 ansible_ssh_user=ubuntu "
                                "ansible_python_interpreter=/usr/bin/python3\n"})
    with pytest.raises(UsageError) as e:
        inventory.load(tmp_path / "typo.ini", VOCABULARY)
    assert str(e.value) == (f"{tmp_path}/typo.ini: all.children.ungrouped.hosts.box.ansible_uesr: unknown key "
                            f"(did you mean 'ansible_user'?)")
    old = inventory.load(tmp_path / "old.ini", VOCABULARY).hosts["box"]
    err = capsys.readouterr().err
    assert old["ssh_user"] == "ubuntu"  # Ansible's older spelling, read as it reads it
    assert "ansible_python_interpreter is not used by specops; ignored\n" in err, err


def test_ansibles_older_spellings_are_read_and_two_spellings_of_one_key_refused(tmp_path):
    write(tmp_path, {"old.ini": "box ansible_ssh_host=10.9.0.2 ansible_ssh_port=2222 ansible_private_key_file=/k\n",
                     "both.ini": "box ansible_user=a ansible_ssh_user=b\n"})
    box = inventory.load(tmp_path / "old.ini", VOCABULARY).hosts["box"]
    assert (box["address"], box["ssh_port"], box["ssh_key"]) == ("10.9.0.2", 2222, "/k")
    with pytest.raises(UsageError, match="both ansible_user and ansible_ssh_user are set; keep one spelling"):
        inventory.load(tmp_path / "both.ini", VOCABULARY)


def test_ansibles_own_variables_are_never_taken_for_typos(tmp_path):
    """Ansible's connection and become variables specops does not read stay warnings, not errors."""
    theirs = ["ansible_connection", "ansible_password", "ansible_ssh_pass",
              "ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_pipelining",
              "ansible_ssh_executable", "ansible_become_user", "ansible_become_exe",
              "ansible_become_flags", "ansible_shell_type", "ansible_shell_executable", "ansible_python_interpreter",
              "ansible_timeout", "ansible_pipelining", "ansible_network_os", "ansible_sudo", "ansible_su"]
    write(tmp_path, {"hosts.ini": "box " + " ".join(f"{k}=x" for k in theirs) + "\n"})
    assert inventory.load(tmp_path / "hosts.ini", VOCABULARY).hosts["box"].vars == {}


# --- the default inventory ----------------------------------------------------------------------

def test_without_inventory_or_i_a_task_refuses_and_never_takes_the_example(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECOPS_INVENTORY", raising=False)
    monkeypatch.setattr(cli, "DEFAULT_INVENTORY", tmp_path / "inventory")
    monkeypatch.chdir(ROOT)
    with pytest.raises(UsageError) as e:
        cli.select(cli.Selection(host="ct129"), VOCABULARY)
    assert str(e.value) == ("no inventory: give -i DIR|FILE, or copy inventory.example/ to "
                            f"{os.path.relpath(tmp_path / 'inventory')}/ (the default) and make it yours")
    write(tmp_path / "inventory", {"hosts.yml": "all: {hosts: {mine: {address: 10.9.0.7}}}\n"})
    assert [h["address"] for h in cli.select(cli.Selection(host="mine"), VOCABULARY)] == ["10.9.0.7"]
    assert cli.inventory_path("other/") == "other/"
    monkeypatch.setenv("SPECOPS_INVENTORY", "elsewhere/")
    assert cli.inventory_path(None) == "elsewhere/" and cli.inventory_path("other/") == "other/"


def test_the_example_ships_apart_from_the_default_which_git_ignores():
    assert cli.DEFAULT_INVENTORY == ROOT / "inventory" and (cli.EXAMPLE_INVENTORY / "hosts.yml").exists()
    assert "/inventory/" in (ROOT / ".gitignore").read_text().splitlines()


@pytest.mark.skipif((ROOT / "inventory").exists(), reason="this clone has an inventory/ of its own")
def test_a_fresh_clone_refuses_a_task_in_one_line():
    env = {k: v for k, v in os.environ.items() if k != "SPECOPS_INVENTORY"}
    res = subprocess.run([sys.executable, "-m", "invoke", "deploy", "--host", "ct129"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode == 2 and res.stdout == "", res.stdout
    assert res.stderr == ("error: no inventory: give -i DIR|FILE, or copy inventory.example/ to inventory/ "
                          "(the default) and make it yours\n")


@pytest.mark.parametrize("text, ini", [
    ("inventory\n\nOur boxes, as Ansible knows them.\n", False), ("all:\n\tpython -m pytest\n", False),
    ("# hosts\nbox1\nbox2 ansible_host=10.0.0.2\n[gpu]\nbox1\n[gpu:vars]\nansible_user=root\n", True),
    ("web[01:09].example.com\n", True), ("\n# only a comment\n", False),
])
def test_a_file_without_a_suffix_is_an_ini_inventory_only_when_every_line_reads_as_one(tmp_path, text, ini):
    from specops.inventory.ansible import looks_like_ini
    (tmp_path / "f").write_text(text)
    assert looks_like_ini(tmp_path / "f") is ini
