"""A host that refuses root logins: the `ubuntu` user with sudo, without and with a password; and
inventories written for Ansible."""
import json
import re
import subprocess
import sys
import time

import pytest

from sandbox import base, logins
from sandbox.provision import sandbox_service
from support import ROOT
from support.files import load_json
from support.hosts import host_snapshot

pytestmark = pytest.mark.fleet


def run_inv(sandbox, inv, *args, **kw):
    report = sandbox.tmp / f"r{time.monotonic_ns()}.json"
    res = sandbox.inv(*args, "--json", str(report), inventory=inv, **kw)
    return res, (load_json(report)["hosts"] if report.exists() else None)


def test_root_logins_are_refused_and_ubuntu_with_sudo_deploys(sandbox):
    h = sandbox.reset("t1", flavour="ubuntu-sudo")
    as_root = sandbox.inventory({"t1": {"ssh_user": "root", "become": False, "services": [sandbox_service()]}})
    refused = sandbox.inv("facts", "--host", "t1", inventory=as_root)
    assert refused.returncode == 1 and "SSH to root@" in refused.stderr  # PermitRootLogin no
    inv = sandbox.inventory({"t1": {"services": [sandbox_service()]}})
    res, rep = run_inv(sandbox, inv, "deploy", "--host", "t1")
    assert res.returncode == 0, res.stdout
    assert "sglang verified" in rep["t1"]["notes"]
    files = "/etc/systemd/system/sglang.service /etc/specops/sglang.env /usr/local/lib/specops/launch.py"
    owners = h.run("sh", "-c", f"stat -c '%U:%G %a' {files}").stdout.split("\n")
    assert owners[:3] == ["root:root 644", "root:root 600", "root:root 644"]
    before = host_snapshot(h)
    res, rep = run_inv(sandbox, inv, "deploy", "--host", "t1")
    assert res.returncode == 0 and rep["t1"]["changed"] == 0 and rep["t1"]["round_trips"] == 2
    assert host_snapshot(h) == before
    for task in ("verify", "status", "facts", "releases"):
        res = sandbox.inv(task, "--host", "t1", inventory=inv)
        assert res.returncode == 0, (task, res.stdout, res.stderr)
    # The job of a GPU window runs as the login user, or as root with --become.
    res = sandbox.inv("gpu-window", "--host", "t1", "--", "id -un", inventory=inv)
    assert res.returncode == 0 and "| ubuntu" in res.stdout, res.stdout
    res = sandbox.inv("gpu-window", "--host", "t1", "--become", "--", "id -un", inventory=inv)
    assert res.returncode == 0 and "| root" in res.stdout, res.stdout


def test_password_sudo_asks_once_and_the_password_goes_nowhere(sandbox, tmp_path):
    h = sandbox.reset("t2", flavour="ubuntu-sudo-pass")
    password = logins.password(sandbox.fleet.site.state)
    inv = sandbox.inventory({"t2": {"services": [sandbox_service(env={"SGLANG_SIM_STARTUP_DELAY": "2"})]}})
    missing = sandbox.inv("deploy", "--host", "t2", inventory=inv)
    assert missing.returncode == 1
    assert "t2: sudo needs a password for ubuntu and none was given" in missing.stdout, missing.stdout

    seen = []
    report = tmp_path / "deploy.json"
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "deploy", "--host", "t2", "--ask-become-pass",
                             "--json", str(report)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**__import__("os").environ,
                                                                      "SPECOPS_INVENTORY": str(inv)})
    proc.stdin.write(password + "\n")
    proc.stdin.close()
    while proc.poll() is None:  # the process lists of both machines, while it runs
        seen.append(subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout)
        seen.append(h.run("ps", "-eww", "-o", "args", check=False).stdout)
        time.sleep(0.2)
    out = proc.stdout.read()
    assert proc.returncode == 0, out
    assert "sglang verified" in out
    texts = [out, report.read_text(), *seen,
             h.run("sh", "-c", "journalctl --no-pager -o cat; cat /var/lib/specops/releases/*/manifest.json").stdout]
    assert not [t for t in texts if password in t]

    # On a pty (a job run as root), sudo asks on the terminal with echo off: nothing comes back.
    job = sandbox.inv("gpu-window", "--host", "t2", "--become", "--", "id -un", inventory=inv,
                      env={"SPECOPS_BECOME_PASS": password})
    assert job.returncode == 0 and "| root" in job.stdout, job.stdout
    assert password not in job.stdout + job.stderr

    cursor = h.run("journalctl", "-n", "0", "--show-cursor", "--no-pager").stdout.split("-- cursor: ")[1].strip()
    wrong = sandbox.inv("deploy", "--host", "t2", env={"SPECOPS_BECOME_PASS": "not-the-password"}, inventory=inv)
    assert wrong.returncode == 1
    assert "t2: sudo refused the become password for ubuntu (one attempt, no retry)" in wrong.stdout, wrong.stdout
    h.run("journalctl", "--sync")  # a late second try (the lock's give-back once made one) is in the journal too
    attempts = h.run("journalctl", "--no-pager", "-o", "cat", "--after-cursor", cursor, "SYSLOG_IDENTIFIER=sudo").stdout
    # One try, as sudo's own summary says: one line per sudo that was refused.  (pam's own
    # "authentication failure" line is logged with the user's uid, into the user's journal file,
    # which a cursor of the system journal does not order reliably.)
    # "N incorrect password attempt(s)": the number, not the phrase (two attempts say it once too).
    tries = [int(n) for n in re.findall(r"(\d+) incorrect password attempts?", attempts)]
    assert tries == [1], attempts
    assert "not-the-password" not in wrong.stdout + wrong.stderr


