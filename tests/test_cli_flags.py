"""Every task's options as a user types them: no short flag invoke could only spell "--" (it runs
out of letters), and -h, -g, -a, -i mean host, group, all and inventory in every task."""
import copy

import tasks


def _flags(task):
    return {a.name: a.names for a in copy.deepcopy(task).get_arguments()}


def test_every_task_s_short_flags_are_letters_and_the_selection_s_are_the_same_everywhere():
    seen = 0
    for name in tasks.ns.task_names:
        task = tasks.ns[name]
        flags = _flags(task)
        for arg, names in flags.items():
            assert all(len(n) > 1 or n.isalnum() for n in names), (name, arg, names)
        for arg, short in (("host", "h"), ("group", "g"), ("all", "a"), ("inventory", "i")):
            if arg in flags:
                assert short in flags[arg], (name, arg, flags[arg])
                seen += 1
        for arg in ("accept-new-host-key", "break-lock", "apply"):  # trusting or taking over: spelt out
            assert list(flags.get(arg, [arg])) == [arg], (name, arg, flags.get(arg))
    assert seen >= 40  # the selection options of the fleet tasks, spec-tune's among them
    assert "i" in _flags(tasks.ns["spec-tune"])["inventory"]
