"""The systemd sandboxing every service specops runs gets: its unit, and spec-bench's and
spec-tune's transient baselines (through ServiceKind.properties, so the two never differ).

`systemd-analyze security` rates a unit with none of it 9.6 (UNSAFE) and one with it 4.2; the
suite measures both on a sandbox host (tests/test_unit_hardening_fleet.py) and docs/security.md
gives the figures.  What is here is chosen to keep GPU access as it was (reasoned from the
NVIDIA, CUDA and NCCL documentation: the sandbox has no GPU); what is left out, and why:

- PrivateDevices: it hides /dev/nvidia*.
- ProtectClock: it implies `DeviceAllow=char-rtc r`, which on systemd before PR #25075 (Ubuntu
  22.04's 249, early 252 builds) turns on the device allow-list with DevicePolicy=auto and so
  blocks every other device, /dev/nvidia* included.  Its effect is kept without its device list:
  CAP_SYS_TIME and CAP_WAKE_ALARM are dropped and the @clock calls are denied.
- DeviceAllow / DevicePolicy: the devices a GPU server needs (nvidia*, InfiniBand verbs, gdrdrv,
  nvidia-fs) differ from box to box; a list that misses one breaks it with no clear error.
- ProcSubset=pid: CUDA and NCCL read /proc/driver/nvidia and /proc/meminfo.
- MemoryDenyWriteExecute: Triton, CUDA and torch.compile write code and run it.
- PrivateTmp: SGLang's own processes meet in /tmp (ZMQ sockets, the inductor cache), and a
  debugging user looks for them there.
- ProtectHome: root's caches (Triton, FlashInfer, torch extensions, the hub) are under /root;
  a service with a `user:` has a home of its own (HOME below /var/lib).
- SystemCallFilter @debug (NCCL takes peer file descriptors with pidfd_getfd), @resources
  (NUMA binding, CPU affinity), @privileged; CAP_SYS_PTRACE (the same, under Yama scope 1),
  CAP_SYS_ADMIN (NVIDIA's profiling counters), CAP_IPC_LOCK (pinned memory, RDMA registration),
  CAP_NET_RAW (raw Ethernet queue pairs), CAP_DAC_* (a model directory another user owns).
- RestrictAddressFamilies as an allow-list: InfiniBand's connection manager may use AF_IB, and
  NCCL's plugins others; only AF_PACKET (raw frames) is denied.

A denied call fails with EPERM rather than killing the server with SIGSYS, so a library that
probes a call sees an error it handles.
"""
from __future__ import annotations

SERVICE_HOMES = "specops-home"   # below /var/lib: the homes of services with a `user:`

DROPPED_CAPABILITIES = ("CAP_SYS_TIME", "CAP_WAKE_ALARM", "CAP_SYS_MODULE", "CAP_SYS_BOOT", "CAP_SYS_RAWIO",
                        "CAP_SYSLOG", "CAP_AUDIT_CONTROL", "CAP_AUDIT_READ", "CAP_AUDIT_WRITE", "CAP_MAC_ADMIN",
                        "CAP_MAC_OVERRIDE", "CAP_MKNOD", "CAP_LINUX_IMMUTABLE", "CAP_SYS_PACCT", "CAP_SYS_TTY_CONFIG",
                        "CAP_BLOCK_SUSPEND", "CAP_LEASE", "CAP_SYS_CHROOT", "CAP_BPF", "CAP_SETUID",
                        "CAP_SETGID", "CAP_SETPCAP", "CAP_SETFCAP", "CAP_CHOWN", "CAP_FSETID", "CAP_NET_ADMIN")

DENIED_CALLS = ("@clock", "@cpu-emulation", "@module", "@mount", "@obsolete", "@raw-io", "@reboot", "@swap")

# In the unit in this order; each is also a property systemd-run accepts for a transient unit.
PROPERTIES = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "full",          # /usr, /boot, /etc read-only; /opt, /var, /run stay writable
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectHostname": "yes",
    "ProtectProc": "invisible",       # a `user:` service sees only its own processes
    "RestrictSUIDSGID": "yes",
    "RestrictRealtime": "yes",
    "RestrictNamespaces": "yes",
    "LockPersonality": "yes",
    "RestrictAddressFamilies": "~AF_PACKET",
    "SystemCallArchitectures": "native",
    "SystemCallErrorNumber": "EPERM",
    "SystemCallFilter": "~" + " ".join(DENIED_CALLS),
    "CapabilityBoundingSet": "~" + " ".join(DROPPED_CAPABILITIES),
    "UMask": "0027",                  # what the server writes (caches, dumps) is not every user's to read
}


# Before a GPU server starts, with full privileges (the "+": none of the sandboxing above), what
# makes the NVIDIA device nodes when nothing has since boot (no persistence daemon, no udev rule):
# nvidia-smi run as root makes /dev/nvidiactl and a node per GPU, nvidia-modprobe -u loads
# nvidia-uvm and makes /dev/nvidia-uvm.  Under the sandbox the server could not (CUDA runs the
# setuid nvidia-modprobe, which needs module loading and mknod); "-": a host without them goes on.
GPU_NODES_FIRST = '-+/bin/sh -c "nvidia-smi -L >/dev/null 2>&1; nvidia-modprobe -u -c=0 >/dev/null 2>&1; true"'


def as_user(svc: dict) -> dict:
    """A service with `user:` runs as that user (ops/users.py makes it), with a home of its own
    for the JIT caches (/var/lib/<SERVICE_HOMES>/<service>, made by systemd, the user's, 0700;
    a HOME in its `env` wins), and no limit on locked memory (RDMA registers its buffers: root
    has CAP_IPC_LOCK for that, a user has not)."""
    if not svc.get("user"):
        return {}
    home = f"{SERVICE_HOMES}/{svc['name']}"
    out = {"User": svc["user"], "StateDirectory": home, "StateDirectoryMode": "0700", "LimitMEMLOCK": "infinity"}
    if "HOME" not in (svc.get("env") or {}):
        out["Environment"] = f"HOME=/var/lib/{home}"
    return out
