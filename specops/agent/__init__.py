"""The program specops runs on a host: one invocation answers one request.

It travels as a zip (the `specops.agent` package with `specops.protocol` and
`specops.layout`), cached on the host by its sha256 and run by the host's python3
(3.8+, standard library only).  Modules, each owning one job:

- main: decode the request, dispatch on its kind, answer, give the lock back;
- host: what every job shares (commands, state file, text cleaning, errors);
- probe: facts about files, units, venvs and GPUs;
- lock: the host lock;
- stage: apply and check batches (stage, validate, commit, purge, preflight);
- service_http: verify and peek, over the service's HTTP endpoints;
- units: stop, start and restart units, accounting for every process of their runs;
- releases: manifests, snapshots, undo and rollback.
"""
