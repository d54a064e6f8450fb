"""The inventory's vocabulary the engine reads itself, in checker.py's type language: how to
reach a host, its services, the keys shared by the roles that install.  The roles add theirs
(each role's VARS); roles.VOCABULARY is the whole."""
from __future__ import annotations

from ..agent.converge import indexurl
from ..errors import UsageError
from .checker import ANY, NUMBER, Checked, Enum, MapOf, Pattern, Req

SPECULATIVE = {
    "algorithm": Req(Enum(("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH"))),
    "draft_model_path": str,
    "draft_model_revision": str,
    "num_steps": int,
    "eagle_topk": int,
    "num_draft_tokens": int,
    "ngram_max_bfs_breadth": int,
    "dflash_block_size": int,
}

DURATION = Pattern(r"^([0-9]+(ms|s|m|h|d|w|y))+$", "a duration is Prometheus's: 30s, 10m, 1h30m")

UNIT_NAME = Pattern(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$",
                    "a service name may hold only letters, digits and _ . @ - and starts with a letter or digit")

WEIGHTS = {  # where a service's weights come from (roles/models.py)
    "source": Req(Enum(("hf", "controller", "peer"))),
    "path": str,                     # controller: the directory on the controller; peer: on the peer
    "host": str,                     # peer: the inventory host that has them
    "address": str,                  # peer: how this host reaches it (default: as the controller does)
    "port": int,                     # peer: its sshd port from this host (default: as the controller)
    "repo": Pattern(r"^[\w.-]+/[\w.-]+$", "a hub repository is ORG/NAME"),  # hf
    "revision": str,                 # hf: a commit sha, a tag or a branch; the manifest records the commit
    "allow_patterns": [str],
    "endpoint": str,                 # HF_ENDPOINT: a company mirror
    "token_env": str,                # the env_secret that holds the token (default HF_TOKEN)
}

# at least 4 characters: every printed line is redacted of secrets that long (shorter ones would show)
API_KEY = Pattern(r"^[\x21-\x7e]{4,}$", "an API key is 4 or more printable ASCII characters without spaces (it "
                                         "travels in an HTTP header)")

SERVICE = {
    "name": Req(UNIT_NAME),
    "kind": Enum(("sglang", "router")),  # the kind of service (specops/kinds/)
    "model_path": str,  # required for kind sglang (REQUIRED_BY_KIND)
    "weights": WEIGHTS,
    "draft_weights": WEIGHTS,
    "served_model_name": str,
    "port": int,
    "bind": str,
    "tp": int,
    "nodes": [str],                 # hosts it spans, rank 0 first (specops/inventory/multinode.py)
    "dist_init_port": int,          # rank 0's port for --dist-init-addr (default 50000)
    "dp": int,
    "cuda_visible_devices": str,
    "mem_fraction_static": NUMBER,
    "attention_backend": str,
    "page_size": int,
    "max_running_requests": int,
    "device": str,
    "speculative": SPECULATIVE,
    "allow_sglang_adjustments": bool,
    "draft_config": MapOf(ANY),
    "patches": [str],
    "env": MapOf(str),
    "env_secret": MapOf(str),
    "api_key": API_KEY,
    "admin_api_key": API_KEY,       # SGLang's --admin-api-key: alone it opens its admin endpoints
    "open_admin": bool,             # true: bound beyond loopback with no key, on purpose (a warning each run)
    "extra_args": [str],
    "metrics": bool,                # false: SGLang without --enable-metrics (its /metrics: 404)
    # the system user it runs as (made by its role, in the GPU nodes' groups); default root
    "user": Pattern(r"^(?!root$)[a-z_][a-z0-9_-]{0,30}$", "a user is a plain system user name (lower-case letters, "
                    "digits, _ and -), never root"),
    # kind router (specops/kinds/router.py): SGLang's router in front of a group's workers
    "workers": {"group": Req(str), "service": str},
    "policy": Enum(("random", "round_robin", "cache_aware", "power_of_two")),
    "retries": bool,                # false: --disable-retries
    "venv": str,                    # the router's own venv (default /opt/sglang-router/venv)
    "version": str,                 # the sglang-router release to install there
    "drain_timeout": NUMBER,        # behind a router: seconds to finish what it serves (default 120)
    "timeout_stop_sec": int,
    "stop_grace": NUMBER,  # seconds between SIGTERM and SIGKILL for leftovers of its runs
    "limit_nofile": int,
    "verify": {
        "timeout": NUMBER,        # the ceiling on a start (default 3600 s)
        "stall_timeout": NUMBER,  # a start that shows no progress for this long failed (default 300 s)
        "min_accept_length": NUMBER,
        "baseline_tok_s": NUMBER,
        "prompt": str,
    },
    "gate": {  # held by `inv deploy --bench` (specops/flows/gate.py): a release below it is undone
        "min_speedup": NUMBER,          # spec tok/s ÷ baseline tok/s (measures the baseline too)
        "at_concurrency": int,          # where the gate is read (default: the lowest level)
        "min_accept_length": NUMBER,
        "max_regression_pct": NUMBER,   # against the previous release's perf.json
        "load": {"concurrency": [int], "requests": int, "warmup": int, "max_new_tokens": int, "seed": int},
    },
    "tune": {  # inv spec-tune's search space (specops/sglang/tuning.py; default: the algorithm's)
        "num_steps": [int], "eagle_topk": [int], "num_draft_tokens": [int],
        "budget": int,                  # the most restarts a tune may spend per draft (--budget)
        "drafts": [str],                # draft checkpoints to compare (default: the service's own)
        "traffic": int,                 # tune on a sample of this many requests it serves (--traffic)
    },
    "watch": {  # when the draft no longer pays, or pays less (specops/fleetwide/payoff.py: defaults, the verdicts)
        "accept_fraction": NUMBER,      # degraded: production accept length below this × the release's measure
        "speedup_margin": NUMBER,       # not paying: estimated speedup below 1 + this (0 or more)
        "for": DURATION,                # the alerts: for this long
        "min_verify_rate": NUMBER,      # ... only with at least this many verify calls/s of traffic
    },
}

