"""The command line's own mistakes, which invoke's parser finds before any task runs (an option no
task has, a value left out, a FILE not given), said as specops says every usage error: one line,
`error: ...`, exit 2.  Invoke says them with exit 1, where the README promises 2 for bad input.

`inv` is invoke's own program, which reads tasks.py only once it has parsed its own options:
what tasks.py can change is how the program parses the rest (the tasks and their options), so
`install` wraps those two steps of it."""
from __future__ import annotations

import re

from invoke import Exit, ParseError
from invoke.program import Program

STEPS = ("parse_tasks", "parse_cleanup")  # the task words and options; `--help TASK`


def said(e: ParseError) -> str:
    """The error's one line, naming the task (when it was in one) and where its options are listed."""
    text = str(e)
    task = getattr(e.context, "name", None)
    where, options = (f"inv {task}: ", f" (inv --help {task} lists its options)") if task else ("", "")
    flag = re.match(r"Flag <Argument: (\w+)", text)
    flag = "--" + flag.group(1).replace("_", "-") if flag else None
    unknown = re.fullmatch(r"No idea what '(.*)' is!", text)
    missing = re.fullmatch(r"'.*' did not receive required positional arguments: (.*)", text)
    if unknown and unknown.group(1).startswith("-"):
        return f"{where}no option {unknown.group(1)}{options}"
    if unknown and task:  # after a task's options and FILE, a word is taken for the next task's name
        return f"{where}{unknown.group(1)!r} is none of its options, nor a task{options}"
    if unknown:
        return f"no task {unknown.group(1)!r} (inv --list lists them)"
    if missing:
        names = " and ".join(n.upper() for n in re.findall(r"'([^']*)'", missing.group(1)))
        return f"{where}give {names}{options}"
    if flag and "needed value" in text:
        return f"{where}{flag} needs a value{options}"
    return f"{where}{text}"


def help_as_a_value(program: Program) -> None:
    """Invoke gives a FILE or an option's value the next word, whatever it is: `inv patch --help`,
    `--host --help`, `-i --help` are a FILE, a host, an inventory named "--help" to it, and a
    request for the task's help to a user: shown as `inv --help TASK` shows it, exit 0."""
    for context in program.tasks:
        if any(a.value == "--help" for a in context.args.values()):
            program.print_task_help(context.name)
            raise Exit(code=0)


def _one_line(step, then=None):
    def parse(program: Program) -> None:
        try:
            step(program)
        except ParseError as e:
            task = getattr(e.context, "name", None)
            if task and "--help" in program.argv:  # `inv patch --help FILE`: --help took FILE's place
                program.print_task_help(task)
                raise Exit(code=0) from None
            raise Exit(f"error: {said(e)}", code=2) from None
        if then:
            then(program)
    parse.one_line = True
    return parse


def install() -> None:
    """From now on (once a process: the wrapped step is left as it is), a mistake on the command
    line is one line and exit 2, and --help where a value goes shows the task's help."""
    for name in STEPS:
        step = getattr(Program, name)
        if not getattr(step, "one_line", False):
            setattr(Program, name, _one_line(step, help_as_a_value if name == "parse_tasks" else None))
