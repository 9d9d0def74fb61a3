"""Native reference replay: a C++ program (libtorch only) that runs a dump through model.pt2.

`native` builds it with CMake against the torch wheel's libtorch and parses its report; nothing
here imports torch.
"""

from hstu_replay.reference.native import BatchDiff, ReplayResult, build, produce_reference, replay

__all__ = ["BatchDiff", "ReplayResult", "build", "produce_reference", "replay"]
