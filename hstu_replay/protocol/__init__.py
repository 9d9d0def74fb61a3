"""NVIDIA's published HSTU benchmark protocol against any server with the Triton interface.

cases (dump or store -> logical batches) -> passes (timed the way NVIDIA times them) ->
tables (ours beside NVIDIA's published figures) -> terminal, JSON and HTML.
"""
