"""The sandbox fleet itself: many hosts on one machine, and a host that does not boot."""
from pathlib import Path

import pytest

from sandbox import fleet, provision

pytestmark = pytest.mark.fleet


def test_fifty_hosts_boot_when_the_inotify_limit_is_low(tmp_path, capfd):
    """Bug 7: each container's systemd holds inotify instances, all counted against root's limit
    (128 by default).  Measured without the fix: 26 of 50 hosts did not boot ("sshd did not answer
    within 60s").  The fleet raises the limit itself, and says so."""
    site = fleet.Site("sol", "192.168.236", tmp_path / "site")
    saved = fleet.INOTIFY.read_text()
    fleet.INOTIFY.write_text("128")
    many = fleet.Fleet([f"m{i}" for i in range(1, 51)], layers=[provision.layer("gpubox")], site=site)
    try:
        many.up()
        assert all(h.pid() for h in many.hosts)
        assert int(fleet.INOTIFY.read_text()) >= 128 + 16 * 50
        err = capfd.readouterr().err
        assert "raised fs.inotify.max_user_instances from 128 to" in err and "50 host(s) up" in err
        assert many["m50"].run("systemctl", "is-system-running", check=False).stdout.strip() in ("running", "degraded")
    finally:
        many.down()
        fleet.INOTIFY.write_text(saved)


def test_a_host_that_does_not_boot_is_one_line_with_its_console(tmp_path):
    broken = tmp_path / "broken-layer"
    init = broken / "usr/lib/systemd/systemd"
    init.parent.mkdir(parents=True)
    init.write_text("#!/bin/sh\necho 'init: cannot mount /proc: this host is broken on purpose'\nexit 1\n")
    init.chmod(0o755)
    site = fleet.Site("sok", "192.168.237", tmp_path / "site")
    f = fleet.Fleet(["k1"], layers=[broken], site=site)
    try:
        with pytest.raises(fleet.BootError) as e:
            f.up()
    finally:
        f.down()
    message = str(e.value)
    assert "\n" not in message and message.startswith("1 of 1 host(s) did not boot; first: k1:")
    assert "this host is broken on purpose" in message
    assert not Path(f"/run/netns/{site.prefix}-k1").exists()
