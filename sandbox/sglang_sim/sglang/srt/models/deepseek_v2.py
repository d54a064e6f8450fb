"""Stand-in model module: the server imports it at startup and reports MODEL_CODE,
so a test can tell which source the running process really loaded."""

MODEL_CODE = "upstream"
CAPTURES_EMBEDDING = False  # layer id -1 (the embedding output) needs a patched file
ENTRY_CLASSES = "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM"
