"""A weights copy from a peer box, run by the controller: the bytes go host to host.

The destination makes a key pair (PeerKey) and keeps the private half; the controller grants
the public half on the peer, as the peer's login user and with that user's rights only
(hostfiles/peer_keys.py: read-only rrsync of one directory, from the destination's address,
expiring in GRANT_MINUTES); the destination copies with rsync over SSH (PeerCopy), checking the
peer's host key against the one the controller's own connection accepted; then the grant is
revoked, however the copy ended.  A run killed outright before its revoke leaves a line that
sshd stops accepting at its expiry, that any grant or revoke on that peer removes after it, and
that the next copy to the same destination removes at once.

The controller carries only the requests and progress lines: nothing of the weights.
"""
from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass

from .. import protocol
from ..errors import SpecopsError
from .ssh import Remote

GRANT_MINUTES = 10  # the key must be used (rsync connected) within this; a connected copy runs on
SCRIPT = open(os.path.join(os.path.dirname(__file__), "hostfiles", "peer_keys.py")).read()


@dataclass
class PeerCopy:
    """What the models role asks for: the weights at `path` on the inventory host `peer` into
    `dest`, reached from the destination at `address`:`port` (default: as the controller
    reaches the peer); `source` is what the destination's manifest keeps."""
    peer: object  # inventory.Host
    path: str
    dest: str
    source: dict
    address: str | None = None
    port: int | None = None
    device: int | None = None  # the destination's filesystem (its probe's), for the run's disk sums
    # compare by checksum: a file here differs from its manifest by content alone (found by its
    # hash, size and mtime kept), which rsync's quick check would skip
    checksum: bool = False


def copy(run, c: PeerCopy) -> protocol.PeerCopyResult:
    """Grant, copy, revoke: `run` is the destination's HostRun (its lock held)."""
    peer = Remote(c.peer.name, c.peer.vars, run.opts.accept_new)
    try:
        peer.open()
        port = c.port or peer.conn.port or 22
        key = run.call(protocol.PeerKey(address=c.address or peer.conn.host, port=port))
        try:  # the revoke is by id: it also undoes a grant cut off before it answered
            granted = _on_peer(peer, {"op": "grant", "id": key.id, "key": key.public_key, "from": key.source,
                                      "path": c.path, "minutes": GRANT_MINUTES, "for": run.host.name})
            host_key = peer.conn.client.get_transport().get_remote_server_key()
            return run.call(protocol.PeerCopy(
                id=key.id, user=granted["user"], address=key.address, port=port,
                host_key=f"{host_key.get_name()} {host_key.get_base64()}", path=c.path, dest=c.dest,
                files=granted["files"], source=c.source, source_address=key.source, peer=c.peer.name,
                verify=run.opts.verify_weights or c.checksum), on_stderr=lambda line: run.say(line.strip()))
        finally:
            try:
                _on_peer(peer, {"op": "revoke", "id": key.id})
            except Exception as e:  # noqa: BLE001 (said, with what still protects the peer)
                run.say(f"WARNING: the copy key specops-peer:{key.id} may still be in the authorized_keys of "
                        f"{c.peer.name}'s login user ({e}); sshd refuses it {GRANT_MINUTES} minutes after the "
                        f"grant, and the next copy to {run.host.name} removes it")
    finally:
        peer.close()


def _on_peer(peer: Remote, request: dict) -> dict:
    """Run the peer's side (grant or revoke) as the peer's login user; its answer, or one line."""
    res = peer.exec(f"python3 -I -c {shlex.quote(SCRIPT)}", stdin=json.dumps(request).encode(), as_login=True)
    if res.rc != 0:
        raise SpecopsError(f"{peer.name}: {request['op']} of a copy key failed: "
                           f"{(res.stderr.strip().splitlines() or ['exit %d' % res.rc])[-1][-300:]}")
    try:
        return json.loads(res.stdout)
    except ValueError:
        raise SpecopsError(f"{peer.name}: {request['op']} of a copy key answered no JSON: "
                           f"{res.stdout.strip()[:200]!r}") from None
