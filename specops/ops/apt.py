"""Debian/Ubuntu packages, by name: installed with apt-get when dpkg does not list them, or from a
.deb the controller holds (a host-level `debs:` directory) where there is no mirror."""
import hashlib
import os
import re
import stat
from pathlib import Path

from .. import protocol
from ..errors import UsageError
from ..layout import DEBS_DIR
from .base import Op

NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")  # Debian policy's package names: nothing a shell reads

INSTALLED, CANDIDATE, NO_CANDIDATE = protocol.INSTALLED, protocol.CANDIDATE, protocol.NO_CANDIDATE


class AptPackages(Op):
    """Packages that must be installed (never removed); Recommends are not pulled in.  An install
    prepares: it runs before anything that serves changes, and is not undone."""

    def __init__(self, names):
        bad = [n for n in names if not NAME.match(n)]
        if bad:
            raise ValueError(f"not a Debian package name: {bad[0]!r}")
        self.names = names

    def wants(self):
        return protocol.Probe(packages=self.names)

    def plan(self, facts, ctx):
        missing = [n for n in self.names if facts.package(n) != INSTALLED]
        if not missing:
            return self._change("apt packages", "ok")
        unknown = [n for n in missing if facts.package(n) == NO_CANDIDATE]
        change = self._change("apt packages", f"install {' '.join(missing)}",
                              [protocol.AptInstall(packages=missing, desc=f"apt-get install {' '.join(missing)}")])
        if unknown:  # not refused: a deploy refreshes the lists first (apt-get update), which may find them
            change.fails = (f"{', '.join(unknown)}: no candidate in the host's package lists (apt-cache policy); "
                            f"unless apt-get update finds {'them' if unknown[1:] else 'it'}, a deploy fails "
                            f"before anything that serves changes")
        return change


def _trusted(path: Path) -> None:
    """A controller path whose .deb root will install: no link, owned by root or this user, and
    writable by no one else (a .deb's maintainer scripts run as root on every host it reaches)."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode) or st.st_uid not in (0, os.getuid()) or st.st_mode & 0o022:
        raise UsageError(f"debs: {path} is a link, or another user's, or others can write it: specops installs "
                         f"no .deb from there")


def controller_deb(directory: str, package: str) -> tuple[Path, str]:
    """(the one `package` .deb in a controller directory, its sha256).  A SHA256SUMS file there
    (sha256sum's format) must list it with that digest."""
    where = Path(directory).expanduser()
    found = sorted(where.glob(f"{package}_*.deb")) if where.is_dir() else []
    if not found:
        raise UsageError(f"debs: {where} holds no {package}_*.deb")
    if len(found) > 1:  # a version or an architecture to choose: the user's to say, by keeping one
        raise UsageError(f"debs: {where} holds {len(found)} {package} .debs ({', '.join(p.name for p in found)}): "
                         f"keep the one for these hosts")
    deb = found[0]
    for path in (where, deb):
        _trusted(path)
    digest = hashlib.sha256(deb.read_bytes()).hexdigest()
    sums = where / "SHA256SUMS"
    if sums.exists():
        listed = {
            line.split()[-1].lstrip("*"): line.split()[0] for line in sums.read_text().splitlines() if line.strip()
        }
        if listed.get(deb.name) != digest:
            raise UsageError(f"debs: {deb} is not the file {sums} lists (sha256 {digest[:12]}…)")
    return deb, digest


class DebPackage(Op):
    """A package installed from the controller's .deb when dpkg does not list it: pushed, its sha256
    checked on the host, installed with dpkg -i (its Depends must be installed already; a failed
    install is purged).  It prepares, like an apt install."""

    def __init__(self, package, directory):
        if not NAME.match(package):
            raise ValueError(f"not a Debian package name: {package!r}")
        self.package, (self.deb, self.sha256) = package, controller_deb(directory, package)

    def wants(self):
        return protocol.Probe(packages=[self.package])

    def plan(self, facts, ctx):
        if facts.package(self.package) == INSTALLED:
            return self._change(f"package {self.package}", "ok")
        remote = f"{DEBS_DIR}/{self.deb.name}"
        change = self._change(
            f"package {self.package}",
            f"install {self.deb.name} from the controller",
            [
                protocol.DpkgInstall(
                    path=remote, sha256=self.sha256, package=self.package, desc=f"dpkg -i {self.deb.name}"
                )
            ],
        )
        change.uploads = [(str(self.deb), remote)]
        return change
