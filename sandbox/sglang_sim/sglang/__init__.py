"""Stand-in for SGLang in the specops sandbox: real flag names, rules and endpoints, no model."""
from sglang.version import __version__  # noqa: F401
