"""The reference target: an HSTU ranking model, its KV cache and the engine serving it.

config (named sizes) -> model (eager PyTorch) -> aoti (compiled packages) -> engine (+ kvcache).
Nothing is imported here: torch is heavy, and the load-test side never needs it.
"""
