#!/usr/bin/python3
"""nvidia-smi stand-in: the --query-gpu and --query-compute-apps forms specops uses, and -L.

Run as root, it makes the device nodes that are missing, as the real one does through
nvidia-modprobe (here regular files, root:video 0660, as sandbox/provision.py's tmpfiles
make them at boot).

GPUs come from /etc/specops-sim/gpus.json.  Compute apps are the processes the
SGLang simulator registered in /run/sglang-sim/gpu that are still alive, so
memory is freed only when those processes really die.  A GPU with
"memory_unreported": "[N/A]" (or "[Not Supported]") prints that text for its
memory fields and its apps' used_memory, as real nvidia-smi does for MIG devices
and some drivers.
"""
import json
import os
import sys

CONFIG = "/etc/specops-sim/gpus.json"
REGISTRY = "/run/sglang-sim/gpu"
DEFAULT = {"driver_version": "575.57.08", "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_total": 81559}]}


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def apps():
    out = []
    try:
        names = sorted(os.listdir(REGISTRY), key=lambda n: int(n.split(".")[0]) if n.split(".")[0].isdigit() else -1)
    except OSError:
        return out
    for n in names:
        try:
            with open(os.path.join(REGISTRY, n)) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        if alive(rec["pid"]):
            out += [(rec["pid"], g, rec["used_memory"]) for g in rec["gpus"]]
    return out


def make_nodes(count):
    for name in ["nvidiactl", "nvidia-uvm"] + ["nvidia%d" % i for i in range(count)]:
        path = "/dev/" + name
        if not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o660)
            os.fchown(fd, 0, 44)  # video
            os.fchmod(fd, 0o660)
            os.close(fd)


def main(argv):
    try:
        with open(CONFIG) as f:
            cfg = json.load(f)
    except OSError:
        cfg = DEFAULT
    gpus = cfg["gpus"]
    uuid = lambda i: "GPU-00000000-0000-0000-0000-%012d" % i  # noqa: E731
    if os.geteuid() == 0:
        make_nodes(len(gpus))
    if argv == ["-L"]:
        for i, g in enumerate(gpus):
            print("GPU %d: %s (UUID: %s)" % (i, g["name"], uuid(i)))
        return 0
    opts = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    fmt = opts.get("--format", "")
    if "csv" not in fmt:
        print("specops nvidia-smi stand-in: only --query-gpu/--query-compute-apps with --format=csv",
              file=sys.stderr)
        return 2
    running = apps()
    rows = []
    if "--query-gpu" in opts:
        for i, g in enumerate(gpus):
            used = sum(m for _, gi, m in running if gi == i)
            vals = {"index": i, "uuid": uuid(i), "name": g["name"], "driver_version": cfg["driver_version"],
                    "memory.total": g["memory_total"], "memory.used": used,
                    "memory.free": g["memory_total"] - used}
            if g.get("memory_unreported"):
                vals.update(dict.fromkeys(("memory.total", "memory.used", "memory.free"), g["memory_unreported"]))
            rows.append([vals.get(f, "[N/A]") for f in opts["--query-gpu"].split(",")])
    elif "--query-compute-apps" in opts:
        for pid, gi, mem in running:
            if gi >= len(gpus):
                continue
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    name = f.read().split(b"\0")[0].decode() or "python"
            except OSError:
                name = "python"
            vals = {"pid": pid, "gpu_uuid": uuid(gi), "used_memory": gpus[gi].get("memory_unreported") or mem,
                    "process_name": name}
            rows.append([vals.get(f, "[N/A]") for f in opts["--query-compute-apps"].split(",")])
    else:
        print("unsupported query", file=sys.stderr)
        return 2
    for r in rows:
        print(", ".join(str(v) for v in r))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
