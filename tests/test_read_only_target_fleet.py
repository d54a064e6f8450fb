"""A deploy whose patched model file's directory is on a read-only filesystem: --check says so, and
the deploy is refused at plan time, the host left on the release it was on, nothing moved."""
import pytest

from sandbox import provision
from sandbox.provision import sandbox_service
from support.releases import current, first_release, inventory, serving
from support.site import run_inv

pytestmark = pytest.mark.fleet


def test_check_says_a_read_only_target_before_anything_changes(sandbox):
    """A patched model file whose directory is on a read-only filesystem: --check says so, and the
    deploy is refused at plan time, before anything moves."""
    h = sandbox.reset("t4")
    models = f"{provision.VENV}/lib/python3.11/site-packages/sglang/srt/models"
    one, release1, before = first_release(sandbox, h, "one", {"t4": {"services": [sandbox_service()]}})
    h.run("sh", "-ec", f"cp -a {models} /root/models.bak && mount -t tmpfs -o size=4m tmpfs {models} && "
                       f"cp -a /root/models.bak/. {models}/ && mount -o remount,ro {models}")
    try:
        two = inventory(sandbox, "two", {"t4": {"services": [sandbox_service(patches=["srt/models/llama.py"])]}})
        said = f"{models}/llama.py: {models} is on a read-only filesystem: nothing can be staged there"
        res = sandbox.inv("deploy", "--host", "t4", "--check", inventory=two)
        assert res.returncode == 1 and said in res.stdout, res.stdout[-3000:]
        res, rep = run_inv(sandbox, two, "deploy", "--host", "t4")
        assert res.returncode == 1 and said in rep["t4"]["error"], res.stdout[-3000:]
        assert serving(h) == before and current(h) == release1
    finally:
        h.run("umount", models, check=False)
