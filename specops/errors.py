"""The two ways a run can fail, and the exit codes users script against."""


class SpecopsError(Exception):
    """A failure on a host, or of the run: exit 1."""

    exit_code = 1


class UsageError(SpecopsError):
    """Bad input found before any connection is made: exit 2."""

    exit_code = 2


class NotStarted(SpecopsError):
    """The host's agent never started (sudo refused or failed): no request reached the host, so
    no lock was taken there.  Asking again would be a second sudo attempt."""


class HostKeyError(SpecopsError):
    """The host's SSH key is unknown or has changed."""


class GateFailed(SpecopsError):
    """A deploy's spec-bench fell below a service's gate.  `measured`: the perf.json records it
    made, kept with the release that is undone (the page shows them, marked rolled back)."""

    def __init__(self, message: str, measured: list):
        super().__init__(message)
        self.measured = measured


class ApplyFailed(SpecopsError):
    """A batch failed on the host.  `phase`: where (protocol.PHASES; before the switch nothing that
    serves was touched)."""

    def __init__(self, message: str, phase: str):
        super().__init__(message)
        self.phase = phase
