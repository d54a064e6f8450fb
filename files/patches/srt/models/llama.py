"""Sandbox model file, patched: captures the embedding output for EAGLE-3 layer id -1."""
# specops: provides embedding-capture
# specops-base: sglang 0.5.23

# sized as upstream (stale pyc trap)
MODEL_CODE = "patched: embedding capture"
CAPTURES_EMBEDDING = True
ENTRY_CLASSES = "LlamaForCausalLM"
