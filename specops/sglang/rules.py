"""SGLang's speculative-decoding flag rules (0.5.x), applied at plan time.

`resolve()` predicts what SGLang will run with for the values a service asks
for.  Two kinds of finding:
  - an *error*: SGLang refuses to start (ValueError, AssertionError, TypeError);
  - an *adjustment*: SGLang silently runs with another value than the one asked
    for (it logs a warning at most).  The seed's bug is one: steps 1, topk 1,
    draft tokens 16 runs with 2 draft tokens.
Values the service leaves unset and SGLang fills in are neither.
Findings speak in the inventory's keys (`speculative:`), and an adjustment comes with the
settings that would run as asked (`fixes`).

The installed SGLang's own resolver is the authority on a host (the preflight);
this table is checked against the real 0.5.23 resolver by a differential test.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import field as fields_default  # Finding has a `field` of its own
from typing import Any

from ..errors import UsageError
from .spec import SPEC_FLAGS, intended

SOURCE = "sglang/srt/arg_groups/speculative_hook.py"
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
PAGE_TREE_SPEC_BACKENDS = ("flashinfer", "fa3", "triton")
TOPK1_ONLY_BACKENDS = ("trtllm_mha",)
NGRAM_MAX_BFS_BREADTH_DEFAULT = 10
NGRAM_DRAFT_TOKENS_DEFAULT = 12
DFLASH_DRAFT_TOKENS_DEFAULT = 16
MAX_RUNNING_REQUESTS_SPEC = 48
KEY_OF = {field: key for key, _, field in SPEC_FLAGS}  # SGLang's field → the `speculative:` key

# (steps, topk, draft tokens) SGLang picks when steps is unset: by algorithm, then target architecture.
AUTO_PARAMS_BY_ALGORITHM = {"STANDALONE": (3, 1, 4)}
AUTO_PARAMS_BY_ARCH = {"LlamaForCausalLM": (5, 4, 8), "Grok1ForCausalLM": (5, 4, 8),
                       "Grok1VForCausalLM": (5, 4, 8)}
AUTO_PARAMS_DEFAULT = (3, 1, 4)

# SGLang's rules (SOURCE), said in the inventory's `speculative:` keys
RULES = {
    "auto-params": "if num_steps is unset, eagle_topk and num_draft_tokens must be unset too "
                   "(AssertionError); SGLang then picks all three from the target architecture",
    "topk-needed": "num_steps needs eagle_topk too: without it SGLang compares eagle_topk > 1 and "
                   "fails with a TypeError",
    "topk1-draft": "with eagle_topk 1, SGLang runs num_steps + 1 draft tokens",
    "page-tree": "eagle_topk > 1 with page_size > 1 is only supported on attention backends "
                 "flashinfer, fa3, triton",
    "topk1-backend": "the trtllm_mha attention backend only supports eagle_topk 1 (ValueError)",
    "ngram-topk": "NGRAM overwrites eagle_topk with ngram_max_bfs_breadth "
                  f"(default {NGRAM_MAX_BFS_BREADTH_DEFAULT})",
    "dflash-steps": "DFLASH only supports num_steps 1; SGLang overrides it to 1",
    "dflash-topk": "DFLASH only supports eagle_topk 1; SGLang overrides it to 1",
    "dflash-draft": "DFLASH speculative decoding requires draft_model_path",
    "dflash-block": "DFLASH needs dflash_block_size equal to num_draft_tokens when both are set",
    "positive": "num_steps, eagle_topk and num_draft_tokens must be positive integers",
}


@dataclass
class Finding:
    rule: str
    field: str | None = None
    asked: Any = None
    effective: Any = None
    error: bool = False
    fixes: list[str] = fields_default(default_factory=list)  # what to write instead, to run as asked

    def message(self) -> str:
        head = f"SGLang rule [{self.rule}]: {RULES[self.rule]}"
        if self.error:
            return f"{head}; SGLang would refuse to start"
        return (f"you asked for {KEY_OF.get(self.field, self.field)}: {self.asked}, SGLang would run "
                f"with {self.effective} ({head})")


@dataclass
class Resolution:
    effective: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.error]

    @property
    def adjustments(self) -> list[Finding]:
        return [f for f in self.findings if not f.error]


def tree_nodes(steps: int, topk: int) -> int:
    """The candidate nodes an EAGLE tree draws its num_draft_tokens - 1 from.  SGLang's tree
    (srt/speculative/eagle_utils.py organize_draft_results) picks them with torch.topk over the
    draft's scores: topk from the root and topk * topk at each further step.  Asking for more
    fails at the first verify, not at start."""
    return topk + (steps - 1) * topk ** 2


def _auto(algorithm: str, arch: str | None) -> tuple | None:
    if algorithm in AUTO_PARAMS_BY_ALGORITHM:
        return AUTO_PARAMS_BY_ALGORITHM[algorithm]
    if arch is None:
        return None  # chosen on the host, from the target's config.json
    return AUTO_PARAMS_BY_ARCH.get(arch, AUTO_PARAMS_DEFAULT)


def resolve(spec: dict, *, arch: str | None = None, page_size: int | None = None,
            attention_backend: str | None = None, max_running_requests: int | None = None) -> Resolution:
    """Predict SGLang's resolved speculative values for a service's `speculative` mapping."""
    algo = spec["algorithm"].upper()
    algo = "EAGLE" if algo == "NEXTN" else algo
    steps, topk, draft = spec.get("num_steps"), spec.get("eagle_topk"), spec.get("num_draft_tokens")
    eff: dict[str, Any] = {"speculative_algorithm": algo}
    if spec.get("draft_model_path") is not None:
        eff["speculative_draft_model_path"] = spec["draft_model_path"]
    res = Resolution(eff)
    err = lambda rule, **kw: res.findings.append(Finding(rule, error=True, **kw))  # noqa: E731

    for key, value in (("num_steps", steps), ("eagle_topk", topk), ("num_draft_tokens", draft)):
        if value is not None and value < 1:
            err("positive", field=f"speculative_{key}", asked=value)
    if res.errors:
        return res
    if max_running_requests is None:
        eff["max_running_requests"] = MAX_RUNNING_REQUESTS_SPEC

    if algo in EAGLE_FAMILY:
        if steps is None:
            if topk is not None or draft is not None:
                err("auto-params")
                return res
            auto = _auto(algo, arch)
            if auto is None:
                return res
            steps, topk, draft = auto
        elif topk is None:
            err("topk-needed")
            return res
        if topk > 1 and attention_backend in TOPK1_ONLY_BACKENDS:
            err("topk1-backend")
            return res
        if topk == 1 and draft != steps + 1:
            if draft is not None:
                res.findings.append(Finding("topk1-draft", "speculative_num_draft_tokens", draft, steps + 1,
                                            fixes=_chain_fixes(spec, steps, draft, page_size, attention_backend)))
            draft = steps + 1
        if topk > 1 and (page_size or 1) > 1 and attention_backend not in PAGE_TREE_SPEC_BACKENDS:
            err("page-tree")
    elif algo == "NGRAM":
        breadth = spec.get("ngram_max_bfs_breadth", NGRAM_MAX_BFS_BREADTH_DEFAULT)
        if topk is not None and topk != breadth:
            res.findings.append(Finding("ngram-topk", "speculative_eagle_topk", topk, breadth,
                                        fixes=["leave out eagle_topk", f"set ngram_max_bfs_breadth: {topk}"]))
        topk = breadth
        if draft is None:
            draft = NGRAM_DRAFT_TOKENS_DEFAULT
        if steps is None:
            steps = draft // topk
    elif algo == "DFLASH":
        if spec.get("draft_model_path") is None:
            err("dflash-draft")
        if steps is not None and steps != 1:
            res.findings.append(Finding("dflash-steps", "speculative_num_steps", steps, 1,
                                        fixes=["set num_steps: 1", "leave it out"]))
        if topk is not None and topk != 1:
            res.findings.append(Finding("dflash-topk", "speculative_eagle_topk", topk, 1,
                                        fixes=["set eagle_topk: 1", "leave it out"]))
        steps = topk = 1
        block = spec.get("dflash_block_size")
        if block is not None:
            if draft is not None and draft != block:
                err("dflash-block")
            draft = block
        if draft is None:
            draft = DFLASH_DRAFT_TOKENS_DEFAULT
    eff.update(speculative_num_steps=steps, speculative_eagle_topk=topk,
               speculative_num_draft_tokens=draft)
    return res


def _chain_fixes(spec: dict, steps: int, draft: int, page_size, attention_backend) -> list[str]:
    """With eagle_topk 1 the draft is a chain of num_steps + 1 tokens: what runs `draft` tokens
    as asked is that chain's length, a longer chain, or a tree wide enough to fill them."""
    fixes = [f"set num_draft_tokens: {steps + 1}"]
    if draft < 2:  # one draft token verifies nothing drafted: no chain or tree runs it
        return fixes
    fixes.append(f"set num_steps: {draft - 1} for a chain of {draft}")
    topk = next(k for k in range(2, draft + 1) if tree_nodes(steps, k) >= draft - 1)  # k >= draft - 1 fills it
    tree = resolve({**spec, "num_steps": steps, "eagle_topk": topk, "num_draft_tokens": draft},
                   page_size=page_size, attention_backend=attention_backend)
    if not tree.findings:  # a tree this page size and backend can run
        fixes.append(f"set eagle_topk: {topk} for a tree of {draft}")
    return fixes


def check_service(svc: dict, where: str) -> Resolution | None:
    """Plan-time check of a service's spec flags; raises UsageError naming SGLang's rule."""
    spec = svc.get("speculative")
    if not spec:
        return None
    res = resolve(spec, page_size=svc.get("page_size"), attention_backend=svc.get("attention_backend"),
                  max_running_requests=svc.get("max_running_requests"))
    if res.errors:
        raise UsageError(f"{where}: {res.errors[0].message()}")
    if res.adjustments and not svc.get("allow_sglang_adjustments"):
        first = res.adjustments[0]
        todo = "; or ".join(first.fixes + [f"set allow_sglang_adjustments: true to run with {first.effective} anyway"])
        raise UsageError(f"{where}: {first.message()}. {todo[0].upper()}{todo[1:]}")
    return res


def expectations(svc: dict, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(intended, accepted): the values the service asks for, and the SGLang adjustments it
    opted into with allow_sglang_adjustments (field → the value SGLang will really use).
    Refuses, before any connection, what SGLang would reject or silently change."""
    res = check_service(svc, where)
    accepted = {f.field: f.effective for f in res.adjustments} if res else {}
    return intended(svc), accepted
