"""A host's releases: recording one, listing them, undoing a failed deploy, rolling back,
and keeping a release's spec-bench figures."""
from __future__ import annotations

if False:  # annotations are never evaluated (importing typing costs the agent ~5 ms a call)
    from typing import Any, Dict, List, Optional  # noqa: F401

from .parts import ServiceCheck, UnitRef  # noqa: F401
from .wire import LIST, message, request

ROLLED_BACK = "rolled-back"  # a ReleaseRecord's status when the deploy it records was undone


def is_rolled_back(release):
    # type: (Dict[str, Any]) -> bool
    """Whether a listed release (ReleasesResult.releases) was rolled back: its deploy undone (a
    failed verify or gate), or left by `inv rollback` for an older one (`rolled_back`), and not
    current again since.  Listings show it as ROLLED_BACK."""
    return release.get("status") == ROLLED_BACK or bool(release.get("rolled_back") and not release.get("current"))


@message
class Provenance:
    """Who deployed a release and from what, read on the controller once per run (specops/provenance.py):
    the controller's user and host name, and the git commit of the specops checkout and of the
    inventory ("<40 hex>", or "<40 hex>+dirty" when its work tree has changes; None when it is not
    in a git repository, or git could not say)."""
    user: str
    controller: str
    checkout: Optional[str] = None
    inventory: Optional[str] = None


def short_commit(commit):
    # type: (Any) -> str
    """A recorded commit in 12 hex digits, "+dirty" kept; "" for anything that is not a commit."""
    if not isinstance(commit, str) or not commit:
        return ""
    head, _, dirty = commit.partition("+")
    return head[:12] + ("+dirty" if dirty == "dirty" else "")


def provenance_labels(release):
    # type: (Dict[str, Any]) -> Dict[str, str]
    """A listed release's (or a manifest's) provenance read back, as the textfile labels it:
    deployed_by ("user@controller"), specops_commit and inventory_commit (short_commit), only those
    recorded; {} for a release recorded before releases said who deployed them (or a record of
    another shape: it comes from the host)."""
    prov = release.get("provenance") if isinstance(release, dict) else None
    if not isinstance(prov, dict):
        return {}
    out = {}
    if isinstance(prov.get("user"), str) and isinstance(prov.get("controller"), str):
        out["deployed_by"] = "%s@%s" % (prov["user"], prov["controller"])
    for key, field in (("specops_commit", "checkout"), ("inventory_commit", "inventory")):
        if short_commit(prov.get(field)):
            out[key] = short_commit(prov.get(field))
    return out


@message
class RecordResult:
    """The release recorded, and how many managed files it snapshotted."""
    stamp: str
    files: int


@request("release_record", changes_host=True)
class ReleaseRecord:
    """After a deploy: snapshot every `managed` file into releases/<stamp>/files, note what each
    replaced path was before (`previous`: path → "backup" | "absent"), write the manifest, and
    move `current` when the status is "deployed".  `provenance`: who deployed it and from what
    (kept in the manifest; None: not known, as for a switch cut off that the agent records)."""
    stamp: str
    managed: List[str]
    previous: Dict[str, str]
    manifest: Dict[str, Any]
    status: str = "deployed"
    provenance: Optional[Provenance] = None
    Result = RecordResult


@message
class ReleasesResult:
    """current stamp, and every release [{stamp, status, services, current, rolled_back ({to, at}:
    `inv rollback` left it for release `to`; None), summary, spec,
    verify (the checks), verified (what verify found: name, checks, generate, notes),
    packages, venv (the stack it runs), weights (service → what it ran), files: {path: sha256},
    perf: {service: spec-bench result} or None, tune: {service: spec-tune
    record without its levels' raw timings} or None, provenance: {user, controller, checkout,
    inventory} (Provenance, its unknown fields left out) or None (recorded before releases said
    who deployed them)}]; stacks: [{path, packages, built_at, releases
    (the stamps that run it), bytes (its files), new (bytes no stack listed before it shares)}];
    uv_cache: the bytes of uv's cache no stack shares."""
    current: Optional[str]
    releases: List[Dict[str, Any]]
    stacks: List[Dict[str, Any]] = LIST
    uv_cache: int = 0


@request("releases")
class Releases:
    """List the host's releases, oldest first."""
    Result = ReleasesResult


@message
class UndoResult:
    """Files put back, the release now current, and how it says to verify (None: first deploy)."""
    restored: List[str]
    current: Optional[str]
    verify: Optional[List[ServiceCheck]] = None


@request("undo", changes_host=True)
class Undo:
    """Undo a deploy whose switch, verify or gate failed: its own backups back, created files
    removed, what it enabled (`enabled`: its Enable actions) put back as it was, restart."""
    stamp: str
    previous: Dict[str, str]
    services: List[UnitRef]
    enabled: List[Action] = LIST
    running: Optional[List[str]] = None  # the services active before the deploy (restarted); None: all
    concerned: Optional[List[str]] = None  # the services its switch concerns: no other is restarted; None: all
    restarts: bool = True  # the switch reached a restart, start or reload (else a service is restarted only
                           # when a file or enablement is put back)
    allow_shared_dirs: List[str] = LIST
    Result = UndoResult


@message
class RollbackResult:
    """The release now current (`to`), the one it replaced, the files put back, how to verify,
    and what it did not put back."""
    to: str
    replaced: Optional[str]
    restored: List[str]
    verify: List[ServiceCheck] = LIST
    notes: List[str] = LIST  # what rollback did not put back (weights that differ from the release's)


@request("rollback", changes_host=True)
class Rollback:
    """Back to the release before current (or `to`): files, bytecode purge, reload, restart."""
    to: Optional[str] = None
    services: List[UnitRef] = LIST
    allow_shared_dirs: List[str] = LIST
    Result = RollbackResult


@request("perf_record", changes_host=True)
class PerfRecord:
    """Keep a spec-bench result (`perf`: its service, figures, speedups, arguments, versions) in
    the perf.json of release `stamp` (the current one when None), beside other services' results;
    with `record` "tune", a spec-tune's record in tune.json instead."""
    perf: Dict[str, Any]
    stamp: Optional[str] = None
    record: str = "perf"
    Result = RecordResult
