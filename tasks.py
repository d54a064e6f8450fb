"""specops: deploy SGLang with speculative decoding to GPU boxes.  `inv --list` for the tasks."""
import sys

from invoke import Collection, task

from roles import sglang_service
from sandbox import tasks as sandbox_tasks
from specops import cli
from specops.facts import facts_probe

DEPLOY = [sglang_service]
H = cli.HELP


@task(help={k: H[k] for k in ("host", "group", "inventory", "check", "diff", "json",
                              "accept-new-host-key", "forks", "quiet")})
def deploy(c, host=None, group=None, inventory=None, check=False, diff=False, json=None,
           accept_new_host_key=False, forks=10, quiet=False):
    """Converge hosts to the inventory: probe, plan, apply, run handlers."""
    cli.play(lambda run: run.converge(), DEPLOY, inventory=inventory, host=host, group=group,
             check=check, diff=diff, json_path=json, accept_new=accept_new_host_key,
             forks=forks, quiet=quiet)


@task(help={k: H[k] for k in ("host", "group", "inventory", "accept-new-host-key")})
def facts(c, host=None, group=None, inventory=None, accept_new_host_key=False):
    """Print the facts one probe gathers from each host, as JSON."""
    collected = {}

    def body(run):
        collected[run.host.name] = facts_probe(run)

    try:
        cli.play(body, [], inventory=inventory, host=host, group=group,
                 accept_new=accept_new_host_key, quiet=True, stream=sys.stderr)
    finally:
        cli.print_json(collected)


ns = Collection(deploy, facts)
ns.add_collection(Collection.from_module(sandbox_tasks, name="sandbox"))