# The host vars the engine reads itself: how to reach and become root on a host, where it may
# write, how others reach it, its services.  The roles declare the others they read (VARS in each
# role); roles.VOCABULARY is the whole vocabulary.
ENGINE_VARS = {
    "address": str,
    "ssh_user": str,
    "ssh_port": int,
    "ssh_key": str,
    "known_hosts": str,
    "ssh_config": str,
    "host_key_policy": Enum(("reject", "accept-new")),
    "connect_timeout": NUMBER,
    "become": bool,                   # log in as ssh_user, become root with become_method
    "become_method": Enum(("sudo",)),
    "allow_shared_dirs": [str],  # directories other users can write to, where specops may write anyway
    "router_address": str,       # how routers reach this host's services (default: address)
    "node_address": str,         # how the other nodes of a multi-node service reach this one (rank 0)
    "services": [SERVICE],
}

# An index URL, refused at load by the rule the agent reads it by: a password torn out of its
# place would be said as the host (specops/agent/converge/indexurl.py).
INDEX_URL = Checked(indexurl.parses, "an index URL is http(s)://[USER[:PASSWORD]@]HOST[:PORT][/PATH] (a password's "
                                     "/ ? # and spaces written %2F %3F %23 %20), and this one is not")

# Where a host's packages come from (specops/sglang/indexes.py): read by every role that installs.
INDEX_VARS = {"package_index": INDEX_URL, "extra_index": INDEX_URL, "wheelhouse": str}

# The SGLang stack (specops/sglang/stack.py), or the venv a user manages (`venv:`).
STACK_VARS = {
    "venv": str,
    "python": str,
    "torch": {"version": str, "cuda": str, "index_url": INDEX_URL},
    "fla": {"version": str},
    "sglang": {"version": str},
    # other pins of the stack: a PEP 508 name (extras allowed) and an exact version, nothing an
    # installer could read as an option or a file
    "packages": [
        Pattern(
            r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\[[A-Za-z0-9._,-]+\])?==[A-Za-z0-9][A-Za-z0-9.+!_-]*$",
            "a package is name==version (PEP 508 name, exact version)",
        )
    ],
    "stack_need_gib": NUMBER,  # free disk a new stack needs before it is built (specops/sglang/stack.py)
}

# A host's patches (specops/sglang/patches.py).
PATCH_VARS = {
    "patch_dir": str,
    "patch_any_base": bool,          # take whole-file patches whatever upstream file they were cut from
}


# Keys a kind of service cannot do without (the schema above is one for every kind).
REQUIRED_BY_KIND = {"sglang": ("model_path",), "router": ("workers",)}


def check_kinds(host: str, services: list, file: str) -> None:
    """Each service has the keys its kind requires (after the inventory's layers are merged)."""
    for i, svc in enumerate(services or []):
        for key in REQUIRED_BY_KIND.get(svc.get("kind", "sglang"), ()):
            if key not in svc:
                raise UsageError(f"{file}: {host}: services[{i}].{key}: required key is missing "
                                 f"(kind {svc.get('kind', 'sglang')})")
