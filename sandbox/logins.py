"""How a sandbox host is logged into: as root (the default), or, like a cloud image, as `ubuntu`
with sudo and root logins refused.

Flavours:
  root              root logs in with the controller's key
  ubuntu-sudo       `ubuntu` logs in; sudo without a password; PermitRootLogin no
  ubuntu-sudo-pass  the same, but sudo asks for ubuntu's password (see password())

The user is written into the host's own overlay layer when it boots (passwd, shadow, group,
home, authorized_keys, sudoers), so no cached layer depends on the flavour.
"""
from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

FLAVOURS = ("root", "ubuntu-sudo", "ubuntu-sudo-pass")
USER, UID = "ubuntu", 1000
SSHD_CONF = "etc/ssh/sshd_config.d/sandbox.conf"


def password(state: Path) -> str:
    """The sandbox's sudo password for `ubuntu` (made once per site, kept 0600 in its state)."""
    path = state / "become_pass"
    if not path.exists():
        state.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(12))
    return path.read_text().strip()


def check(flavour: str) -> None:
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown sandbox flavour {flavour!r} (known: {', '.join(FLAVOURS)})")


def host_vars(flavour: str) -> dict:
    """The inventory's login settings for a host of this flavour."""
    return {"ssh_user": "root"} if flavour == "root" else {"ssh_user": USER, "become": True}


def _lower(lowers: list[Path], rel: str) -> str:
    for layer in lowers:  # topmost first
        if (layer / rel).exists():
            return (layer / rel).read_text()
    return ""


def write(upper: Path, lowers: list[Path], flavour: str, pubkey: str, state: Path) -> None:
    """Make the host's upper layer log in the way the flavour says."""
    check(flavour)
    if flavour == "root":
        return
    digest = "*"  # no password: key logins only
    if flavour == "ubuntu-sudo-pass":
        digest = subprocess.run(["openssl", "passwd", "-6", "-stdin"], input=password(state),
                                capture_output=True, text=True, check=True).stdout.strip()
    entries = {"etc/passwd": f"{USER}:x:{UID}:{UID}::/home/{USER}:/bin/bash",
               "etc/shadow": f"{USER}:{digest}:20000:0:99999:7:::",
               "etc/group": f"{USER}:x:{UID}:",
               "etc/gshadow": f"{USER}:!::"}
    for rel, line in entries.items():
        (upper / rel).parent.mkdir(parents=True, exist_ok=True)
        (upper / rel).write_text(_lower(lowers, rel).rstrip("\n") + "\n" + line + "\n")
        (upper / rel).chmod(0o640 if "shadow" in rel else 0o644)
    home = upper / "home" / USER
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    (home / ".ssh/authorized_keys").write_text(pubkey)
    for p in (home, home / ".ssh", home / ".ssh/authorized_keys"):
        _own(p)
    rule = "ALL=(ALL) NOPASSWD:ALL" if flavour == "ubuntu-sudo" else "ALL=(ALL) ALL"
    sudoers = upper / "etc/sudoers.d" / USER
    sudoers.parent.mkdir(parents=True, exist_ok=True)
    sudoers.write_text(f"{USER} {rule}\n")
    sudoers.chmod(0o440)
    sshd = upper / SSHD_CONF
    sshd.parent.mkdir(parents=True, exist_ok=True)
    text = _lower(lowers, SSHD_CONF).replace("PermitRootLogin prohibit-password", "PermitRootLogin no")
    sshd.write_text(text)


def _own(path: Path) -> None:
    import os
    os.chown(path, UID, UID)
