"""Ansible-style inventory: hosts.yml or an Ansible INI file, plus group_vars/ and host_vars/.

Ansible's connection variables (ansible_host, ansible_user, ...) are read as ours
(`ansible`); unknown ansible_* keys are named in one warning line each (refused one typo away
from a key we read).
Precedence is all < parent group < child group < host; a group_vars file
overrides the vars written inline for that group.  Mappings merge key by key,
everything else replaces.  Every error names the file and the key path, and
is raised before any connection is made.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import multinode
from .. import usertext
from ..errors import UsageError
from ..lazy import lazy
from .checker import check, key_path
from .schema import check_kinds

NODE_KEYS = {"vars", "children", "hosts"}
YAML_SUFFIXES = (".yml", ".yaml")
_warned: set[str] = set()
# Only for an INI inventory, or Ansible's spellings of vars: not every task's to import.
ansible = lazy("specops.inventory.ansible")


def _host_vars(values: Any, vocabulary: dict, file: str, where: str) -> dict:
    """A vars mapping checked against the vocabulary, with Ansible's spellings read as ours."""
    if isinstance(values, dict) and any(str(k).startswith("ansible_") for k in values):
        warnings: list[str] = []
        values = ansible.translate(values, file, where, warnings)
        for line in warnings:
            if line not in _warned:  # once per run, however often the inventory is loaded
                _warned.add(line)
                print(line, file=sys.stderr)
    check(values, vocabulary, file, where)
    return values


