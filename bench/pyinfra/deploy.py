"""The benchmark workload, the way a pyinfra user writes it."""
from pyinfra import host
from pyinfra.operations import files, server, systemd

MODELS = "/opt/sglang/venv/lib/python3.11/site-packages/sglang/srt/models"

unit = files.template(name="SGLang unit", src=host.data.unit_template,
                      dest="/etc/systemd/system/sglang.service", mode="644")
patches = []
for name in ("llama.py", "qwen2.py"):
    put = files.put(name=f"patch {name}", src=f"{host.data.patch_dir}/srt/models/{name}",
                    dest=f"{MODELS}/{name}", mode="644")
    server.shell(name=f"purge {name} bytecode", commands=[f"rm -f {MODELS}/__pycache__/{name[:-3]}.*.pyc"],
                 _if=put.did_change)
    patches.append(put)
systemd.daemon_reload(name="daemon-reload", _if=unit.did_change)
systemd.service(name="restart on change", service="sglang", restarted=True,
                _if=lambda: unit.did_change() or any(p.did_change() for p in patches))
systemd.service(name="SGLang running", service="sglang", running=True, enabled=True)
server.shell(name="health", commands=["for i in $(seq 120); do curl -sf -o /dev/null "
                                      "http://127.0.0.1:30000/health && exit 0; sleep 0.5; done; exit 1"])
