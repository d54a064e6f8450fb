"""Whether a Debian package is installed, as the agent reads dpkg's status file
(agent/converge/dpkg.py): the stanzas dpkg writes, every case a probe can meet.  No fleet."""
import os

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

Package: described
Status: deinstall ok config-files
Description: a tool, not installed
"""


def test_installed_is_the_status_last_word_of_the_packages_own_stanza():
    data = b"\n" + STATUS
    assert not dpkg.installed(data, "prometheus-node-exporter")  # removed, its conffiles kept
    assert dpkg.installed(data, "prometheus-node-exporter-collectors")  # another package's stanza
    assert dpkg.installed(data, "libc6")  # one architecture of a multi-arch package is enough
    assert dpkg.installed(data, "held")  # `hold ok installed` is installed (dpkg-query | grep said not)
    assert not dpkg.installed(data, "half") and not dpkg.installed(data, "absent")
    assert not dpkg.installed(data, "described")  # only the Status line says
    assert not dpkg.installed(data, "node-exporter")  # a name inside another's is not it
    assert not dpkg.installed(b"", "libc6")


def test_a_probe_of_a_host_without_dpkg_or_apt_says_no_candidate(monkeypatch, tmp_path):
    monkeypatch.setattr(dpkg, "STATUS", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-cache
    assert dpkg.states(["rsync"]) == {"rsync": dpkg.NO_CANDIDATE}


def test_while_dpkgs_journal_holds_changes_dpkg_query_is_asked(monkeypatch, tmp_path):
    """dpkg folds its journal (/var/lib/dpkg/updates) into the status file only now and then: a
    package removed in an apt run still going (or cut off) reads installed in the status file."""
    status = tmp_path / "status"
    status.write_bytes(STATUS)
    updates = tmp_path / "updates"
    updates.mkdir()
    (tmp_path / "bin").mkdir()
    query = tmp_path / "bin/dpkg-query"
    query.write_text("#!/bin/sh\necho \"$*\" >> %s/asked\nprintf 'deinstall ok config-files'\n" % tmp_path)
    query.chmod(0o755)
    monkeypatch.setattr(dpkg, "STATUS", str(status))
    monkeypatch.setattr(dpkg, "UPDATES", str(updates))
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path / "bin", os.environ["PATH"]))
    monkeypatch.setattr(dpkg, "_candidate", lambda name: dpkg.CANDIDATE)
    assert dpkg.states(["libc6"]) == {"libc6": dpkg.INSTALLED}  # the status file alone
    (updates / "0001").write_text("Package: libc6\nStatus: deinstall ok config-files\n")
    assert dpkg.states(["libc6"]) == {"libc6": dpkg.CANDIDATE}
    assert (tmp_path / "asked").read_text() == "-W -f=${Status} libc6\n"


def test_a_package_not_installed_has_a_candidate_when_apt_cache_policy_names_one(monkeypatch, tmp_path):
    (tmp_path / "bin").mkdir()
    policy = tmp_path / "bin/apt-cache"
    policy.write_text("#!/bin/sh\ncase $2 in rsync) c='3.2.7-1';; *) c='(none)';; esac\n"
                      "printf '%s:\\n  Installed: (none)\\n  Candidate: %s\\n' $2 \"$c\"\n")
    policy.chmod(0o755)
    monkeypatch.setattr(dpkg, "STATUS", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path / "bin", os.environ["PATH"]))
    assert dpkg.states(["rsync", "nosuch"]) == {"rsync": dpkg.CANDIDATE, "nosuch": dpkg.NO_CANDIDATE}
