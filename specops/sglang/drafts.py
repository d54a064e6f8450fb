"""The checks a draft checkpoint must pass before a server is started on it, made the same way for
the service's own draft (roles/models.py, roles/draft_config.py at deploy) and for each draft
spec-tune is asked to compare (`tune: {drafts: [...]}`): its weights are there (a config.json),
and its EAGLE-3 hidden-state layer ids are ones the target captures.  SGLang reads the ids only
from the nested eagle_config, captures id + 1 (so -1 is the embedding output, which upstream
model files cannot capture: a patch must declare it), and never captures ids past the last layer."""
from __future__ import annotations

from .. import protocol
from ..errors import SpecopsError
from ..ops import JsonKeys, dotted_get
from ..ops.base import PlanError

LAYER_IDS = "eagle_aux_hidden_state_layer_ids"
NESTED = f"eagle_config.{LAYER_IDS}"


def config_of(path: str) -> str:
    return f"{path.rstrip('/')}/config.json"


def check_layer_ids(ids, embedding_capture, num_layers, service, error=PlanError, draft=None):
    """`draft`: the draft's directory when the ids are those of its own config.json (not ones
    draft_config writes there): ids past the target's last layer then say the draft was trained
    on another target, and it is named with the file that says so."""
    where = f"{service}: draft {draft}" if draft else service
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise error(f"{where}: {NESTED} must be a list of integers, not {ids!r}")
    if -1 in ids and not embedding_capture:
        raise error(f"{where}: {NESTED} has -1 (the embedding output), which upstream model "
                    f"files cannot capture; deploy a patch that declares embedding capture")
    bad = [i for i in ids if i < -1 or (num_layers is not None and i >= num_layers - 1)]
    if bad:
        limit = f"-1..{num_layers - 2}" if num_layers is not None else ">= -1"
        never = (f"{NESTED} ids {bad} are never captured: the target has {num_layers} layers, "
                 f"so ids must be in {limit}")
        if draft and num_layers is not None and max(bad) >= num_layers - 1:
            raise error(f"{service}: the draft {draft} (its config.json: {config_of(draft)}) was made "
                        f"for another target: {never}; use a draft made for this target")
        raise error(f"{where}: {never}")


def target_layers(svc: dict, facts) -> int | None:
    target = config_of(svc["model_path"])
    if not facts.file(target)["exists"]:
        return None
    return JsonKeys(target, {}).current(facts).get("num_hidden_layers")


def wants(svc: dict, drafts: list[str]) -> protocol.Probe:
    files = [config_of(svc["model_path"])] + [config_of(d) for d in drafts]
    return protocol.Probe(files=files, content={f: "always" for f in files})


def check(svc: dict, draft: str, facts, embedding_capture: bool) -> None:
    """A draft to compare, as deploy checks the service's own: SpecopsError says what is wrong."""
    where = f"{svc['name']}: draft {draft}"
    fact = facts.file(config_of(draft))
    if not fact["exists"] or fact.get("type") == "dir":
        raise SpecopsError(f"{where} has no config.json on the host: copy the draft's weights there first")
    if fact.get("unsafe") or fact.get("unsafe_write"):
        # a server started on it runs what that user puts there (its config.json, remote code, weights)
        raise SpecopsError(f"{where}: another user can change it ({fact.get('unsafe') or fact['unsafe_write']}); "
                           f"serve drafts only from directories root alone can write")
    try:
        ids = dotted_get(JsonKeys(config_of(draft), {}).current(facts), NESTED)
        if ids is not None:
            check_layer_ids(ids, embedding_capture, target_layers(svc, facts), svc["name"], draft=draft)
    except PlanError as e:
        raise SpecopsError(str(e)) from None
