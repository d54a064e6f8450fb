"""The service user's op (specops/ops/users.py): its two shell programs run for real, with the GPU
nodes moved into a temporary directory and the account tools (getent, id, useradd, usermod)
replaced by ones that keep a passwd of their own.  No fleet."""
import grp
import os
import subprocess

import pytest

from specops.errors import UsageError
from specops.inventory import Host
from specops.ops import users

TOOLS = {
    "getent": 'f=$DB; [ "$1" = shadow ] && f=$DB.shadow; grep "^$2:" "$f" || exit 2',
    "id": 'line=$(grep "^${2:-$1}:" "$DB") || { echo "no such user" >&2; exit 1; }\n'
          'case "$1" in -u) echo "$line" | cut -d: -f3 ;; -nG) echo "$line" | cut -d: -f8 | tr , " " ;; esac',
    "useradd": 'for u; do :; done; c=""; while [ $# -gt 1 ]; do [ "$1" = --comment ] && c=$2; shift; done\n'
               'echo "$1:x:990:990:$c:/nonexistent:/usr/sbin/nologin:$1" >> "$DB"\n'
               'echo "$1:!:20000::::::" >> "$DB.shadow"',
    "usermod": 'g=$3; u=$4; sed -i "s/^\\($u:.*\\)$/\\1,$g/" "$DB"',
}


@pytest.fixture
def box(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, body in TOOLS.items():
        (bin_ / name).write_text("#!/bin/sh\n" + body + "\n")
        (bin_ / name).chmod(0o755)
    dev = tmp_path / "dev"
    dev.mkdir()
    db = tmp_path / "passwd"
    db.write_text("root:x:0:0:root:/root:/bin/bash:root\n")
    return tmp_path, dev, db


def add(db, passwd: str, shadow: str):
    """An account made by someone else: its passwd line and its shadow line."""
    with open(db, "a") as f:
        f.write(passwd)
    with open(f"{db}.shadow", "a") as f:
        f.write(shadow)


def run(box, name, program):
    tmp, dev, db = box
    op = users.system_user(name)
    text = (op.cmd[2] if program == "make" else op.unless).replace("/dev/nvidia", f"{dev}/nvidia")
    return subprocess.run(["/bin/sh", "-c", text], env={"PATH": f"{tmp}/bin:/usr/bin:/bin", "DB": str(db)},
                          capture_output=True, text=True)


def node(dev, name, mode, group="video"):
    path = dev / name
    path.write_text("")
    os.chown(path, 0, grp.getgrnam(group).gr_gid)
    os.chmod(path, mode)


def test_a_missing_user_is_made_marked_as_specops_and_put_in_the_nodes_group(box):
    _, dev, db = box
    node(dev, "nvidiactl", 0o660)
    node(dev, "nvidia0", 0o660)
    node(dev, "nvidia-uvm", 0o666, group="root")  # anyone may open it: no group needed
    assert run(box, "svc", "check").returncode == 1
    made = run(box, "svc", "make")
    assert made.returncode == 0, made.stderr
    assert f":{users.MARK}:" in db.read_text() and db.read_text().rstrip().endswith(",video")
    assert run(box, "svc", "check").returncode == 0  # then nothing to do


def test_an_account_specops_did_not_make_is_refused_whoever_it_is(box):
    _, dev, db = box
    add(db, "alice:x:1000:1000:Alice:/home/alice:/bin/bash:alice\n", "alice:$y$j9T$salt$hash:20000::::::\n")
    for program in ("check", "make"):
        res = run(box, "alice", program)
        assert res.returncode == 3
    assert "user alice exists and is not one specops made (its comment is not" in res.stderr
    assert run(box, "root", "make").returncode == 3  # uid 0, whatever the schema lets through
    assert "alice:x:1000:1000:Alice:/home/alice:/bin/bash:alice\n" in db.read_text()  # not touched


MARKED = f"{users.MARK}"  # what chfn lets a user write as her full name, where it is allowed


@pytest.mark.parametrize("passwd,shadow,why", [
    (f"mallory:x:1001:1001:{MARKED}:/home/mallory:/bin/bash:m", "mallory:$y$j9T$s$h:20000::::::",
     "uid 1001 is not a system account's"),
    (f"mallory:x:991:991:{MARKED}:/nonexistent:/bin/bash:m", "mallory:!:20000::::::",
     "its shell /bin/bash is a login shell"),
    (f"mallory:x:991:991:{MARKED}:/nonexistent:/usr/sbin/nologin:m", "mallory:$y$j9T$s$h:20000::::::",
     "its password is not locked"),
    (f"mallory:x:0:0:{MARKED}:/root:/usr/sbin/nologin:m", "mallory:!:20000::::::", "uid 0 is not a system account's"),
    # dash's echo reads backslashes: \n and \072 (a colon) in the comment forged a nologin shell field
    (f"mallory:x:992:992:{MARKED}\\n\\072\\072\\072\\072\\072\\072/usr/sbin/nologin\\c:/home/m:/bin/bash:m",
     "mallory:!:20000::::::", "its comment is not"),
], ids=["uid", "shell", "password", "root", "escapes"])
def test_the_mark_alone_does_not_make_an_account_specops_s(box, passwd, shadow, why):
    """A login user who set her comment to the mark (chfn) is still not a service user: the
    server, and its secrets, would run as her.  Each of uid, shell and password refuses."""
    _, _, db = box
    add(db, passwd + "\n", shadow + "\n")
    for program in ("check", "make"):
        res = run(box, "mallory", program)
        assert res.returncode == 3 and f"not one specops made ({why}" in res.stderr, res.stderr


@pytest.mark.parametrize("name,mode,group", [("nvidia0", 0o660, "root"), ("nvidia0", 0o600, "video"),
                                             ("nvidiactl", 0o640, "video")])
def test_a_node_the_user_could_not_open_refuses_the_run_naming_it(box, name, mode, group):
    _, dev, _ = box
    node(dev, name, mode, group)
    res = run(box, "svc", "make")
    assert res.returncode == 3 and f"{dev}/{name} is root:{group} {mode:o}: user svc could not open it" in res.stderr


def test_two_services_of_a_host_never_share_a_user():
    host = Host("box", {"services": [{"name": "a", "user": "svc"}, {"name": "b", "user": "svc"}]})
    with pytest.raises(UsageError, match="services 'a' and 'b' both run as user 'svc'"):
        users.service_users(host, host["services"])
    host = Host("box", {"services": [{"name": "a", "user": "svc"}, {"name": "b"}]})
    assert [op.desc for op in users.service_users(host, host["services"])] == ["user svc (GPU device groups)"]
