"""A stand-in model file; srt/models/__init__.py says what's reported.

SGLang 0.5.24's: against 0.5.23's it gains an import and a helper above MODEL_CODE, and a class
in ENTRY_CLASSES (versions/README.md says why)."""
import logging
from typing import List


def entry_class_names() -> List[str]:
    """The classes this module registers, as the model registry reads ENTRY_CLASSES."""
    return [name.strip() for name in ENTRY_CLASSES.split(",")]


logger = logging.getLogger(__name__)

MODEL_CODE = "upstream"
CAPTURES_EMBEDDING = False  # layer id -1 (the embedding output) needs a patched file


ENTRY_CLASSES = "LlamaForCausalLM, Phi3ForCausalLM"
FILE_VERSION = "0.5.24"
