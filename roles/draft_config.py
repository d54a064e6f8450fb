"""The draft model's config.json: keys set as JSON, then linted against the target: SGLang reads
the EAGLE-3 layer ids only from the nested eagle_config, captures id + 1 (so -1 is the embedding
output, which upstream model files cannot capture), and never captures ids past the last layer."""
from specops.inventory import schema
from specops.ops import handlers
from specops import protocol
from specops.errors import UsageError
from specops.ops import Change, JsonKeys, Op, PlanError, dotted_get
from specops.services.sglang import draft_config_path
from specops.services import of_kind

from specops.sglang.patches import provides_embedding_capture

NAME = "draft_config"
VARS = schema.PATCH_VARS  # the host vars it reads
AFTER = ("models", "model_patches")  # the roles it runs after, when they run
LAYER_IDS = "eagle_aux_hidden_state_layer_ids"
NESTED = f"eagle_config.{LAYER_IDS}"


class LayerIdLint(Op):
    """EAGLE-3 hidden-state layer ids, as the target will read them (nested key only)."""

    def __init__(self, svc, edit: JsonKeys | None, embedding_capture: bool):
        self.svc, self.edit, self.embedding_capture = svc, edit, embedding_capture
        self.services = (svc["name"],)
        self.draft = draft_config_path(svc)
        self.target = f"{svc['model_path'].rstrip('/')}/config.json"

    def wants(self):
        return protocol.Probe(files=[self.draft, self.target], content={self.draft: "always", self.target: "always"})

    def plan(self, facts, ctx):
        label = f"layer ids of {self.draft}"
        doc = JsonKeys(self.draft, {}).current(facts) if facts.file(self.draft)["exists"] else None
        if doc is None:
            return self._change(label, "ok")
        ids = dotted_get(doc, NESTED)
        if ids is None:
            if LAYER_IDS in doc:
                return Change(self.role, label, "ok", (self.svc["name"],), warning=f"only a top-level {LAYER_IDS} "
                              f"{doc[LAYER_IDS]}; SGLang reads {NESTED} and will ignore it")
            return self._change(label, "ok")
        check_layer_ids(ids, self.embedding_capture, self._target_layers(facts), self.svc["name"])
        return self._change(label, "ok")

    def _target_layers(self, facts):
        if not facts.file(self.target)["exists"]:
            return None
        return JsonKeys(self.target, {}).current(facts).get("num_hidden_layers")


def check_layer_ids(ids, embedding_capture, num_layers, service, error=PlanError):
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise error(f"{service}: {NESTED} must be a list of integers, not {ids!r}")
    if -1 in ids and not embedding_capture:
        raise error(f"{service}: {NESTED} has -1 (the embedding output), which upstream model "
                        f"files cannot capture; deploy a patch that declares embedding capture")
    bad = [i for i in ids if i < -1 or (num_layers is not None and i >= num_layers - 1)]
    if bad:
        limit = f"-1..{num_layers - 2}" if num_layers is not None else ">= -1"
        raise error(f"{service}: {NESTED} ids {bad} are never captured: the target has "
                        f"{num_layers} layers, so ids must be in {limit}")


def ops(host):
    out = []
    for svc in of_kind(host, "sglang"):
        keys = svc.get("draft_config") or {}
        if keys and not (svc.get("speculative") or {}).get("draft_model_path"):
            raise UsageError(f"{host.name}: service {svc['name']!r}: draft_config needs "
                             f"speculative.draft_model_path")
        if not (svc.get("speculative") or {}).get("draft_model_path"):
            continue
        capture = provides_embedding_capture(host, svc)
        if NESTED in keys:
            check_layer_ids(keys[NESTED], capture, None, svc["name"], UsageError)  # before connecting
        edit = JsonKeys(draft_config_path(svc), keys, notify=[handlers.restart(svc["name"])]) if keys else None
        out += ([edit] if edit else []) + [LayerIdLint(svc, edit, capture)]
    return out
