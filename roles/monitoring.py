"""Monitoring, opt-in per host or group (`monitoring: true`, or a mapping of its settings): the
distribution's node exporter with its textfile collector (from apt, or from the controller's .deb
in the host's `debs:` directory), and a timer that rewrites specops's
textfile there every `refresh` from the agent's own read-only look at the host, so that drift made
by hand and restarts show without a run (docs/monitoring.md)."""
import re

from specops.errors import UsageError
from specops.inventory import checker
from specops.layout import TEXTFILE_AGENT, TEXTFILE_DIR, UNIT_DIR, UNIT_ONLY
from specops.ops import Directory, File, handlers, unit_file
from specops.ops.apt import AptPackages, DebPackage
from specops.ops.systemd import Timer
from specops.remote import shipping
from specops.kinds.ports import check_ports

NAME = "monitoring"
REFRESH = checker.Pattern(r"^[1-9][0-9]*(s|min|h)$", "a refresh is a systemd time span such as 30s, 1min or 1h")
VARS = {"monitoring": checker.OneOf((bool, {"textfile_dir": str, "refresh": REFRESH}),
                                    "monitoring is true, false, or a mapping of textfile_dir and refresh"),
        "debs": str}  # a directory on the controller: node_exporter's .deb, where the host has no mirror
AFTER = ("sglang_service", "router")  # the textfile describes what they deployed
PACKAGE = "prometheus-node-exporter"  # Debian's; its textfile collector reads TEXTFILE_DIR by default
UNIT = "specops-textfile"
TIMER = f"{UNIT_DIR}/{UNIT}.timer"


def settings(host) -> dict | None:
    """{textfile_dir, refresh} of a monitored host, or None."""
    m = host.get("monitoring")
    if not m:
        return None
    m = m if isinstance(m, dict) else {}
    return {"textfile_dir": m.get("textfile_dir") or TEXTFILE_DIR, "refresh": m.get("refresh") or "1min"}


def service_text(textfile_dir: str) -> str:
    """The refresh: the agent's zip on the interpreter, bounded and read-only but for the textfile."""
    if not re.fullmatch(r"/[A-Za-z0-9._/-]+", textfile_dir):
        raise UsageError(f"monitoring.textfile_dir must be a plain absolute path, not {textfile_dir!r}")
    code = (f"import sys; sys.path.insert(0, '{TEXTFILE_AGENT}'); "
            "from specops.agent.textfile import main; main(sys.argv[1:])")
    return f"""[Unit]
Description=specops: node_exporter's textfile from the current release

[Service]
Type=oneshot
ExecStart=/usr/bin/python3 -I -S -c "{code}" {textfile_dir}
Nice=19
IOSchedulingClass=idle
CPUQuota=20%
MemoryMax=256M
TimeoutStartSec=30
NoNewPrivileges=yes
ProtectSystem=strict
ReadWritePaths=-{textfile_dir}
ProtectHome=read-only
PrivateTmp=yes
PrivateNetwork=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
RestrictSUIDSGID=yes
LockPersonality=yes
"""


def timer_text(refresh: str) -> str:
    return f"""[Unit]
Description=specops: refresh node_exporter's textfile every {refresh}

[Timer]
OnActiveSec=5s
OnUnitActiveSec={refresh}
AccuracySec=1s

[Install]
WantedBy=timers.target
"""


def ops(host):
    m = settings(host)
    if not m:
        return []
    check_ports(host)  # node_exporter's port among the services'
    zipped, _ = shipping.artifact()
    return [
        # from the controller's .deb where the host has no mirror; a preparation either way
        DebPackage(PACKAGE, host["debs"]) if host.get("debs") else AptPackages([PACKAGE]),
        # Debian's package ships TEXTFILE_DIR as root's, in /var/lib/prometheus (its service account's);
        # another directory is made root's alone (node exporter must be told to read it)
        *([] if m["textfile_dir"] == TEXTFILE_DIR else [Directory(m["textfile_dir"], mode="0755")]),
        Directory("/usr/local/lib/specops"),
        # the next tick runs the new code
        File(TEXTFILE_AGENT, zipped, mode="0644", own="specops's agent, for the textfile"),
        unit_file(UNIT, service_text(m["textfile_dir"]), notify_restart=False),
        File(TIMER, timer_text(m["refresh"]), mode="0644", validate=["systemd-analyze", "verify", UNIT_ONLY, "{}"],
             notify=[handlers.daemon_reload(f"{UNIT}.timer")]),
        Timer(f"{UNIT}.timer"),
    ]
