"""specops: deploy SGLang with speculative decoding to GPU boxes.

The controller side (tasks, inventory, ops, the run engine, SSH) lives beside the
agent (`specops/agent/`), which runs on each host; `protocol` and `layout` are shared.
"""
