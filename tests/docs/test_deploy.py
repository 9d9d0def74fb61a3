"""deploy/: the Kubernetes manifests against the Kubernetes schemas (offline), the Compose file
against what docs/guides/distributed.md says it runs."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import kubernetes_validate  # the docs extra
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
COMPOSE = ROOT / "deploy" / "compose" / "docker-compose.yml"
GUIDE = ROOT / "docs" / "guides" / "distributed.md"
#: the Kubernetes release whose schemas the manifests are checked against (bundled in kubernetes-validate)
KUBERNETES_VERSION = "1.33.0"


def _resources():
    return [(path.name, doc) for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_there_are_manifests():
    kinds = {doc["kind"] for _, doc in _resources()}
    assert {"Deployment", "Service", "ConfigMap", "Secret", "PersistentVolumeClaim"} <= kinds


@pytest.mark.parametrize("name,resource", _resources(), ids=lambda v: v if isinstance(v, str) else
                         f"{v['kind']}/{v['metadata']['name']}")
def test_every_manifest_is_valid_against_the_kubernetes_schema(name, resource):
    kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_the_guide_names_the_kubernetes_release_checked():
    release = ".".join(KUBERNETES_VERSION.split(".")[:2])
    assert f"Kubernetes {release} schemas" in GUIDE.read_text()


def test_the_validator_refuses_a_misspelt_field():
    deployment = next(doc for _, doc in _resources() if doc["kind"] == "Deployment")
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containerz"] = bad["spec"]["template"]["spec"].pop("containers")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def _documented_services() -> dict[str, dict[str, str]]:
    """The guide's table of Compose services: service -> {first argument, ports, profile}."""
    text = GUIDE.read_text()
    table = text.split("<!-- compose services -->", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in table.strip().splitlines()[2:] if line.startswith("|")]
    services = {}
    for row in rows:
        service, first, ports, profile = (cell.strip().strip("`") for cell in row.strip("|").split("|"))
        services[service] = {"first": first, "ports": ports, "profile": profile}
    return services


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_the_compose_file_runs_the_services_the_guide_lists():
    services = _compose()["services"]
    documented = _documented_services()
    assert set(services) == set(documented)
    for name, said in documented.items():
        service = services[name]
        command = service["command"]
        assert command[0] == said["first"], name
        published = ",".join(p.split(":")[0] for p in service.get("ports", [])) or "-"
        assert published == said["ports"], name
        assert (",".join(service.get("profiles", [])) or "-") == said["profile"], name


def test_the_compose_master_and_workers_are_wired_as_the_guide_says():
    services = _compose()["services"]
    master, worker = services["master"], services["worker"]
    master_args = dict(a[2:].split("=", 1) for a in master["command"] if "=" in a)
    assert master_args["master-bind-host"] == "0.0.0.0" and master_args["web-host"] == "0.0.0.0"
    assert "--web-login" in master["command"]
    assert master["environment"]["LOCUST_WEB_PASSWORD"].startswith("${WEB_PASSWORD:?")  # required
    assert any(a.startswith("--master-host=") for a in worker["command"])
    assert worker["depends_on"] == ["master"]
    for service in (master, worker):  # data read-only, reports writable, in every container
        assert "./data:/data:ro" in service["volumes"] and "./reports:/reports" in service["volumes"]
        assert "LOCUST_TRITON_HEADERS" in service["environment"]  # each reads its own headers
    text = GUIDE.read_text()
    for arg in ("--master-bind-host=0.0.0.0", "--web-host=0.0.0.0", "--web-login", "WEB_PASSWORD"):
        assert arg in text, f"the guide does not mention {arg}"


def test_the_compose_master_uses_load_test_options_that_exist():
    from hstu_replay.loadtest.options import OPTIONS

    flags = {o.flag for o in OPTIONS} | {"--master", "--master-bind-host", "--master-bind-port", "--web-host",
                                         "--web-port", "--web-login"}
    used = {re.split("=", a, maxsplit=1)[0] for a in _compose()["services"]["master"]["command"]}
    assert used <= flags, used - flags


MASTER_CONFIG = r"""
import json, sys
from locust.argument_parser import get_parser
import hstu_replay.locustfile  # registers the locustfile's options on Locust's parser
from hstu_replay.loadtest.config import LoadTestConfig

given = json.load(sys.stdin)
parser = get_parser(default_config_files=[given["conf"]])
known = {a.dest for a in parser._actions} | {s.lstrip("-") for a in parser._actions for s in a.option_strings}
unknown = [k for k in given["keys"] if k not in known and k.replace("-", "_") not in known]
options = parser.parse_args([], env_vars=given["env"])
config = LoadTestConfig.from_options(options)
print(json.dumps({"unknown": unknown, "store": config.data.store, "ratios": config.sweep.ratios,
                  "url": config.target.address, "report_dir": config.report.report_dir}))
"""


def test_the_masters_locust_conf_and_environment_make_a_load_test_config(tmp_path):
    """The ConfigMaps' locust.conf and LOCUST_* variables, read by Locust's own parser with the
    locustfile's options, give a valid LoadTestConfig (in a child: importing locust patches the process)."""
    import json
    import os
    import subprocess
    import sys

    maps = [doc["data"] for _, doc in _resources() if doc["kind"] == "ConfigMap"]
    (conf,) = [data["locust.conf"] for data in maps if "locust.conf" in data]
    env = {k: v for data in maps for k, v in data.items() if k.startswith("LOCUST_")}
    (tmp_path / "locust.conf").write_text(conf)
    keys = [line.split("=", 1)[0].strip() for line in conf.splitlines() if "=" in line and not line.lstrip().startswith("#")]
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUST_")}
    given = {"conf": str(tmp_path / "locust.conf"), "keys": keys, "env": env}
    result = subprocess.run([sys.executable, "-c", MASTER_CONFIG], input=json.dumps(given), capture_output=True,
                            text=True, timeout=120, cwd=tmp_path, env=child_env)
    assert result.returncode == 0, result.stderr[-3000:]
    read = json.loads(result.stdout)
    assert read["unknown"] == [], f"locust.conf keys no parser knows: {read['unknown']}"
    assert (read["store"], read["report_dir"]) == ("/data/store", "/reports")  # the PVC mounts the pods have
    assert read["url"] == env["LOCUST_TRITON_URL"] and read["ratios"][-1] == 1.0
