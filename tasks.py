"""specops: deploy SGLang with speculative decoding to GPU boxes.  `inv --list` for the tasks."""
import sys

from invoke import Collection, task

from roles import draft_config, gpu_stack, model_patches, sglang_service
from sandbox import tasks as sandbox_tasks
from specops import cli
from specops import status as status_mod
from specops.facts import facts_probe
from specops.verify import verify as verify_host

DEPLOY = [gpu_stack, model_patches, draft_config, sglang_service]
H = cli.HELP


@task(help={k: H[k] for k in ("host", "group", "inventory", "check", "diff", "json",
                              "accept-new-host-key", "forks", "quiet")})
def deploy(c, host=None, group=None, inventory=None, check=False, diff=False, json=None,
           accept_new_host_key=False, forks=10, quiet=False):
    """Converge hosts to the inventory: probe, plan, apply, run handlers, then verify."""
    def body(run):
        run.converge()
        if not check:
            verify_host(run)

    cli.play(body, DEPLOY, inventory=inventory, host=host, group=group, check=check, diff=diff,
             json_path=json, accept_new=accept_new_host_key, forks=forks, quiet=quiet)


@task(help={k: H[k] for k in ("host", "group", "inventory", "json", "accept-new-host-key", "forks")})
def verify(c, host=None, group=None, inventory=None, json=None, accept_new_host_key=False, forks=10):
    """Check each service: ready, serving its model, running the intended spec args, generating."""
    cli.play(verify_host, DEPLOY, inventory=inventory, host=host, group=group, json_path=json,
             accept_new=accept_new_host_key, forks=forks)


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


@task(help={k: H[k] for k in ("host", "group", "inventory", "json", "accept-new-host-key", "forks")})
def status(c, host=None, group=None, inventory=None, json=None, accept_new_host_key=False, forks=10):
    """Show each service's state, uptime, drift from the inventory, stale code and GPU memory."""
    results = {}

    def body(run):
        results[run.host.name] = status_mod.collect(run)

    try:
        cli.play(body, DEPLOY, inventory=inventory, host=host, group=group, check=True, quiet=True,
                 json_path=json, accept_new=accept_new_host_key, forks=forks, stream=sys.stderr)
    finally:
        if results:
            print(status_mod.table(results))


ns = Collection(deploy, verify, status, facts)
ns.add_collection(Collection.from_module(sandbox_tasks, name="sandbox"))
