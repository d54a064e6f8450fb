"""specops: deploy SGLang with speculative decoding to GPU boxes.  `inv --list` for the tasks."""
import sys
from functools import partial

from invoke import Collection, Exit

from roles import BOOTSTRAP, DEPLOY, VOCABULARY
from sandbox.collection import collection as sandbox_tasks
from specops import again, cli, usage
from specops import inventory as inventory_mod
from specops import outfile
from specops.cli import FLEET, SELECT, fleet_task
from specops.errors import UsageError
from specops.lazy import lazy
from specops.output.report import Redactor

# Imported when a task first uses them: an `inv` run pays only for what its task runs.
facts_mod = lazy("specops.flows.facts")
gate = lazy("specops.flows.gate")
patching = lazy("specops.flows.patching")
pipeline = lazy("specops.flows.pipeline")
rolling = lazy("specops.flows.rolling")
specbench = lazy("specops.flows.specbench")
status_mod = lazy("specops.flows.status")
textfile = lazy("specops.flows.textfile")
tuning = lazy("specops.flows.tuning")
tuning_apply = lazy("specops.flows.tuning_apply")
traffic_flow = lazy("specops.flows.traffic")
verify_mod = lazy("specops.flows.verify")
prometheus_mod = lazy("specops.fleetwide.prometheus")
report_mod = lazy("specops.fleetwide.report")
releases_out = lazy("specops.output.releases")

# A mistake on the command line (an unknown option, FILE not given) is one line and exit 2, as
# the tasks' own usage errors are.
usage.install()
# Every task reads the inventory in the roles' vocabulary.
play = partial(cli.play, vocabulary=VOCABULARY)
select = partial(cli.select, vocabulary=VOCABULARY)
# A prompt file as specops/prompts.py reads it (which only spec-bench and spec-tune import).
PROMPTS_HELP = ('A prompt file: a JSON list of strings, or JSONL with {"prompt": ...} or {"messages": [...]} a '
                "line (default: files/prompts.json)")
TRAFFIC_HELP = {
    "traffic": "Measure on N requests (default 200) the service serves now, taken through SGLang's own "
    "request dump (kept on the host, root's, deleted when the task ends; docs/spec-payoff.md "
    "says what it holds)",
    "traffic_wait": "With --traffic: the most seconds to wait for the N requests (default 600)",
    "fetch_sample": "With --traffic: also write the sample (the prompts users sent) to this local file, 0600",
}


@fleet_task(*FLEET, "check", "diff", "verify_weights",
            bench="After verify, hold each service with a `gate` to it (spec-bench; a failure undoes the deploy); "
                  "refused when no selected service has one",
            no_drain="Do not take workers out of their routers while they change, and stop their servers without "
                     "draining (requests will fail)")
def deploy(c, sel, bench=False, no_drain=False):
    """Converge hosts: lock, probe, plan, apply, handlers, verify, record the release.
    If verify (or, with --bench, a service's gate) fails, this deploy's changes are undone and the
    previous release verified.  A worker behind a router is taken out of it and drained before
    it changes, and put back once it verifies (with --serial N: a rolling deploy)."""
    body = lambda run: pipeline.deploy(run, gate.gated if bench else None)  # noqa: E731
    play(lambda run: rolling.deploy(run, body, drain=not no_drain), DEPLOY, sel, task="deploy",
         refuse=gate.refuse_ungated if bench else None)


@fleet_task(*FLEET, "verify_weights")
def bootstrap(c, sel):
    """Take a bare Debian/Ubuntu GPU box to verified serving: apt, venv, GPU stack, patches,
    draft config, unit, verify."""
    play(pipeline.bootstrap, BOOTSTRAP, sel, task="bootstrap")


@fleet_task(*SELECT, file="The file inside the sglang package (srt/models/deepseek_v2.py), or its .patch",
            edited="A local edited copy of FILE: write FILE.patch, a diff against the SGLang the inventory asks for "
            "(nothing written while it holds conflict markers, or fails deploy's patch check)",
            fetch="Write FILE of the SGLang the inventory asks for here, to edit",
            rebase="Carry FILE.patch onto the SGLang the inventory asks for: writes FILE.patch.<version>, or, on "
            "conflicts, FILE.merge-<version> with diff3 markers (then --edited it)")
