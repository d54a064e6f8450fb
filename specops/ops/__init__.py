"""Idempotent operations: the engine's contract (base) and the ops every role builds on.

- base: Change, Facts, Context, Op, merge_wants;
- files: File (and templates), Directory, Absent, JsonKeys;
- systemd: unit files, Service, Command;
- code: PurgeBytecode, RunningCode;
- venv: Venv;
- users: the system user of a service with `user:`.
"""
from .base import Change, Context, Facts, Op, PlanError, merge_wants, unified_diff
from .code import PurgeBytecode, RunningCode, host_state
from .files import Absent, Directory, File, JsonKeys, dotted_get, dotted_set, render, template
from .systemd import Command, Service, unit_file
from .venv import Venv

__all__ = ["Change", "Context", "Facts", "Op", "PlanError", "merge_wants", "unified_diff", "PurgeBytecode",
           "RunningCode", "host_state", "Absent", "Directory", "File", "JsonKeys", "dotted_get", "dotted_set",
           "render", "template", "Command", "Service", "unit_file", "Venv"]
