"""The unit file and the 0600 env file of a service of any kind (the SGLang service role and the
router role write them; the benchmark renders the unit too)."""
from __future__ import annotations

from ..layout import SECRET_FLAGS, env_file
from ..ops.files import render_kept
from ..ops.unitfmt import envfile_line, exec_line, unit_environment
from . import kind_of


def unit_text(svc, venv):
    """The unit of a service of any kind (the router's role uses it too).  The launcher hands the
    API key (from the 0600 env file) to the server in-process: no secret is in the world-readable
    unit, nor in the process's command line."""
    kind = kind_of(svc)
    argv, props = kind.argv(svc, venv), kind.properties(svc)
    env = dict(svc.get("env") or {})
    if svc.get("cuda_visible_devices"):
        env["CUDA_VISIBLE_DEVICES"] = svc["cuda_visible_devices"]
    return render_kept("sglang.service.j2", description=kind.description(svc).replace("%", "%%"),
                  env_file=env_file(svc["name"]), exec_start=exec_line(argv),
                  environment=[unit_environment(k, v) for k, v in sorted(env.items())],
                  properties=list(props.items()))


def env_text(svc):
    """The 0600 env file.  Its template is kept by the memo rendered with a mark in place of each
    secret line, which goes in only here: no secret is ever written to the memo."""
    secrets = dict(svc.get("env_secret") or {})
    for key, (variable, _) in SECRET_FLAGS.items():
        if svc.get(key):
            secrets[variable] = svc[key]
    lines = [envfile_line(k, v) for k, v in sorted(secrets.items())]  # refuses a NUL, so no line is a mark
    marks = [f"\0{i}\0" for i in range(len(lines))]
    text = render_kept("sglang.env.j2", name=svc["name"], secrets=marks)
    for mark, line in zip(marks, lines):
        text = text.replace(mark, line)
    return text
