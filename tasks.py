"""specops: deploy SGLang with speculative decoding to GPU boxes.  `inv --list` for the tasks."""
import sys

from invoke import Collection, Exit, task

from roles import draft_config, gpu_stack, model_patches, sglang_service, system_packages
from sandbox import tasks as sandbox_tasks
from specops import cli, pipeline
from specops import status as status_mod
from specops.facts import facts_probe
from specops.verify import verify as verify_host

DEPLOY = [gpu_stack, model_patches, draft_config, sglang_service]
BOOTSTRAP = [system_packages] + DEPLOY
H = cli.HELP
SELECT = ("host", "group", "inventory", "accept-new-host-key", "forks")
FLEET = SELECT + ("json", "serial", "max-fail", "break-lock", "quiet")


def helps(*names, **extra):
    return {**{n: H[n] for n in names}, **extra}


@task(help=helps(*FLEET, "check", "diff"))
def deploy(c, host=None, group=None, inventory=None, check=False, diff=False, json=None,
           accept_new_host_key=False, forks=10, serial=0, max_fail=100.0, break_lock=False, quiet=False):
    """Converge hosts: lock, probe, plan, apply, handlers, verify, record the release.
    If verify fails, this deploy's changes are undone and the previous release verified."""
    cli.play(pipeline.deploy, DEPLOY, task="deploy", **options(locals()))


@task(help=helps(*FLEET))
def bootstrap(c, host=None, group=None, inventory=None, json=None, accept_new_host_key=False,
              forks=10, serial=0, max_fail=100.0, break_lock=False, quiet=False):
    """Take a bare Debian/Ubuntu GPU box to verified serving: apt, venv, GPU stack, patches,
    draft config, unit, verify."""
    cli.play(pipeline.bootstrap, BOOTSTRAP, task="bootstrap", **options(locals()))


@task(help=helps(*SELECT, "json", "break-lock", to="Release stamp to restore (default: the one before current)"))
def rollback(c, host=None, group=None, inventory=None, to=None, json=None, accept_new_host_key=False,
             forks=10, break_lock=False):
    """Restore the previous release (or --to STAMP): files, bytecode purge, reload, restart, verify."""
    cli.play(lambda run: pipeline.rollback(run, to), [], task="rollback",
             **options(locals()))


@task(help=helps(*SELECT))
def releases(c, host=None, group=None, inventory=None, accept_new_host_key=False, forks=10):
    """List each host's releases, newest last; * marks current."""
    found = {}
    cli.play(lambda run: found.__setitem__(run.host.name, pipeline.releases(run)), [], quiet=True,
             stream=sys.stderr, **options(locals()))
    for name, res in found.items():
        for r in res["releases"]:
            mark = "*" if r["current"] else " "
            print(f"{name:<12} {mark} {r['stamp']}  {r['status']:<11} {', '.join(r['services'])}  {r['summary'][:70]}")


@task(help=helps(*SELECT, "json", "break-lock", service="Only this service (default: all on the host)"))
def stop(c, host=None, group=None, inventory=None, service=None, json=None, accept_new_host_key=False,
         forks=10, break_lock=False):
    """Stop SGLang and prove its GPU memory is free: leftover processes are killed."""
    def body(run):
        run.probe([], lock=True)
        pipeline.stop(run, [service] if service else None)

    cli.play(body, [], task="stop", **options(locals()))


@task(name="gpu-window", help=helps("host", "inventory", "accept-new-host-key", "break-lock", "json",
                                    service="Only stop this service (default: all on the host)"))
def gpu_window(c, host=None, inventory=None, service=None, accept_new_host_key=False, break_lock=False,
               json=None):
    """Stop SGLang, prove the GPUs free, run the job after `--` on the host, then always restart
    and verify.  Exits with the job's status.  Example: inv gpu-window --host ct129 -- python x.py"""
    if "--" not in sys.argv or not sys.argv[sys.argv.index("--") + 1:]:
        print("error: give the job after --, e.g. inv gpu-window --host ct129 -- python job.py", file=sys.stderr)
        raise Exit(code=2)
    job = " ".join(sys.argv[sys.argv.index("--") + 1:])
    (report,) = cli.play(lambda run: pipeline.gpu_window(run, job, [service] if service else None), [],
                         task="gpu-window", exit_on_failure=False, **options(locals()))
    status = report.extra.get("job_status", 1)
    # The job's status; a window whose service did not come back healthy never reports success.
    raise Exit(code=status if status or not report.error else 1)


@task(help=helps(*SELECT, "json"))
def verify(c, host=None, group=None, inventory=None, json=None, accept_new_host_key=False, forks=10):
    """Check each service: ready, serving its model, running the intended spec args, generating."""
    cli.play(verify_host, DEPLOY, task="verify", **options(locals()))


@task(help=helps(*SELECT, "json"))
def status(c, host=None, group=None, inventory=None, json=None, accept_new_host_key=False, forks=10):
    """Per service: state, uptime, drift from the inventory, stale code, effective spec args, GPU memory."""
    results = {}
    try:
        cli.play(lambda run: results.__setitem__(run.host.name, status_mod.collect(run)), DEPLOY,
                 check=True, quiet=True, stream=sys.stderr, **options(locals()))
    finally:
        if results:
            print(status_mod.table(results))


@task(help=helps(*SELECT))
def facts(c, host=None, group=None, inventory=None, accept_new_host_key=False, forks=10):
    """Print the facts one probe gathers from each host, as JSON."""
    collected = {}
    try:
        cli.play(lambda run: collected.__setitem__(run.host.name, facts_probe(run)), [], quiet=True,
                 stream=sys.stderr, **options(locals()))
    finally:
        cli.print_json(collected)


PLAY_OPTIONS = {"inventory", "host", "group", "check", "diff", "json", "accept_new_host_key", "forks",
                "quiet", "serial", "max_fail", "break_lock"}


def options(values):
    """The shared options among a task's arguments, as cli.play takes them."""
    return {k: v for k, v in values.items() if k in PLAY_OPTIONS}


ns = Collection(deploy, bootstrap, rollback, releases, stop, gpu_window, verify, status, facts)
ns.add_collection(Collection.from_module(sandbox_tasks, name="sandbox"))
