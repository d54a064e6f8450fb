"""Following a service while it starts: is it still making progress, and what is it doing?

A DeepSeek/Kimi-class target loads its weights and captures CUDA graphs for many minutes,
so a fixed deadline either gives up on a good start or waits far too long for a dead one.
Progress is what the service shows: new lines in its journal (this run's only, read from a
cursor; each redraw of a progress bar is a line, by the launcher's relay), the memory its cgroup
holds growing (cgroup v2), and the memory its own processes hold on the GPUs growing (weights
and CUDA graphs land there).  A start is stalled when none has moved for the stall timeout.  The
phase shown on the controller comes from the service's own log lines, matched against the
patterns its kind sends (protocol.ServiceCheck.progress).
"""
import time

from specops.agent.host import clean

CGROUP_ROOT = "/sys/fs/cgroup"
JOURNAL_EVERY = 2.0  # seconds between journal reads (each is a journalctl process)
GPU_EVERY = 10.0     # seconds between asking nvidia-smi (slow on real boxes)


class Startup:
    """One service's start, watched from `since` (its InvocationID's journal entries)."""

    def __init__(self, unit, invocation, patterns, stall_timeout):
        self.unit, self.invocation = unit, invocation
        self.given, self.compiled = patterns, None  # compiled at the first line read: most verifies read none
        self.stall_timeout = stall_timeout
        self.cursor = None
        self.phase = None
        self.lines = 0
        self.memory = 0
        self.moved = time.monotonic()
        # The journal first after JOURNAL_EVERY too: the first read takes this run's last 200
        # lines, so a start that is ready sooner loses nothing by not asking.
        self.read_at = time.monotonic()
        # The first GPU reading only after GPU_EVERY: a start that is ready sooner asks nvidia-smi
        # nothing (memory appearing later is progress all the same).
        self.gpu, self.gpu_at = 0, time.monotonic()
        self.gpu_at_line = 0  # what the service held on the GPUs when its last line came

    def poll(self, control_group):
        """Read what is new; returns True when anything moved."""
        moved = False
        due = time.monotonic() - self.read_at >= JOURNAL_EVERY
        for line in self._new_lines() if due else []:
            self.lines += 1
            moved, self.gpu_at_line = True, self.gpu
            for update in line.split("\r"):  # a bar's updates joined in one line: the last one counts
                self.phase = self.phase_of(update) or self.phase
        memory = _memory(control_group)
        if memory > self.memory:
            moved, self.memory = True, memory
        if time.monotonic() - self.gpu_at >= GPU_EVERY:
            self.gpu_at = time.monotonic()
            used = _gpu_used(self.unit)
            if used > self.gpu:
                moved, self.gpu = True, used
        if moved:
            self.moved = time.monotonic()
        return moved

    def phase_of(self, line):
        """The phase a log line names (the first of the kind's patterns it matches), or None."""
        if self.compiled is None:
            import re  # here and for the journal: a service that is ready reads neither
            self.compiled = [(re.compile(rx), label) for rx, label in self.given]
        for rx, label in self.compiled:
            m = rx.search(line)
            if m:
                return label.format(*m.groups())
        return None

    def words(self):
        """What the start is doing, for the live line: the phase its last line named, and the GPU
        memory of its own processes when that has grown since (a load that logs nothing for
        minutes is still moving)."""
        text = self.phase or "no progress line yet"
        if self.gpu > self.gpu_at_line:
            text += ": GPU memory %.1f -> %.1f GiB" % (self.gpu_at_line / 1024.0, self.gpu / 1024.0)
        return text

    def stalled_for(self):
        return time.monotonic() - self.moved

    def stalled(self):
        return self.stalled_for() > self.stall_timeout

    def _new_lines(self):
        cmd = ["journalctl", "--no-pager", "-o", "cat", "--show-cursor"]
        cmd.append("_SYSTEMD_INVOCATION_ID=" + self.invocation if self.invocation else "--unit=" + self.unit)
        cmd += ["--after-cursor=" + self.cursor] if self.cursor else ["-n", "200"]
        self.read_at = time.monotonic()
        import subprocess
        res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        text = res.stdout.decode(errors="replace")
        lines = []
        for line in text.splitlines():
            if line.startswith("-- cursor: "):
                self.cursor = line[len("-- cursor: "):].strip()
            elif line.strip():
                lines.append("\r".join(clean(part).strip() for part in line.split("\r")))
        return lines


def _gpu_used(unit):
    """MiB the unit's current run holds on all GPUs (0 without nvidia-smi): weights and graphs go
    there, not in the cgroup.  Another user's job growing is not this start's progress."""
    from specops.agent.services.gpus import gpu_fact
    gpu = gpu_fact([unit])
    own = [a["mib"] for a in gpu.get("apps", []) if a["unit"] == unit and not a["earlier"]]
    if None in own:  # nvidia-smi cannot tell per process (MIG, some containers): the GPUs' whole use
        return sum(g["memory.used"] or 0 for g in gpu.get("gpus", []))
    return sum(own)


def _memory(control_group):
    """Bytes the unit's cgroup holds (cgroup v2), 0 when unknown."""
    if not control_group or ".." in control_group:
        return 0
    try:
        with open(CGROUP_ROOT + control_group + "/memory.current") as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0
