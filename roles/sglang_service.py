"""The SGLang systemd unit: an 0600 env file for secrets, the unit, enabled and running."""
from specops.ops import Directory, File, Service, render, unit_file
from specops.spec import API_KEY_ENV, DEFAULT_VENV, launch_args, venv_python
from specops.unitfmt import envfile_line, exec_line, unit_environment

NAME = "sglang_service"
ENV_DIR = "/etc/specops"


def env_file(svc):
    return f"{ENV_DIR}/{svc['name']}.env"


def unit_text(svc, venv):
    argv = [venv_python(venv), "-m", "sglang.launch_server", *launch_args(svc)]
    expand = {}
    if svc.get("api_key"):
        # The key comes from the 0600 env file, so the world-readable unit never holds it.
        argv += ["--api-key", API_KEY_ENV]
        expand = {len(argv) - 1: API_KEY_ENV}
    env = dict(svc.get("env") or {})
    if svc.get("cuda_visible_devices"):
        env["CUDA_VISIBLE_DEVICES"] = svc["cuda_visible_devices"]
    return render("sglang.service.j2", name=svc["name"], model_path=svc["model_path"],
                      env_file=env_file(svc), exec_start=exec_line(argv, expand),
                      environment=[unit_environment(k, v) for k, v in sorted(env.items())],
                      timeout_stop_sec=svc.get("timeout_stop_sec", 120),
                      limit_nofile=svc.get("limit_nofile", 65535))


def env_text(svc):
    secrets = dict(svc.get("env_secret") or {})
    if svc.get("api_key"):
        secrets[API_KEY_ENV] = svc["api_key"]
    return render("sglang.env.j2", name=svc["name"],
                      secrets=[envfile_line(k, v) for k, v in sorted(secrets.items())])


def ops_for_service(svc, venv):
    restart = [f"restart:{svc['name']}"]
    return [
        File(env_file(svc), env_text(svc), mode="0600", secret=True, notify=restart),
        unit_file(svc["name"], unit_text(svc, venv)),
        Service(svc["name"], state="started", enabled=True),
    ]


def ops(host):
    venv = host.get("venv", DEFAULT_VENV)
    out = [Directory(ENV_DIR, mode="0700")]
    for svc in host.get("services") or []:
        out += ops_for_service(svc, venv)
    return out