def patch(c, sel, file, edited=None, fetch=False, rebase=False):
    """Make a patch to an SGLang file (FILE: its path inside the sglang package, e.g.
    srt/models/deepseek_v2.py) against the SGLang version the inventory asks for: --fetch it to
    edit, --edited to write the diff, --rebase to carry an existing diff onto that version.  The
    file comes from the host's stack when built, else from that version's wheel (the wheelhouse,
    or the host's package indexes), so this works before the new version is deployed.
    Everything is written locally for review; nothing is written onto the host."""
    if [bool(edited), fetch, rebase].count(True) != 1:
        raise UsageError("give one of --fetch, --edited PATH, --rebase")
    hosts = select(sel)
    if len(hosts) != 1:
        raise UsageError("inv patch reads one host's SGLang: give --host")
    body = patching.body(hosts[0], file, edited, "edited" if edited else "fetch" if fetch else "rebase")
    for r in play(body, [], sel, task="patch", quiet=True, stream=sys.stderr, read_only=True):
        print(r.result)


@fleet_task(*SELECT, "json", "break_lock", to="Release stamp to restore (default: the one before current)")
def rollback(c, sel, to=None):
    """Restore the previous release (or --to STAMP): files, bytecode purge, reload, restart, verify."""
    play(lambda run: pipeline.rollback(run, to), [], sel, task="rollback")


@fleet_task(*SELECT, "json")
def releases(c, sel):
    """List each host's releases, newest last, * on current; who deployed each, from which commits."""
    def show(reports):
        columns = releases_out.width()
        for r in reports:
            for line in releases_out.lines(r.name, r.result.releases if r.result else [], columns):
                print(line)
            for line in releases_out.stack_lines(r.name, r.result.stacks if r.result else [],
                                                 r.result.uv_cache if r.result else 0):
                print(line)
    play(pipeline.releases, [], sel, quiet=True, stream=sys.stderr, show=show, read_only=True)


@fleet_task(*SELECT, "json", "break_lock", optional=("traffic",),
            service="The service to measure (default: the host's only one)",
            baseline="Also measure the target without speculation, in a GPU window, and compare",
            prompts=PROMPTS_HELP,
            concurrency="Levels of concurrency, comma-separated (default 1,8,32)",
            requests="Requests per level (default 64)", max_new_tokens="Tokens per request (default 128)",
            **TRAFFIC_HELP)
def spec_bench(c, sel, service=None, baseline=False, prompts=None, concurrency="1,8,32", requests="64",
               max_new_tokens="128", traffic=None, traffic_wait=None,
               fetch_sample=None):  # numbers as text: cli.whole refuses a bad one in one line
    """Does speculative decoding pay off?  Drive the service on its host (streaming requests at each
    level of concurrency): tok/s, requests/s, TTFT and inter-token latency, accept length.  With
    --baseline, the same target without speculation too (a transient unit in a GPU window; the
    service is always restarted and verified), and the speedup per level.  Kept as perf.json in
    the current release."""
    load = specbench.Load(concurrency=cli.positive_ints(concurrency, "--concurrency"),
                          requests=cli.whole(requests, "--requests", 1),
                          max_new_tokens=cli.whole(max_new_tokens, "--max-new-tokens", 1), prompts=prompts)
    load.prompt_list()  # a bad prompts file is said before any connection
    sample = traffic_flow.Traffic.parse(traffic, traffic_wait, fetch_sample)
    if sample and prompts:
        raise UsageError("--traffic measures on what the service serves: give it or --prompts, not both")
    play(lambda run: specbench.bench(run, service, load, baseline, sample), [], sel, task="spec-bench",
         services=[service] if service else None,
         refuse=(lambda hosts: specbench.refuse_router_baseline(hosts, service)) if baseline else None)


