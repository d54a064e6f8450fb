"""The static rules against the real SGLang 0.5.23 resolver, over a grid of flag combinations.

SGLang "adjusts" a combination when a value the user set comes back different; it
"rejects" one when resolution raises.  specops must refuse exactly those, accept the rest,
and for accepted ones predict the same effective values.  DFLASH is not in the grid: the
real resolver refuses it on CPU, so the static rules alone cover it.
"""
import itertools
import json

import pytest

from sandbox import real_sglang
from specops.sglang.rules import resolve

pytestmark = pytest.mark.slow

ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
FIELDS = {"num_steps": "speculative_num_steps", "eagle_topk": "speculative_eagle_topk",
          "num_draft_tokens": "speculative_num_draft_tokens"}


def model_dirs(tmp_path):
    base = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000,
            "max_position_embeddings": 512}
    dirs = {}
    for arch, name in {**ARCHS, "LlamaForCausalLMEagle3": "draft"}.items():
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({**base, "architectures": [arch]}))
        dirs[arch] = str(d)
    return dirs


def grid():
    for algo, steps, topk, draft, arch in itertools.product(
            ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"], [None, 1, 3], [None, 1, 4],
            [None, 2, 4, 16], ARCHS):
        asked = {k: v for k, v in zip(FIELDS, (steps, topk, draft)) if v is not None}
        yield algo, asked, arch


def test_static_rules_match_real_sglang(tmp_path):
    dirs = model_dirs(tmp_path)
    cases, argvs = [], []
    for algo, asked, arch in grid():
        spec = {"algorithm": algo, **asked}
        argv = ["--model-path", dirs[arch], "--device", "cpu", "--speculative-algorithm", algo]
        if algo != "NGRAM":
            spec["draft_model_path"] = dirs["LlamaForCausalLMEagle3"]
            argv += ["--speculative-draft-model-path", spec["draft_model_path"]]
        for key, value in asked.items():
            argv += ["--speculative-" + key.replace("_", "-"), str(value)]
        cases.append((spec, asked, arch))
        argvs.append(argv)
    assert len(cases) >= 300

    real = real_sglang.resolve(argvs)
    outcomes, mismatches = {"accept": 0, "adjust": 0, "reject": 0}, []
    for (spec, asked, arch), r in zip(cases, real):
        if not r["ok"]:
            truth = "reject"
        elif any(r["values"][FIELDS[k]] != v for k, v in asked.items()):
            truth = "adjust"
        else:
            truth = "accept"
        outcomes[truth] += 1
        ours = resolve(spec, arch=arch)
        predicted = "reject" if ours.errors else "adjust" if ours.adjustments else "accept"
        if predicted != truth:
            mismatches.append(f"{spec} on {arch}: SGLang {truth} ({r.get('error') or r['values']}), "
                              f"specops {predicted}")
        elif truth == "accept":
            for field in ("speculative_algorithm", *FIELDS.values(), "max_running_requests"):
                if ours.effective.get(field) != r["values"][field]:
                    mismatches.append(f"{spec} on {arch}: {field} SGLang {r['values'][field]}, "
                                      f"specops {ours.effective.get(field)}")
    assert not mismatches, f"{len(mismatches)} mismatches:\n" + "\n".join(mismatches[:30])
    # The oracle must really discriminate, or agreement would prove nothing.
    assert outcomes["accept"] >= 100 and outcomes["adjust"] >= 20 and outcomes["reject"] >= 50, outcomes


def test_seed_case_real_sglang(tmp_path):
    dirs = model_dirs(tmp_path)
    (r,) = real_sglang.resolve([["--model-path", dirs["LlamaForCausalLM"], "--device", "cpu",
                                 "--speculative-algorithm", "EAGLE3",
                                 "--speculative-draft-model-path", dirs["LlamaForCausalLMEagle3"],
                                 "--speculative-num-steps", "1", "--speculative-eagle-topk", "1",
                                 "--speculative-num-draft-tokens", "16"]])
    assert r["ok"] and r["values"]["speculative_num_draft_tokens"] == 2
