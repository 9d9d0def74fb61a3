"""A Triton model repository laid out like NVIDIA's: `<repo>/<model>/1/model.pt2` + config.pbtxt.

`hstu_gr_ranking` is a self-contained torch_aoti model (values, lengths, num_candidates in;
logits out) that Triton's PyTorch backend can serve as it is. `hstu_gr_ranking_kvcache` carries
the published KV-cache config; its package is our per-user step function, which needs the cache
manager of `hstu-replay server serve` around it (as NVIDIA's needs its custom cache ops).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from hstu_replay.errors import InputError
from hstu_replay.interface import KVCACHE, NOCACHE, ModelInterface

PACKAGE_NAME = "model.pt2"
META_NAME = "hstu_target.json"  # our own record: config name, seed, weights, compile time


@dataclass(frozen=True)
class RepositoryLayout:
    root: Path

    def package(self, interface: ModelInterface) -> Path:
        return self.root / interface.model_name / "1" / PACKAGE_NAME

    def config_pbtxt(self, interface: ModelInterface) -> Path:
        return self.root / interface.model_name / "config.pbtxt"

    def batched_step(self, key: str) -> Path:
        """The `batched-aoti` engine's package named by `key` (our own; not a Triton model)."""
        return self.root / "batched_step" / f"{key}.pt2"

    @property
    def meta(self) -> Path:
        return self.root / META_NAME

    def is_complete(self) -> bool:
        return self.meta.exists() and all(self.package(i).exists() for i in (KVCACHE, NOCACHE))


@dataclass(frozen=True)
class TargetMeta:
    config: str
    seed: int
    device: str
    compile_seconds: float
    torch_version: str
    weights: str = ""  # `model.weights_digest` of what was compiled (none in a record older than it)


def config_pbtxt(interface: ModelInterface, kind: str = "KIND_GPU") -> str:
    """The published model config: platform torch_aoti, no Triton batching, one instance."""
    lines = [f'name: "{interface.model_name}"', 'platform: "torch_aoti"', "max_batch_size: 0"]
    for section, tensors in (("input", interface.inputs), ("output", interface.outputs)):
        lines.append(f"{section} [")
        entries = []
        for t in tensors:
            dims = ", ".join(str(d) for d in t.dims)
            entries.append(
                f'  {{\n    name: "{t.name}"\n    data_type: TYPE_{t.dtype}\n    dims: [ {dims} ]\n  }}'
            )
        lines.append(",\n".join(entries))
        lines.append("]")
    lines.append(f"instance_group [\n  {{\n    count: 1\n    kind: {kind}\n  }}\n]")
    return "\n".join(lines) + "\n"


def write_configs(layout: RepositoryLayout) -> None:
    for interface in (KVCACHE, NOCACHE):
        path = layout.config_pbtxt(interface)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config_pbtxt(interface))


def write_meta(layout: RepositoryLayout, meta: TargetMeta) -> None:
    layout.meta.write_text(json.dumps(asdict(meta), indent=2) + "\n")


def read_meta(layout: RepositoryLayout) -> TargetMeta:
    try:
        return TargetMeta(**json.loads(layout.meta.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise InputError(f"{layout.meta}: not a target repository record ({exc})") from None
