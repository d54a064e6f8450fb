"""A stand-in model file; srt/models/__init__.py says what's reported."""
import logging

logger = logging.getLogger(__name__)

MODEL_CODE = "upstream"
CAPTURES_EMBEDDING = False  # layer id -1 (the embedding output) needs a patched file


ENTRY_CLASSES = "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM"
FILE_VERSION = "0.5.23"
