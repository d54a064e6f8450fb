"""ServerArgs for the sandbox SGLang: the real flag names and the real resolution rules.

Interface as in SGLang 0.5.23: ``prepare_server_args(argv)`` builds an
unresolved record, ``record.resolve_once()`` applies the rules (logging
SGLang's own warnings), ``record.resolved_dict()`` returns every field.
"""
import argparse
import json
import logging
import os

logger = logging.getLogger(__name__)

ALGORITHMS = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH"]
PAGE_TREE_SPEC_BACKENDS = ("flashinfer", "fa3", "triton")

# (flag, field, type, default)
FLAGS = [
    ("--model-path", "model_path", str, None),
    ("--tokenizer-path", "tokenizer_path", str, None),
    ("--served-model-name", "served_model_name", str, None),
    ("--host", "host", str, "127.0.0.1"),
    ("--port", "port", int, 30000),
    ("--tp-size", "tp_size", int, 1),
    ("--dp-size", "dp_size", int, 1),
    ("--nnodes", "nnodes", int, 1),
    ("--node-rank", "node_rank", int, 0),
    ("--dist-init-addr", "dist_init_addr", str, None),
    ("--mem-fraction-static", "mem_fraction_static", float, None),
    ("--attention-backend", "attention_backend", str, None),
    ("--page-size", "page_size", int, 1),
    ("--max-running-requests", "max_running_requests", int, None),
    ("--device", "device", str, "cuda"),
    ("--api-key", "api_key", str, None),
    ("--admin-api-key", "admin_api_key", str, None),
    ("--trust-remote-code", "trust_remote_code", bool, False),
    ("--log-level", "log_level", str, "info"),
    ("--stream-interval", "stream_interval", int, 1),
    ("--enable-metrics", "enable_metrics", bool, False),
    ("--decode-log-interval", "decode_log_interval", int, 40),
    # no_cli in 0.5.23 (arg_groups/fields/exec_.py): only the deprecated spelling below sets it
    ("--disable-cuda-graph", "disable_cuda_graph", "deprecated", False),
    ("--speculative-algorithm", "speculative_algorithm", str, None),
    ("--speculative-draft-model-path", "speculative_draft_model_path", str, None),
    ("--speculative-draft-model-revision", "speculative_draft_model_revision", str, None),
    ("--speculative-num-steps", "speculative_num_steps", int, None),
    ("--speculative-eagle-topk", "speculative_eagle_topk", int, None),
    ("--speculative-num-draft-tokens", "speculative_num_draft_tokens", int, None),
    ("--speculative-ngram-max-bfs-breadth", "speculative_ngram_max_bfs_breadth", int, 10),
    ("--speculative-dflash-block-size", "speculative_dflash_block_size", int, None),
]
ALIASES = {"--tp-size": ["--tensor-parallel-size"], "--dp-size": ["--data-parallel-size"],
           "--speculative-draft-model-path": ["--speculative-draft-model"]}


