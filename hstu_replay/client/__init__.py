"""Triton client layer: protocol, interface detection, infer."""
