"""Host keys: the system and user known_hosts files loaded on every hop, and the policy for a key
not in them.  Fabric's Connection installs paramiko's AutoAddPolicy, which trusts any key; ours
refuses an unknown key unless accept-new was asked for (then records it), and a changed key is
always refused (paramiko raises BadHostKeyException for it before any policy is consulted)."""
from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import paramiko

from ..errors import HostKeyError

SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
USER_KNOWN_HOSTS = os.path.expanduser("~/.ssh/known_hosts")


def check_host_keys(client: paramiko.SSHClient, name: str, user_file: str, accept: bool) -> None:
    if os.path.exists(SYSTEM_KNOWN_HOSTS):
        client.load_system_host_keys(SYSTEM_KNOWN_HOSTS)
    if os.path.exists(user_file):
        client.load_host_keys(user_file)
    # load_host_keys would make paramiko rewrite the file on save; we only append.
    client._host_keys_filename = None
    client.set_missing_host_key_policy(_Policy(name, accept, user_file))


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _Policy(paramiko.MissingHostKeyPolicy):
    """Unknown keys: refused, or (accept-new) recorded.  paramiko names the host as known_hosts
    does already ("[host]:port" off port 22), so that name is recorded as it is."""

    def __init__(self, name: str, accept_new: bool, record_to: str):
        self.name, self.accept_new, self.record_to = name, accept_new, record_to

    def missing_host_key(self, client, hostname, key):
        fp = fingerprint(key)
        if not self.accept_new:
            raise HostKeyError(
                f"{self.name}: unknown host key {key.get_name()} {fp} for {hostname}; check it, "
                f"then accept it with --accept-new-host-key or host_key_policy: accept-new")
        Path(self.record_to).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.record_to, "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)
