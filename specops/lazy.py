"""A module named now and imported when first used: tasks.py names every flow, and each `inv` run
pays only for the flows its task runs (a no-op deploy is a tiny run; its start is much of it)."""
import importlib


class lazy:
    """Stands for the module `name` (`pipeline = lazy("specops.flows.pipeline")`).  Every attribute is
    read from the imported module itself, never a copy, so what a test monkeypatches on the module is
    what a task body sees."""
    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self):
        return f"<module {self._name!r}, imported when first used>"
