"""A host-to-host copy of weights: the peer's key for one copy, and the copy itself."""
from __future__ import annotations

if False:  # annotations are never evaluated (importing typing costs the agent ~5 ms a call)
    from typing import Any, Dict, List  # noqa: F401

from .wire import message, request


@message
class PeerKeyResult:
    """A key made for one copy: its id, its public half (the private one never leaves the host),
    the peer's numeric `address` as the host resolved it, and the address the host reaches it
    from (`source`: what the peer's sshd will see)."""
    id: str
    public_key: str
    source: str
    address: str


@request("peer_key", changes_host=True)
class PeerKey:
    """Make a key for one copy from the peer at `address`:`port` (and sweep one a killed run left)."""
    address: str
    port: int = 22
    Result = PeerKeyResult


@message
class PeerCopyResult:
    """Bytes rsync `received`, the files it `copied` (the others were already there), how many `files` now."""
    received: int
    copied: List[str]
    files: int


@request("peer_copy", changes_host=True)
class PeerCopy:
    """Copy the peer's `path` into `dest` with rsync over SSH, with the key `id` made by PeerKey,
    as `user`@`address`:`port`, whose host key must be `host_key` (the one the controller checked);
    refused before any byte moves when the disk cannot hold `files` (name → [size, mtime_ns], as the
    peer listed them).  `verify`: compare every file by checksum.  Then the files that moved are
    hashed and the manifest written with `source`.  The key is removed however the copy ends."""
    id: str
    user: str
    address: str
    port: int
    host_key: str
    path: str
    dest: str
    files: Dict[str, List[int]]
    source: Dict[str, Any]
    source_address: str = ""
    peer: str = ""  # the peer's inventory name, for messages
    verify: bool = False
    Result = PeerCopyResult
