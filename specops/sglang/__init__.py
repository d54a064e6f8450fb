"""What specops knows about SGLang itself: its speculative-decoding flag rules (`rules`), the
program that asks the installed SGLang to resolve a unit's flags (`resolver.py`, run on the host),
a service's launch arguments and what a running server must show (`spec`), and which CUDA torch
wheels suit which driver (`torchvariant`, table in cuda_variants.yml).
"""
