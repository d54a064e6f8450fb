"""Ask the installed SGLang what it would run with: run by the service venv's interpreter.

stdin: a JSON list of argv lists (the arguments after `-m sglang.launch_server`).
stdout: one JSON result per argv: {"ok": true, "values": {...}} or {"ok": false, "error": "..."}.
An error is one line; for arguments argparse refuses, its own `error: ...` line, which names the flag.
Uses SGLang's own interface: prepare_server_args(argv), then resolve_once() where it exists
(0.5.23 and later; older versions resolve while building the record), then resolved_dict()
or, before it existed, the record's attributes.  Works unchanged on the sandbox simulator.
"""
import contextlib
import io
import json
import logging
import sys

FIELDS = ("speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
          "speculative_eagle_topk", "speculative_num_draft_tokens", "max_running_requests",
          "tp_size", "port", "host", "model_path", "served_model_name", "nnodes", "node_rank",
          "dist_init_addr", "enable_metrics")


def resolve(argv):
    from sglang.srt.server_args import prepare_server_args
    warnings, said = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(warnings)
    logging.getLogger().addHandler(handler)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(said):
            args = prepare_server_args(argv)
            if hasattr(args, "resolve_once"):
                args.resolve_once()
        values = args.resolved_dict() if hasattr(args, "resolved_dict") else vars(args)
        return {"ok": True, "values": {k: values.get(k) for k in FIELDS},
                "warnings": warnings.getvalue().strip().splitlines()[-5:]}
    except BaseException as e:  # argparse exits; SGLang asserts; all are refusals
        return {"ok": False, "error": refusal(e, said.getvalue())[:400]}
    finally:
        logging.getLogger().removeHandler(handler)


def refusal(e, stderr):
    """Why the arguments were refused, in one line.  argparse prints its reason to stderr
    ("usage: ...", then "sglang serve: error: unrecognized arguments: --x") and exits."""
    if isinstance(e, SystemExit):
        lines = [l.strip() for l in stderr.splitlines() if "error: " in l]
        if lines:
            return "argparse " + lines[-1][lines[-1].index("error: "):]
        text = e.code if isinstance(e.code, str) else "argument parsing failed (exit %s)" % e.code
    else:
        text = str(e)
    return "%s: %s" % (type(e).__name__, " ".join(text.split()))


def main():
    print(json.dumps([resolve(argv) for argv in json.load(sys.stdin)]))


if __name__ == "__main__":
    main()
