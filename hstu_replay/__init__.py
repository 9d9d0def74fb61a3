"""hstu-replay: replay KuaiRand-1K traffic against HSTU ranking models served by Triton."""

__version__ = "0.1.0"
