"""Import-only stand-in for torchvision, for the differential test's real-SGLang oracle.

SGLang 0.5.23 imports torchvision for multimodal helpers that argument
resolution never calls, and PyPI's torchvision does not load beside the CPU
torch wheel here.  Every `torchvision.*` module and attribute resolves to an
inert placeholder; calling one fails loudly.
"""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.29.1"


class _Placeholder(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__name__}.{name}")

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"torchvision stand-in: {cls.__name__} was called; only imports are supported")


def _placeholder(name):
    return _Placeholder(name, (), {})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda name: _placeholder(f"{spec.name}.{name}")
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())


def __getattr__(name):
    return _placeholder(f"torchvision.{name}")