def test_not_in_sudoers_and_requiretty_are_one_line_each(sandbox):
    h = sandbox.reset("t3", flavour="ubuntu-sudo")
    inv = sandbox.inventory({"t3": {}})
    h.run("sh", "-c", "echo 'Defaults requiretty' > /etc/sudoers.d/00-tty && chmod 0440 /etc/sudoers.d/00-tty")
    tty = sandbox.inv("facts", "--host", "t3", inventory=inv)
    assert tty.returncode == 1 and "t3: sudo there requires a tty" in tty.stderr, tty.stderr
    # sudo checks the password before sudoers: give ubuntu one, then take its sudo rule away.
    h.run("sh", "-c", "rm /etc/sudoers.d/00-tty /etc/sudoers.d/ubuntu")
    h.run("chpasswd", input="ubuntu:right-password-1\n")
    denied = sandbox.inv("facts", "--host", "t3", inventory=inv, env={"SPECOPS_BECOME_PASS": "right-password-1"})
    assert denied.returncode == 1 and "t3: ubuntu may not use sudo there (not in sudoers)" in denied.stderr, \
        denied.stderr


def test_an_ansible_inventory_works_as_it_is(sandbox, tmp_path):
    """INI and YAML, with ansible_host / ansible_user / ansible_become, and keys of Ansible's own
    that specops does not use (one warning each)."""
    h = sandbox.reset("t4", flavour="ubuntu-sudo")
    from sandbox import provision
    key = base.controller_key()
    known = provision.known_hosts_path(sandbox.fleet.site)
    ini = tmp_path / "ansible" / "hosts.ini"
    ini.parent.mkdir()
    ini.write_text(f"[gpu]\nbox ansible_host={h.address} ansible_user=ubuntu ansible_become=true "
                   f"ansible_ssh_private_key_file={key} ansible_python_interpreter=/usr/bin/python3\n\n"
                   f"[gpu:vars]\nknown_hosts={known}\nventory_note=1\n")
    (tmp_path / "ansible" / "host_vars").mkdir()
    (tmp_path / "ansible" / "host_vars" / "box.yml").write_text(json.dumps({
        "venv": provision.VENV, "services": [sandbox_service(env={"SGLANG_SIM_STARTUP_DELAY": "0"})]}))
    res = sandbox.inv("deploy", "--host", "box", "--inventory", str(ini))
    assert res.returncode == 2 and "ventory_note: unknown key" in res.stderr  # our own keys stay checked
    ini.write_text(ini.read_text().replace("ventory_note=1\n", ""))
    res = sandbox.inv("deploy", "--host", "box", "--inventory", str(ini))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stderr.count("ansible_python_interpreter is not used by specops; ignored") == 1
    assert "box" in res.stdout and "sglang verified" in res.stdout

    yml = tmp_path / "ansible-yml"
    yml.mkdir()
    (yml / "hosts.yml").write_text(json.dumps({"all": {"children": {"gpu": {"hosts": {"box": {
        "ansible_host": h.address, "ansible_user": "ubuntu", "ansible_become": True,
        "ansible_ssh_private_key_file": str(key), "known_hosts": str(known), "venv": provision.VENV,
        "services": [sandbox_service(env={"SGLANG_SIM_STARTUP_DELAY": "0"})]}}}}}}))
    res = sandbox.inv("deploy", "--host", "box", "--inventory", str(yml / "hosts.yml"))
    assert res.returncode == 0 and "changed=0" in res.stdout, res.stdout + res.stderr
    both = json.loads((yml / "hosts.yml").read_text())
    both["all"]["children"]["gpu"]["hosts"]["box"]["address"] = h.address
    (yml / "hosts.yml").write_text(json.dumps(both))
    res = sandbox.inv("deploy", "--host", "box", "--inventory", str(yml / "hosts.yml"))
    assert res.returncode == 2 and "both ansible_host and address are set; keep one spelling" in res.stderr

    # ansible-playbook itself runs on the same INI inventory (the benchmark's ansible-core), as root
    # through ansible_become.
    from bench.run import tools_venv
    play = tmp_path / "whoami.yml"
    play.write_text("- hosts: gpu\n  gather_facts: false\n  tasks:\n    - command: id -un\n      register: who\n"
                    "    - assert: {that: [who.stdout == 'root']}\n")
    ran = subprocess.run([str(tools_venv() / "ansible-playbook"), "-i", str(ini), str(play)], capture_output=True,
                         text=True, env={**__import__("os").environ,
                                         "ANSIBLE_SSH_ARGS": f"-o UserKnownHostsFile={known}"})
    assert ran.returncode == 0 and "ok=2" in ran.stdout and "failed=0" in ran.stdout, ran.stdout + ran.stderr