class ServerArgs:
    def __init__(self, **values):
        self.__dict__.update(values)
        self._resolved = False

    def _arch(self):
        try:
            with open(os.path.join(self.model_path, "config.json")) as f:
                return (json.load(f).get("architectures") or [""])[0]
        except (OSError, ValueError):
            return ""

    def resolve_once(self):
        if self._resolved:
            return
        if self.served_model_name is None:
            self.served_model_name = self.model_path
        if self.tokenizer_path is None:
            self.tokenizer_path = self.model_path
        if self.attention_backend is None:
            self.attention_backend = "torch_native" if self.device == "cpu" else "flashinfer"
        if self.speculative_algorithm is not None:
            self._handle_speculative_decoding()
        self._resolved = True

    def _handle_speculative_decoding(self):
        if self.speculative_draft_model_path is not None and self.speculative_draft_model_revision is None:
            self.speculative_draft_model_revision = "main"
        algo = self.speculative_algorithm.upper()
        if algo not in ALGORITHMS:
            raise ValueError("Unknown speculative algorithm: %s" % self.speculative_algorithm)
        if algo == "NEXTN":
            algo = "EAGLE"
        self.speculative_algorithm = algo
        if algo in ("EAGLE", "EAGLE3", "STANDALONE"):
            self._handle_eagle_family()
        elif algo == "NGRAM":
            self._handle_ngram()
        elif algo == "DFLASH":
            self._handle_dflash()

    def _max_running_48(self):
        if self.max_running_requests is None:
            self.max_running_requests = 48
            logger.warning(
                "Max running requests is reset to 48 for speculative decoding. You can override "
                "this by explicitly setting --max-running-requests.")

    def _handle_eagle_family(self):
        self._max_running_48()
        if self.speculative_num_steps is None:
            assert self.speculative_eagle_topk is None and self.speculative_num_draft_tokens is None
            arch = self._arch()
            if self.speculative_algorithm == "STANDALONE":
                auto = (3, 1, 4)
            elif arch in ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"):
                auto = (5, 4, 8)
            else:
                auto = (3, 1, 4)
            (self.speculative_num_steps, self.speculative_eagle_topk,
             self.speculative_num_draft_tokens) = auto
        if (self.speculative_eagle_topk == 1
                and self.speculative_num_draft_tokens != self.speculative_num_steps + 1):
            logger.warning("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
                           "when speculative_eagle_topk == 1")
            self.speculative_num_draft_tokens = self.speculative_num_steps + 1
        if (self.speculative_eagle_topk > 1 and self.page_size > 1
                and self.attention_backend not in PAGE_TREE_SPEC_BACKENDS):
            raise ValueError(
                "speculative_eagle_topk > 1 with page_size > 1 is only supported on %s; got "
                "attention_backend=%r. Use page_size == 1 or one of those backends."
                % (PAGE_TREE_SPEC_BACKENDS, self.attention_backend))

    def _handle_ngram(self):
        self._max_running_48()
        self.speculative_eagle_topk = self.speculative_ngram_max_bfs_breadth
        if self.speculative_num_draft_tokens is None:
            self.speculative_num_draft_tokens = 12
            logger.warning(
                "speculative_num_draft_tokens is set to 12 by default for ngram speculative "
                "decoding. You can override this by explicitly setting --speculative-num-draft-tokens.")
        if self.speculative_num_steps is None:
            self.speculative_num_steps = self.speculative_num_draft_tokens // self.speculative_eagle_topk

    def _handle_dflash(self):
        if self.speculative_draft_model_path is None:
            raise ValueError("DFLASH speculative decoding requires setting --speculative-draft-model-path.")
        if self.speculative_num_steps is not None and self.speculative_num_steps != 1:
            logger.warning("DFLASH only supports speculative_num_steps == 1; overriding "
                           "speculative_num_steps=%s to 1.", self.speculative_num_steps)
        self.speculative_num_steps = 1
        if self.speculative_eagle_topk is not None and self.speculative_eagle_topk != 1:
            logger.warning("DFLASH only supports speculative_eagle_topk == 1; overriding "
                           "speculative_eagle_topk=%s to 1.", self.speculative_eagle_topk)
        self.speculative_eagle_topk = 1
        block = self.speculative_dflash_block_size
        if block is not None:
            if block <= 0:
                raise ValueError("DFLASH requires --speculative-dflash-block-size to be positive, "
                                 "got %s." % block)
            if self.speculative_num_draft_tokens is not None and self.speculative_num_draft_tokens != block:
                raise ValueError(
                    "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set "
                    "but they differ. For DFLASH they must match. speculative_num_draft_tokens=%s, "
                    "speculative_dflash_block_size=%s." % (self.speculative_num_draft_tokens, block))
            self.speculative_num_draft_tokens = block
        if self.speculative_num_draft_tokens is None:
            self.speculative_num_draft_tokens = 16
            logger.warning("speculative_num_draft_tokens is not set; defaulting to %d for DFLASH.", 16)
        self._max_running_48()

    def resolved_dict(self):
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


class DeprecatedStoreTrueAction(argparse.Action):
    """SGLang's (srt/arg_groups/argparse_actions.py): stores True and warns."""

    def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True, default=False, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        logger.warning(f"\033[1;33m'{option_string}' is deprecated and will be removed in a future "
                       f"release.{replacement}\033[0m")
        setattr(namespace, self.dest, True)


DEPRECATED = {"--disable-cuda-graph": "--cuda-graph-backend-{decode,prefill}=disabled"}


def make_parser():
    parser = argparse.ArgumentParser(prog="sglang serve")
    for flag, field, typ, default in FLAGS:
        names = [flag] + ALIASES.get(flag, [])
        if typ == "deprecated":
            parser.add_argument(*names, dest=field, action=DeprecatedStoreTrueAction, new_flag=DEPRECATED[flag],
                                default=default)
        elif typ is bool:
            parser.add_argument(*names, dest=field, action="store_true", default=default)
        else:
            parser.add_argument(*names, dest=field, type=typ, default=default)
    return parser


def prepare_server_args(argv):
    ns = make_parser().parse_args(argv)
    if ns.model_path is None:
        make_parser().error("the following arguments are required: --model-path")
    return ServerArgs(**vars(ns))
