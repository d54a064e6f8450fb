"""The program specops runs on a host: one invocation answers one request.

It travels as a zip (the `specops.agent` package with `specops.protocol`,
`specops.layout` and `specops.unitwords`), cached on the host by its sha256 and run by the host's python3
(3.8+, standard library only).  By job:

- main: decode the request, dispatch on its kind, answer, give the lock back;
- host: what every job shares (commands, state file, text cleaning, errors), and
  children: the commands it starts, ended with the request;
- lean: json, signal, socket and a short command's output from the standard library's C parts
  (their Python layers' imports cost every call);
- lock: the host lock;  safefs: paths on a shared box, never through another's link;
- releases: manifests, snapshots, start;  rollback: undo, a switch cut off, rollback;
- converge/: probe, and apply and check batches (stage, validate, commit, purge, preflight);
- services/: stop, start and verify units and their servers, GPUs, listeners, routers;
- weights/: model weights: manifests, the hub, a peer's copy;
- bench/: spec-bench's load client and baseline.
"""
