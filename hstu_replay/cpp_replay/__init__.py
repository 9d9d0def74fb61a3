"""The C++ reference replay: a C++ program (libtorch only) that runs a dump through model.pt2.

`replay` builds it with CMake against the torch wheel's libtorch and parses its report; nothing
here imports torch.
"""
