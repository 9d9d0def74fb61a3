"""What `server export` and `serve` compile again, and what they take as already compiled."""

import json
import shutil

import pytest

from hstu_replay.server import build
from hstu_replay.server.model_config import get_config
from hstu_replay.server.repository import RepositoryLayout, TargetMeta, read_meta

@pytest.mark.integration  # a copy of the session's compiled repository
@pytest.mark.parametrize("weights, compiles", [(None, False), ("0123456789abcdef", True), ("", True)],
                         ids=["these weights", "other weights", "a record without weights"])
def test_a_repository_is_compiled_again_only_when_its_weights_are_not_the_seeds(
        compiled_repository, tmp_path, monkeypatch, weights, compiles):
    repository = tmp_path / "repository"
    shutil.copytree(compiled_repository, repository)
    layout = RepositoryLayout(repository)
    record = json.loads(layout.meta.read_text())
    assert record["weights"] == build.weights_digest(get_config("small"), 0)
    if weights is not None:
        layout.meta.write_text(json.dumps({**record, "weights": weights}))
    exported = []
    monkeypatch.setattr(build, "export_package", lambda model, config, path: exported.append(path))
    monkeypatch.setattr(build, "export_nocache_package", lambda model, config, path: exported.append(path))
    meta = build.export_repository(repository, "small", 0, "cpu")
    assert bool(exported) == compiles
    assert meta.weights == read_meta(layout).weights == record["weights"]


def test_the_batched_steps_package_is_named_by_its_weights():
    small = get_config("small")
    names = {build.batched_step_path("r", small, seed, 32, "cpu").name for seed in (0, 0, 1)}
    assert len(names) == 2 and all(f"-w{build.weights_digest(small, seed)}-" in " ".join(names) for seed in (0, 1))


@pytest.mark.parametrize("asked, reason", [
    (("small", 0, "cpu"), None),
    (("kuairand-1k", 0, "cpu"), "compiled for config small, seed 0, device cpu; asked for kuairand-1k, 0, cpu"),
    (("small", 1, "cpu"), "compiled for config small, seed 0, device cpu; asked for small, 1, cpu"),
    (("small", 0, "cuda"), "compiled for config small, seed 0, device cpu; asked for small, 0, cuda"),
], ids=["as asked", "another config", "another seed", "another device"])
def test_a_record_serves_only_the_config_seed_and_device_it_was_compiled_for(asked, reason):
    meta = TargetMeta("small", 0, "cpu", 1.0, "2.13.0", build.weights_digest(get_config("small"), 0))
    assert build.stale_reason(meta, *asked) == reason
    older = TargetMeta("small", 0, "cpu", 1.0, "2.13.0")  # written before records named their weights
    assert build.stale_reason(older, "small", 0, "cpu") == (
        "compiled from other weights than this version of the model draws for seed 0 (another version of hstu-replay)")
