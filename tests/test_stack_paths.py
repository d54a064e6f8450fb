"""The stack directories a unit file names (agent/converge/stacks.py _stack_paths), found without re:
the same as re's `STACKS_DIR/[0-9a-f]{16}` on random texts made of its parts.  No fleet."""
import random
import re

from specops.agent.converge import stacks
from specops.layout import STACKS_DIR

PARTS = ["x", " ", STACKS_DIR + "/", STACKS_DIR, "/", "0123456789abcdef", "abcdef0123456789f", "g",
         "ABCDEF0123456789", "\n", "0", "=", '"']


def test_the_stacks_a_unit_names_are_what_re_finds():
    rng = random.Random(51)
    for _ in range(3000):
        text = "".join(rng.choice(PARTS) for _ in range(rng.randrange(8)))
        want = {m.group(0) for m in re.finditer(re.escape(STACKS_DIR) + r"/[0-9a-f]{16}", text)}
        assert stacks._stack_paths(text) == want, text