@fleet_task(*SELECT, "json", "break_lock", optional=("traffic",),
            service="The service to tune (default: the host's only one)",
            budget="The most restarts to spend per draft (the baseline at the start and at the end, and "
                   "candidates; default: tune.budget, else 40% of the grid's, at least 8); the service's own "
                   "restart at the end is not counted",
            at="The concurrency the objective reads (default: the gate's at_concurrency, else the lowest level)",
            mean_speedup="Judge by the mean speedup over the load's levels instead of tok/s at one level",
            itl_p99_ms="Leave out settings whose p99 inter-token latency is above this (milliseconds)",
            concurrency="Levels of concurrency, comma-separated (default: the gate's load, else 1,8,32)",
            requests="Requests per level of the full load (default: the gate's load, else 64)",
            max_new_tokens="Tokens per request (default: the gate's load, else 128)",
            prompts=PROMPTS_HELP, seed="Which prompts a load samples, and in which order (default 0)",
            force="With --apply: write the winner even when the tune's figures were noisy",
            apply="Write the winner into host_vars/HOST.yml (comments and order kept) and deploy it with "
                  "--bench, so the service's gate (or, without one, the tune's objective) holds it",
            **TRAFFIC_HELP)
def spec_tune(c, sel, service=None, budget=None, at=None, mean_speedup=False, itl_p99_ms=None,
              concurrency=None, requests=None, max_new_tokens=None, prompts=None, seed=None, force=False,
              apply=False, traffic=None, traffic_wait=None, fetch_sample=None):
    """Which speculative settings, and which draft, pay off?  Searches the service's `tune:` space
    (default: one for its algorithm), pruned with SGLang's rules, for each of `tune.drafts` (default:
    its own), in one GPU window: the baseline, then candidates as transient units, a short load along
    a climb (a reading far below its neighbours' measured again) and the full load to the finalists,
    then the baseline again (moved more than 3%: the figures are noisy, and --apply refuses them
    unless --force).  The service is always restarted on its own settings and verified (Ctrl-C too).
    Prints the winner as inventory lines, says when what runs now is already the best, when no
    settings serve faster than without speculation, or when the draft itself is the limit, and
    keeps every figure in the release (tune.json)."""
    ask = tuning.Ask.parse(budget=budget, at=at, mean=mean_speedup, max_itl_p99_ms=itl_p99_ms,
                           concurrency=concurrency, requests=requests, max_new_tokens=max_new_tokens,
                           prompts=prompts, seed=seed, force=force,
                           traffic=traffic_flow.Traffic.parse(traffic, traffic_wait, fetch_sample))
    reports = play(lambda run: tuning.tune(run, service, ask), [], sel, task="spec-tune",
                   services=[service] if service else None)
    if apply:
        deploy_with = lambda body: play(lambda run: rolling.deploy(run, body, drain=True),  # noqa: E731
                                        DEPLOY, sel, task="deploy")
        tuning_apply.apply(sel, reports, deploy_with, VOCABULARY, force=ask.force)


@fleet_task(*SELECT, out="Where to write the page (default: report.html)")
def report(c, sel, out="report.html"):
    """One self-contained HTML page (opens with no network): per host and service, the releases,
    tok/s against concurrency with and without speculation, accept length per release, the
    gates, and what verify checks."""
    outfile.check(out, "--out")
    hosts = select(sel)
    reports = play(pipeline.releases, [], sel, quiet=True, stream=sys.stderr, read_only=True)
    outfile.write(out, report_mod.page(hosts, reports).encode(), "--out")  # never through a planted link
    print(f"wrote {out}")


@fleet_task("inventory", out="The directory to write prometheus.yml, targets/, rules/ and grafana/ into (made if "
                             "missing; refused unless no one but you and root can change it)",
            scrape_interval="Prometheus's scrape and rule evaluation interval (default 15s)",
            alertmanager="Alertmanager(s) to send alerts to, HOST:PORT, comma-separated (default: none)")
def monitoring(c, sel, out, scrape_interval="15s", alertmanager=None):
    """Write a Prometheus configuration for the whole inventory into OUT: prometheus.yml, the scrape
    targets (targets/sglang.json, targets/sglang-router.json, targets/node.json: every SGLang service
    with its metrics on, every router, every host with `monitoring`) and the alerts
    (rules/specops.rules.yml: down, restarting, queue growing, CUDA graphs off, drift, unverified,
    speculative decoding no longer paying off, as each service's `watch:` says), and a Grafana
    dashboard of the fleet (grafana/specops.json, with grafana/provisioning.yml to load it).
    Connects to no host; check it with `promtool check config OUT/prometheus.yml`."""
    written, warnings = prometheus_mod.write(
        inventory_mod.load(cli.inventory_path(sel.inventory), VOCABULARY), out, scrape_interval,
        [a.strip() for a in (alertmanager or "").split(",") if a.strip()])
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    for path in written:
        print(f"wrote {path}")


