"""node_exporter where the host has no mirror: the controller's .deb (a host's `debs:` directory),
found and checked on the controller, pushed, checked again on the host and installed with dpkg -i."""
import hashlib
import os
import shutil

import pytest
import yaml

from roles import monitoring
from specops import inventory, protocol
from specops.agent.converge import installs
from specops.agent.host import ActionError
from specops.errors import UsageError
from specops.ops import Facts
from specops.ops.apt import INSTALLED, NO_CANDIDATE, AptPackages, DebPackage
from sandbox import aptrepo
from roles import VOCABULARY

PKG = "prometheus-node-exporter"


@pytest.fixture
def debs(tmp_path):
    d = tmp_path / "debs"
    d.mkdir()
    shutil.copy(aptrepo.controller_deb(PKG), d)
    return d


def facts(state):
    return Facts({"packages": {PKG: state}})


def test_the_deb_is_pushed_and_installed_only_when_dpkg_lacks_the_package(debs):
    op = DebPackage(PKG, str(debs))
    deb = next(debs.glob("*.deb"))
    change = op.plan(facts(NO_CANDIDATE), None)
    [action] = change.actions
    assert isinstance(action, protocol.DpkgInstall) and action.PHASE == protocol.PREPARE
    assert action.sha256 == hashlib.sha256(deb.read_bytes()).hexdigest() and action.package == PKG
    assert change.uploads == [(str(deb), f"/var/lib/specops/debs/{deb.name}")] and change.changed
    assert not op.plan(facts(INSTALLED), None).changed


def test_a_directory_without_the_deb_or_with_a_sum_that_differs_is_refused(debs, tmp_path):
    with pytest.raises(UsageError, match=rf"debs: {tmp_path}/none holds no {PKG}_\*.deb"):
        DebPackage(PKG, str(tmp_path / "none"))
    deb = next(debs.glob("*.deb"))
    (debs / "SHA256SUMS").write_text(f"{hashlib.sha256(deb.read_bytes()).hexdigest()}  {deb.name}\n")
    DebPackage(PKG, str(debs))  # listed with its digest: taken
    (debs / "SHA256SUMS").write_text(f"{'0' * 64}  {deb.name}\n")
    with pytest.raises(UsageError, match=r"is not the file .*SHA256SUMS lists"):
        DebPackage(PKG, str(debs))


def test_the_monitoring_role_takes_the_deb_where_debs_is_set_else_apt(debs, tmp_path):
    doc = {"all": {"hosts": {"a": {"monitoring": True, "debs": str(debs)}, "b": {"monitoring": True}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(doc))
    inv = inventory.load(tmp_path, VOCABULARY)
    assert isinstance(monitoring.ops(inv.hosts["a"])[0], DebPackage)
    assert isinstance(monitoring.ops(inv.hosts["b"])[0], AptPackages)


def test_the_agent_installs_nothing_that_is_not_what_the_controller_sent(debs, tmp_path):
    deb = next(debs.glob("*.deb"))
    staged = tmp_path / "staged.deb"
    for sha, package, words in (("0" * 64, PKG, "is not the .deb the controller sent"),
                                (hashlib.sha256(deb.read_bytes()).hexdigest(), "other-package", "not other-package")):
        shutil.copy(deb, staged)
        with pytest.raises(ActionError, match=words):
            installs.dpkg_install(protocol.DpkgInstall(path=str(staged), sha256=sha, package=package))
        assert not staged.exists()  # taken off either way
    os.symlink(deb, staged)  # a link is never followed
    with pytest.raises(OSError):
        installs.dpkg_install(protocol.DpkgInstall(path=str(staged), sha256="0" * 64, package=PKG))


def test_a_deb_only_another_user_controls_or_one_of_several_is_refused(debs, tmp_path):
    deb = next(debs.glob("*.deb"))
    (debs / "SHA256SUMS").write_text(f"{'0' * 64}  other.deb\n")  # a sums file that does not list it
    with pytest.raises(UsageError, match=r"is not the file .*SHA256SUMS lists"):
        DebPackage(PKG, str(debs))
    (debs / "SHA256SUMS").unlink()
    os.chown(deb, 65534, 65534)  # nobody's
    with pytest.raises(UsageError, match="is a link, or another user's, or others can write it"):
        DebPackage(PKG, str(debs))
    os.chown(deb, 0, 0)
    debs.chmod(0o777)
    with pytest.raises(UsageError, match="is a link, or another user's, or others can write it"):
        DebPackage(PKG, str(debs))
    debs.chmod(0o755)
    shutil.copy(deb, debs / f"{PKG}_9.9.9-1_arm64.deb")
    with pytest.raises(UsageError, match=r"holds 2 prometheus-node-exporter .debs .*keep the one for these hosts"):
        DebPackage(PKG, str(debs))


def test_the_agent_installs_no_file_but_roots_and_no_package_name_but_debians(debs, tmp_path):
    deb = next(debs.glob("*.deb"))
    staged = tmp_path / "staged.deb"
    shutil.copy(deb, staged)
    os.chown(staged, 65534, 65534)
    sha = hashlib.sha256(deb.read_bytes()).hexdigest()
    with pytest.raises(ActionError, match="is not a file of root's alone"):
        installs.dpkg_install(protocol.DpkgInstall(path=str(staged), sha256=sha, package=PKG))
    with pytest.raises(ActionError, match="not a Debian package name"):
        installs.dpkg_install(protocol.DpkgInstall(path=str(staged), sha256=sha, package="x; rm -rf /"))
    shutil.copy(deb, staged)
    os.link(staged, tmp_path / "another-name")  # a second link: someone else's name for it
    with pytest.raises(ActionError, match="is not a file of root's alone"):
        installs.dpkg_install(protocol.DpkgInstall(path=str(staged), sha256=sha, package=PKG))


@pytest.mark.parametrize("known, undo", [(False, "--purge"), (True, "--remove")])
def test_a_failed_install_leaves_the_package_as_dpkg_knew_it(debs, tmp_path, monkeypatch, known, undo):
    """dpkg -i failing (unmet Depends leave it unpacked): purged when dpkg had no record of it,
    removed (its conffiles kept) when it had one; never a prompt (no stdin, conffiles kept)."""
    deb = next(debs.glob("*.deb"))
    staged = tmp_path / "staged.deb"
    shutil.copy(deb, staged)
    ran, streamed = [], []
    real_owned = installs.run_owned

    def owned(argv, **kw):
        if argv[0] == "dpkg-deb":
            return real_owned(argv, **kw)
        ran.append(argv)
        return (0 if known else 1), "", ""

    def stream(argv, desc, **kw):
        streamed.append(argv)
        raise ActionError("dpkg -i failed (exit 1): dependency problems")
    monkeypatch.setattr(installs, "run_owned", owned)
    monkeypatch.setattr(installs, "run_streamed", stream)
    with pytest.raises(ActionError, match="taken off again, as dpkg knew it before"):
        installs.dpkg_install(protocol.DpkgInstall(path=str(staged),
                                                   sha256=hashlib.sha256(deb.read_bytes()).hexdigest(), package=PKG))
    assert streamed[0][:4] == ["dpkg", "--force-confdef", "--force-confold", "-i"]
    assert ran[-1] == ["dpkg", undo, PKG] and not staged.exists()
