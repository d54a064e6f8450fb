"""Whether a Debian package is installed, as the agent reads dpkg's status file
(agent/converge/dpkg.py): the stanzas dpkg writes, every case a probe can meet.  No fleet."""
from specops.agent.converge import dpkg

STATUS = b"""Package: prometheus-node-exporter-collectors
Status: install ok installed
Version: 0.0~git20230203

Package: prometheus-node-exporter
Status: deinstall ok config-files
Version: 1.5.0-1

Package: libc6
Status: install ok not-installed
Architecture: i386

Package: libc6
Status: install ok installed
Architecture: amd64

Package: held
Status: hold ok installed

Package: half
Status: install reinstreq half-installed
"""


def test_installed_is_the_status_last_word_of_the_packages_own_stanza():
    data = b"\n" + STATUS
    assert not dpkg.installed(data, "prometheus-node-exporter")  # removed, its conffiles kept
    assert dpkg.installed(data, "prometheus-node-exporter-collectors")  # another package's stanza
    assert dpkg.installed(data, "libc6")  # one architecture of a multi-arch package is enough
    assert dpkg.installed(data, "held")  # `hold ok installed` is installed (dpkg-query | grep said not)
    assert not dpkg.installed(data, "half") and not dpkg.installed(data, "absent")
    assert not dpkg.installed(data, "node-exporter")  # a name inside another's is not it
    assert not dpkg.installed(b"", "libc6")


def test_a_probe_of_a_host_without_dpkg_or_apt_says_no_candidate(monkeypatch, tmp_path):
    monkeypatch.setattr(dpkg, "STATUS", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-cache
    assert dpkg.states(["rsync"]) == {"rsync": dpkg.NO_CANDIDATE}
