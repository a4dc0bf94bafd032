"""The Kubernetes manifests in deploy/k8s/: valid against Kubernetes' own schemas, offline, and consistent with
the service's settings (port, probes, drain time, threads) and with each other (names the others refer to).

kubernetes-validate ships the JSON schemas of every Kubernetes version it supports inside its package; the test
forbids network connections while it validates, so a schema that would need fetching fails it.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from config import REPO_ROOT, Config

MANIFEST_DIR = REPO_ROOT / "deploy" / "k8s"
MANIFESTS = sorted(MANIFEST_DIR.glob("*.yaml"))
# The oldest Kubernetes the manifests are meant for (autoscaling/v2 behavior, policy/v1), and the newest schemas
# the pinned kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


def resources(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc]


def all_resources() -> dict[tuple[str, str], dict[str, Any]]:
    return {(doc["kind"], doc["metadata"]["name"]): doc for path in MANIFESTS for doc in resources(path)}


def api_container() -> dict[str, Any]:
    deployment = all_resources()[("Deployment", "esun-asr-api")]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container["env"] if "value" in item}


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every outgoing connection fail, as on a machine without internet."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise OSError("network is off in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_k8s_manifests_exist():
    assert {path.name for path in MANIFESTS} >= {"api.yaml", "hpa.yaml", "redis.yaml"}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.name)
def test_k8s_manifest_validates_strictly_offline(path: Path, version: str, no_network: None):
    docs = resources(path)
    assert docs, f"{path.name} holds no resource"
    for doc in docs:
        # strict: an unknown or misspelt field is an error. A kind without a schema raises SchemaNotFoundError
        # here, where the command line would only warn.
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(part) for part in exc.path)
            pytest.fail(f"{path.name}: {doc['kind']}/{doc['metadata']['name']} at {where}: {exc.message}")


def test_k8s_api_probes_port_and_drain_follow_the_service_settings():
    defaults = Config()
    container = api_container()
    env = env_of(container)
    assert container["ports"][0]["containerPort"] == defaults.port == int(env["PORT"])
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["startupProbe"]["httpGet"]["path"] == "/readyz"
    # The pod is killed only after preStop's sleep and gunicorn's whole drain.
    pod = all_resources()[("Deployment", "esun-asr-api")]["spec"]["template"]["spec"]
    pre_stop_s = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert float(env["GRACEFUL_TIMEOUT_S"]) == defaults.graceful_timeout_s
    assert pod["terminationGracePeriodSeconds"] > pre_stop_s + defaults.graceful_timeout_s


def test_k8s_api_torch_threads_match_the_cpu_request():
    container = api_container()
    assert int(env_of(container)["TORCH_THREADS"]) == int(container["resources"]["requests"]["cpu"])


def test_k8s_manifests_refer_to_each_other_by_the_right_names():
    found = all_resources()
    hpa = found[("HorizontalPodAutoscaler", "esun-asr-api")]
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) in found
    redis_host = env_of(api_container())["REDIS_URL"].removeprefix("redis://").split(":")[0]
    assert ("Service", redis_host) in found
    for kind, name in (("Service", "esun-asr-api"), ("Service", "esun-asr-redis")):
        selector = found[(kind, name)]["spec"]["selector"]
        pods = [doc["spec"]["template"]["metadata"]["labels"] for (k, _), doc in found.items() if k == "Deployment"]
        assert sum(selector.items() <= labels.items() for labels in pods) == 1, f"{kind}/{name} selects no pod"
