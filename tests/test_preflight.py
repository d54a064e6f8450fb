"""The host preflight (agent/converge/checks.py running sglang/resolver.py): a flag the installed
SGLang refuses is named in argparse's own words, on one line.  The sandbox simulator's ServerArgs
stands for SGLang's (argparse, as prepare_server_args builds it)."""
import sys
from pathlib import Path

import pytest

from specops import protocol
from specops.agent.converge import checks
from specops.agent.host import ActionError
from specops.sglang import resolver

SIM = Path(__file__).resolve().parent.parent / "sandbox" / "sglang_sim"
SCRIPT = f"import sys; sys.path.insert(0, {str(SIM)!r})\n" + Path(resolver.__file__).read_text()


@pytest.mark.parametrize("extra,said", [
    (["--enable-torch-compil"], "argparse error: unrecognized arguments: --enable-torch-compil"),
    (["--tp-size", "x"], "argparse error: argument --tp-size/--tensor-parallel-size: invalid int value: 'x'"),
])
def test_the_preflight_names_the_flag_argparse_refuses(extra, said):
    a = protocol.Preflight(python=sys.executable, script=SCRIPT, argv=["--model-path", "/m"] + extra,
                           expect={}, service="sglang")
    with pytest.raises(ActionError) as e:
        checks.preflight(a)
    assert str(e.value) == f"host preflight: the installed SGLang refuses these arguments: {said}"


def test_a_refusal_other_than_argparse_is_one_line():
    assert resolver.refusal(ValueError("bad\n  value"), "") == "ValueError: bad value"
    assert resolver.refusal(SystemExit(3), "usage: x\n") == "SystemExit: argument parsing failed (exit 3)"


@pytest.mark.slow
def test_the_real_sglang_refusal_is_argparse_own_line():
    from sandbox import real_sglang
    (typo, value) = real_sglang.resolve([["--model-path", "/m", "--enable-torch-compil"],
                                         ["--model-path", "/m", "--tp-size", "x"]])
    # SGLang's parser takes abbreviations, so a flag cut short is "ambiguous", not "unrecognized"
    assert typo["error"] == ("argparse error: ambiguous option: --enable-torch-compil could match "
                             "--enable-torch-compile, --enable-torch-compile-debug-mode")
    assert value["error"] == "argparse error: argument --tp-size/--tensor-parallel-size: invalid int value: 'x'"
