"""A release directory as pipeline.record writes it, with the host's files (the textfile tests'
host), and the exposition the textfile holds, parsed."""
import json

from specops.agent import textfile
from specops.agent.host import sha256_file

SECRET = "sk-very-secret-key"


def release(tmp_path, monkeypatch, perf=None, tune=None, provenance=None):
    """A release dir with a manifest like pipeline.record writes, and the host's files."""
    releases = tmp_path / "releases"
    d = releases / "20261206T120000.000000Z"
    d.mkdir(parents=True)
    unit = tmp_path / "sglang.service"
    unit.write_text("[Service]\nExecStart=/bin/true\n")
    env = tmp_path / "sglang.env"
    env.write_text(f"SGLANG_SPECOPS_API_KEY={SECRET}\n")
    manifest = {
        "stamp": d.name, "status": "deployed", "services": ["sglang"], "venv": "/opt/specops/venvs/abc",
        "packages": {"sglang": "0.5.23"}, "weights": {"/models/t": {"digest": "d" * 64}},
        "spec": {"sglang": {"speculative_num_steps": 3, "speculative_eagle_topk": 1,
                            "speculative_num_draft_tokens": 4}},
        "watch": {"sglang": {"cuda_graph": True, "gate_min_accept_length": 2.5}},
        "verify": [{"name": "sglang", "managed": [str(unit), str(env)], "weights": ["/models/t"]}],
        "files": {str(unit): {"sha256": sha256_file(str(unit))},
                  str(env): {"sha256": sha256_file(str(env))}},
    }
    if provenance:
        manifest["provenance"] = provenance
    (d / "manifest.json").write_text(json.dumps(manifest))
    for kind, rec in (("perf", perf), ("tune", tune)):
        if rec:
            (d / f"{kind}.json").write_text(json.dumps({"sglang": rec}))
    import specops.agent.releases as rel
    monkeypatch.setattr(rel, "RELEASES", str(releases))
    (releases / "current").symlink_to(d.name)
    from specops.agent.services import verdicts
    monkeypatch.setattr(verdicts, "VERDICTS", str(tmp_path / "verdicts.json"))
    monkeypatch.setattr(textfile, "unit_state", lambda name: {"ActiveState": "active", "NRestarts": "2",
                                                              "ExecMainStartTimestamp": 1e12})
    return unit, env


def parse(text):
    """{(name, frozenset(labels)): value} with the exposition's rules (a # TYPE before each series)."""
    out, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if line.startswith("#") or not line:
            continue
        head, value = line.rsplit(" ", 1)
        name, _, labels = head.partition("{")
        assert name in typed, line
        pairs = (frozenset(tuple(p.split("=", 1)) for p in labels.rstrip("}").split('",') if p) if labels
                 else frozenset())
        out[(name, frozenset((k, v.strip('"')) for k, v in pairs))] = float(value)
    return out
