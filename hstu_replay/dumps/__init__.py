"""NVIDIA reference dumps: read them without torch (`archive`, `reader`), write them with it.

`writer` imports torch only inside its functions, so importing this package never loads torch.
"""

from hstu_replay.dumps.archive import read_feature_keys, read_tensor_file
from hstu_replay.dumps.reader import DumpBatch, iter_dump, read_dump, read_dump_feature_keys
from hstu_replay.dumps.writer import write_dump_batch, write_feature_keys, write_tensor_file

__all__ = [
    "DumpBatch",
    "iter_dump",
    "read_dump",
    "read_dump_feature_keys",
    "read_feature_keys",
    "read_tensor_file",
    "write_dump_batch",
    "write_feature_keys",
    "write_tensor_file",
]
