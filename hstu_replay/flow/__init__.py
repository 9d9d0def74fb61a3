"""NVIDIA's own workflows as one command each: the L0 CI flow (`hstu-replay flow l0`)."""