@dataclass
class Host:
    name: str
    vars: dict[str, Any]
    groups: list[str] = field(default_factory=list)
    inventory: "Inventory | None" = field(default=None, repr=False, compare=False)  # the others (a peer)
    # Where each of its vars was set, as 'file: key.path' (the layer that won), for errors that
    # arise only once the layers are merged (two services on one port) to name the place to edit.
    origins: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __getitem__(self, key: str) -> Any:
        return self.vars[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.vars.get(key, default)

@dataclass
class Inventory:
    path: Path
    hosts: dict[str, Host]
    groups: dict[str, list[str]]  # group → host names, transitively

    def select(self, host: str | None = None, group: str | None = None) -> list[Host]:
        """The same selection rules in every task: --host a,b | --group g | all."""
        if host and group:
            raise UsageError("give --host or --group, not both")
        if host:
            names = [n.strip() for n in host.split(",") if n.strip()]
            unknown = [n for n in names if n not in self.hosts]
            if unknown:
                raise UsageError(f"{self.path}: unknown host {unknown[0]!r} "
                                 f"(known: {', '.join(sorted(self.hosts)) or 'none'})")
            return [self.hosts[n] for n in dict.fromkeys(names)]
        if group:
            if group not in self.groups:
                raise UsageError(f"{self.path}: unknown group {group!r} "
                                 f"(known: {', '.join(sorted(self.groups))})")
            return [self.hosts[n] for n in self.groups[group]]
        return list(self.hosts.values())


def _read_yaml(path: Path) -> Any:
    text = usertext.read(path)
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f":{mark.line + 1}" if mark else ""
        raise UsageError(f"{path}{where}: invalid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise UsageError(f"{path}: invalid YAML: {e}") from None


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _vars_file(directory: Path, name: str, vocabulary: dict) -> tuple[dict, dict]:
    """A group_vars/ or host_vars/ file's vars, and where each was set."""
    for ext in (".yml", ".yaml"):
        path = directory / f"{name}{ext}"
        if path.exists():
            data = _read_yaml(path)
            values = {} if data is None else _host_vars(data, vocabulary, str(path), "")
            return values, _origins(values, str(path), "")
    return {}, {}


def _origins(values: dict, file: str, where: str) -> dict[str, str]:
    return {k: f"{file}: {key_path(where, k)}" for k in values}


def _hosts_files(directory: Path) -> list[Path]:
    """The hosts files of an inventory directory: hosts.yml and any other *.yml beside it, or its
    one Ansible INI file (hosts.ini, hosts, production, ...), as Ansible takes a directory."""
    yml = sorted(directory.glob("*.yml"), key=lambda p: (p.name != "hosts.yml", p.name))
    ini = [p for p in sorted(directory.iterdir()) if p.is_file() and not p.name.startswith(".")
           and (p.suffix == ".ini" or (not p.suffix and ansible.looks_like_ini(p)))]
    if yml and ini:
        raise UsageError(f"{directory}: both {yml[0].name} and {ini[0].name} could be the inventory: "
                         f"keep one there, or give -i {directory / ini[0].name}")
    if len(ini) > 1:
        raise UsageError(f"{directory}: {', '.join(p.name for p in ini)} could each be the inventory: "
                         f"give one with -i {directory / ini[0].name}")
    if not yml and not ini:
        raise UsageError(f"{directory}: no hosts.yml or INI inventory (hosts.ini) in the inventory directory")
    return yml or ini


def load(path: str | Path, vocabulary: dict) -> Inventory:
    """Load an inventory directory (hosts.yml and any other *.yml beside it, or one INI file) or
    one hosts file: YAML, or Ansible's INI format when its name does not end in .yml/.yaml.
    `vocabulary`: the host vars it may hold (roles.VOCABULARY: the engine's and the roles')."""
    path = Path(path)
    if path.is_dir():
        files, root_dir = _hosts_files(path), path
    elif path.exists():
        files, root_dir = [path], path.parent
    else:
        raise UsageError(f"{path}: inventory not found")

    host_layers: dict[str, list[tuple[int, str, dict, dict]]] = {}  # (depth, group, vars, their origins)
    groups: dict[str, list[str]] = {}
    inline_host: dict[str, tuple[dict, dict]] = {}

    def walk(hosts_file: Path, name: str, node: Any, where: str, depth: int, parents: list[str]) -> list[str]:
        if node is None:
            node = {}
        if not isinstance(node, dict):
            raise UsageError(f"{hosts_file}: {where}: must be a mapping, not {type(node).__name__}")
        for key in node:
            if key not in NODE_KEYS:
                raise UsageError(f"{hosts_file}: {where}.{key}: unknown key "
                                 f"(a group has {', '.join(sorted(NODE_KEYS))})")
        inline = _host_vars(node.get("vars") or {}, vocabulary, str(hosts_file), f"{where}.vars")
        from_file, file_origins = _vars_file(root_dir / "group_vars", name, vocabulary)
        group_vars = merge(inline, from_file)
        origins = {**_origins(inline, str(hosts_file), f"{where}.vars"), **file_origins}
        members: list[str] = []
        hosts = node.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise UsageError(f"{hosts_file}: {where}.hosts: must be a mapping of host names")
        for hname, hvars in hosts.items():
            hwhere = f"{where}.hosts.{hname}"
            hvars = _host_vars(hvars or {}, vocabulary, str(hosts_file), hwhere)
            if hname in inline_host and inline_host[hname][0] != hvars:
                raise UsageError(f"{hosts_file}: {hwhere}: host defined twice with different vars")
            inline_host[hname] = hvars, _origins(hvars, str(hosts_file), hwhere)
            members.append(hname)
        children = node.get("children") or {}
        if not isinstance(children, dict):
            raise UsageError(f"{hosts_file}: {where}.children: must be a mapping of group names")
        for child, cnode in children.items():
            if child in parents or child == name:
                raise UsageError(f"{hosts_file}: {where}.children.{child}: group cycle")
            members += walk(hosts_file, child, cnode, f"{where}.children.{child}", depth + 1,
                            parents + [name])
        members = list(dict.fromkeys(members))
        groups[name] = list(dict.fromkeys(groups.get(name, []) + members))
        for h in members:
            host_layers.setdefault(h, []).append((depth, name, group_vars, origins))
        return members

    for hosts_file in files:
        data = _read_yaml(hosts_file) if hosts_file.suffix in YAML_SUFFIXES else ansible.parse_ini(hosts_file)
        if not isinstance(data, dict) or set(data) != {"all"}:
            raise UsageError(f"{hosts_file}: the top level must be a single key 'all'")
        walk(hosts_file, "all", data["all"], "all", 0, [])
    hosts = {}
    for hname, layers in host_layers.items():
        merged: dict = {}
        origins: dict[str, str] = {}
        # Deeper groups win; ties are broken by name, as Ansible does.  Then the host's own.
        ordered = [(gvars, where) for _, _, gvars, where in sorted(layers, key=lambda layer: (layer[0], layer[1]))]
        for values, where in ordered + [inline_host.get(hname, ({}, {})),
                                        _vars_file(root_dir / "host_vars", hname, vocabulary)]:
            merged = merge(merged, values)
            origins.update(where)
        check_kinds(hname, merged.get("services"), str(files[0]))
        hosts[hname] = Host(hname, merged, sorted({layer[1] for layer in layers}), origins=origins)
    inventory = Inventory(files[0], hosts, groups)
    for host in hosts.values():
        host.inventory = inventory
    for host in hosts.values():  # a service across hosts: each node's rank and rank 0's address
        if host.get("services"):
            host.vars["services"] = [multinode.place(inventory, host, s, str(files[0])) for s in host["services"]]
    return inventory
