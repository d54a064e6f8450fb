"""Sandbox model file, patched: captures the embedding output for EAGLE-3 layer id -1."""
# specops: provides embedding-capture

# padded to the upstream size (stale-bytecode trap test) ---------
MODEL_CODE = "patched: embedding capture"
CAPTURES_EMBEDDING = True
ENTRY_CLASSES = "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM"
