"""The draft model's config.json: keys set as JSON, then its EAGLE-3 layer ids linted against the
target (specops/sglang/drafts.py says what SGLang captures)."""
from specops.inventory import schema
from specops.ops import handlers
from specops import protocol
from specops.errors import UsageError
from specops.ops import Change, JsonKeys, Op, dotted_get
from specops.kinds.sglang import draft_config_path
from specops.kinds import of_kind

from specops.sglang.drafts import LAYER_IDS, NESTED, check_layer_ids, target_layers
from specops.sglang.patches import provides_embedding_capture

NAME = "draft_config"
VARS = schema.PATCH_VARS  # the host vars it reads
AFTER = ("models", "model_patches")  # the roles it runs after, when they run


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
        # ids draft_config writes are the inventory's; others are the draft's own
        own = self.edit is None or not any(NESTED == k or NESTED.startswith(k + ".") for k in self.edit.keys)
        check_layer_ids(ids, self.embedding_capture, target_layers(self.svc, facts), self.svc["name"],
                        draft=self.svc["speculative"]["draft_model_path"] if own else None)
        return self._change(label, "ok")


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