@fleet_task(*SELECT, "json", "break_lock", service="Only this service (default: all on the host)",
            disable="Also disable the unit, so a reboot does not start it again (inv deploy enables it)")
def stop(c, sel, service=None, disable=False):
    """Stop SGLang and prove its GPU memory is free: leftovers of its runs are killed; anything
    else still holding GPU memory is named, and stop fails.  A worker behind a router is taken
    out of it first (and idle) and stays out until a deploy puts it back.  The unit stays
    enabled, so a reboot starts it again, unless --disable (a deploy enables and starts it)."""
    play(lambda run: pipeline.stop_task(run, [service] if service else None, disable), [], sel, task="stop",
         services=[service] if service else None)


@fleet_task("host", "inventory", "accept_new_host_key", "ask_become_pass", "break_lock", "json",
            service="Only stop this service (default: all on the host)",
            become="Run the job as root (on a become host it runs as the login user otherwise)")
def gpu_window(c, sel, service=None, become=False):
    """Stop SGLang, prove the GPUs free, run the job after `--` on the host, then always restart
    and verify.  Exits with the job's status.  Example: inv gpu-window --host ct129 -- python x.py
    (several words after -- stay those words; one quoted argument is run as a shell command line)."""
    job = cli.job_after_dashes(again.command("gpu-window", "--", "python", "job.py", host=sel.host or "HOST"))
    # A service across nodes opens its window on every node (the job runs on each).
    reports = play(lambda run: pipeline.gpu_window(run, job, [service] if service else None, become), [], sel,
                   task="gpu-window", services=[service] if service else None, exit_on_failure=False)
    statuses = [r.result if r.result is not None else r.extra.get("job_status", 1) for r in reports]
    # The job's status (the first non-zero); a window whose service did not come back healthy never succeeds.
    worst = next((s for s in statuses if s), 0)
    raise Exit(code=worst or (1 if any(r.error for r in reports) else 0))


@fleet_task(*SELECT, "json")
def verify(c, sel):
    """Check each service: ready, serving its model, running the intended spec args, generating."""
    play(lambda run: (textfile.after(run), verify_mod.verify(run, last=True)), DEPLOY, sel, task="verify",
         read_only=True)


@fleet_task(*SELECT, "json", strict="Exit 1 when anything needs doing: drift, stale code, a crash, a spec "
                                     "mismatch, a router not serving, a draft that no longer pays")
def status(c, sel, strict=False):
    """Per service: state, uptime, drift from the inventory, stale code, effective spec args, what
    the unit runs (stack, SGLang version, release) and, from its /metrics, production against what
    its release measured; GPU memory, and memory held by processes of no running service."""
    sel.check = True

    def show(reports):
        results = {r.name: r.result for r in reports if r.result}
        if results:
            print(Redactor(select(sel))(status_mod.table(results)))
    reports = play(status_mod.collect, DEPLOY, sel, run_checks=False, quiet=True, stream=sys.stderr,
                   exit_on_failure=False, show=show)
    results = {r.name: r.result for r in reports if r.result}
    if any(r.error for r in reports) or (strict and status_mod.needs_doing(results)):
        raise Exit(code=1)


@fleet_task(*SELECT)
def facts(c, sel):
    """Print the facts one probe gathers from each host, as JSON."""
    reports = play(facts_mod.facts_probe, [], sel, quiet=True, stream=sys.stderr, exit_on_failure=False,
                   read_only=True)
    cli.print_json({r.name: r.result for r in reports if r.result is not None})
    if any(r.error for r in reports):
        raise Exit(code=1)


ns = Collection(deploy, bootstrap, rollback, releases, patch, stop, gpu_window, spec_bench, spec_tune, report, verify,
                status, facts, monitoring)
ns.add_collection(sandbox_tasks)
