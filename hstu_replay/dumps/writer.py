"""Write dump files exactly as NVIDIA's exporter does (needs torch; imported only when called).

Each tensor goes into its own TorchScript archive: a scripted module whose only state is a buffer
named `tensor`, so that C++ can read it with torch::jit::load(path).attr("tensor").
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

#: Tensor names that may appear in a file name `batch_%06d_<name>.pt`.
_NAME = re.compile(r"[A-Za-z0-9_]+")


@functools.lru_cache(maxsize=None)
def _holder_class() -> Any:
    """The module class, built once: defining it needs torch, which we import lazily."""
    import torch

    class TensorHolder(torch.nn.Module):
        def __init__(self, tensor: torch.Tensor) -> None:
            super().__init__()
            self.register_buffer("tensor", tensor)

        def forward(self):  # unannotated: TorchScript infers Tensor from the buffer
            return self.tensor

    return TensorHolder


def write_tensor_file(path: str | Path, array: Any) -> Path:
    """Save `array` (a numpy array, or a torch.Tensor kept as is, e.g. bf16) as a dump file."""
    import torch

    if isinstance(array, torch.Tensor):
        tensor = array.detach().cpu()
    else:
        tensor = torch.from_numpy(np.array(array, copy=True))  # own, writable, any layout
    path = Path(path)
    with warnings.catch_warnings():  # TorchScript is deprecated, but it is the dump format
        warnings.filterwarnings("ignore", "`torch.jit", DeprecationWarning)
        torch.jit.save(torch.jit.script(_holder_class()(tensor)), str(path))
    return path


def write_dump_batch(directory: str | Path, index: int,
                     tensors: Mapping[str, Any]) -> list[Path]:
    """Write `batch_%06d_<name>.pt` for each named tensor; returns the paths written."""
    if index < 0:
        raise ValueError(f"batch index must be >= 0, got {index}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, array in tensors.items():
        if not _NAME.fullmatch(name):
            raise ValueError(f"tensor name {name!r} is not usable in a dump file name")
        paths.append(write_tensor_file(directory / f"batch_{index:06d}_{name}.pt", array))
    return paths


def write_feature_keys(directory: str | Path, keys: Iterable[str]) -> Path:
    """`feature_keys.pt`: a plain torch.save of the key list, as the exporter writes it."""
    import torch

    path = Path(directory) / "feature_keys.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save([str(k) for k in keys], path)
    return path
