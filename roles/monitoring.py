"""Monitoring, opt-in per host or group (`monitoring: true`, or a mapping of its settings): the
distribution's node exporter with its textfile collector (from apt, or from the controller's .deb
in the host's `debs:` directory), and a timer that rewrites specops's
textfile there every `refresh` from the agent's own read-only look at the host, so that drift made
by hand and restarts show without a run (docs/monitoring.md)."""
from specops.inventory import checker
from specops.inventory.node_exporter import PLAIN_PATH, settings
from specops.kinds.ports import check_ports
from specops.layout import TEXTFILE_AGENT, TEXTFILE_DIR, UNIT_DIR, UNIT_ONLY
from specops.ops import Directory, File, handlers, unit_file
from specops.ops.apt import AptPackages, DebPackage
from specops.ops.files import render_kept
from specops.ops.systemd import Timer
from specops.remote import shipping

NAME = "monitoring"
REFRESH = checker.Pattern(r"^[1-9][0-9]*(s|min|h)$", "a refresh is a systemd time span such as 30s, 1min or 1h")
VARS = {"monitoring": checker.OneOf((bool, {"textfile_dir": PLAIN_PATH, "refresh": REFRESH}),
                                    "monitoring is true, false, or a mapping of textfile_dir and refresh"),
        "debs": str}  # a directory on the controller: node_exporter's .deb, where the host has no mirror
AFTER = ("sglang_service", "router")  # the textfile describes what they deployed
PACKAGE = "prometheus-node-exporter"  # Debian's; its textfile collector reads TEXTFILE_DIR by default
UNIT = "specops-textfile"
TIMER = f"{UNIT_DIR}/{UNIT}.timer"


def service_text(textfile_dir: str) -> str:
    """The refresh: the agent's zip on the interpreter, bounded and read-only but for the textfile."""
    code = (f"import sys; sys.path.insert(0, '{TEXTFILE_AGENT}'); "
            "from specops.agent.textfile import main; main(sys.argv[1:])")
    return render_kept("textfile.service.j2", code=code, textfile_dir=textfile_dir)


def ops(host):
    m = settings(host)  # a textfile_dir that is not a plain absolute path: refused here
    if not m:
        return []
    check_ports(host)  # node_exporter's port among the services'
    zipped, _ = shipping.artifact()
    return [
        # from the controller's .deb where the host has no mirror; a preparation either way
        DebPackage(PACKAGE, host["debs"]) if host.get("debs") else AptPackages([PACKAGE]),
        # Debian's package ships TEXTFILE_DIR as root's, in /var/lib/prometheus (its service account's);
        # another directory is made root's alone (node exporter must be told to read it)
        *([] if m.textfile_dir == TEXTFILE_DIR else [Directory(m.textfile_dir, mode="0755")]),
        Directory("/usr/local/lib/specops"),
        # the next tick runs the new code
        File(TEXTFILE_AGENT, zipped, mode="0644", own="specops's agent, for the textfile"),
        unit_file(UNIT, service_text(m.textfile_dir), notify_restart=False),
        File(
            TIMER,
            render_kept("textfile.timer.j2", refresh=m.refresh),
            mode="0644",
            validate=["systemd-analyze", "verify", UNIT_ONLY, "{}"],
            notify=[handlers.daemon_reload(f"{UNIT}.timer")],
        ),
        Timer(f"{UNIT}.timer"),
    ]
