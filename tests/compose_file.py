"""docker-compose.yml as Compose reads it, for the parts the stack uses, and its services moved onto loopback.

`make test` runs without a container engine, so `tests/test_compose_stack.py` starts each service's
own command as a local process (`make compose-test` runs the file on a real Docker daemon:
`tests/test_compose_docker.py`). This module reads the file the way Compose does for what
the file uses: YAML anchors and merge keys, `${VAR}` / `${VAR:-default}` / `${VAR-default}`
interpolation, profiles, and each service's command, environment, exposed ports, healthcheck,
restart policy and stop grace period (Compose's defaults: `no`, 10 s). Any
other `${...}` form is an error naming it, so the file cannot grow syntax this reader would misread.

On one machine a service cannot listen on its container port or be reached by its name, so
`Loopback` gives every exposed (service, port) a free loopback port and rewrites arguments: a
reference `//service:port` becomes `//127.0.0.1:local`, and in a service's own command the listen
address `0.0.0.0` becomes `127.0.0.1` and the value of a port flag (`--port`, `--metrics-port=`, `-p`)
becomes its local port.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vistarl.httpserver.launch import free_port

_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_REFERENCE = re.compile(r"^(?P<name>[A-Za-z_]\w*)(?:(?P<op>:-|-)(?P<default>.*))?$", re.DOTALL)
_DURATION = re.compile(r"^(\d+)([smh])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600}


@dataclass(frozen=True)
class Healthcheck:
    """A service's `healthcheck`: the command, and how often and how long Compose tries it."""

    test: list[str]
    interval_s: float
    timeout_s: float
    retries: int


@dataclass(frozen=True)
class Service:
    """One service of the file, interpolated."""

    name: str
    command: list[str]
    environment: dict[str, str]
    expose: list[int]
    profiles: list[str]
    healthcheck: Healthcheck | None
    restart: str
    stop_grace_s: float


def load_services(path: Path, variables: dict[str, str]) -> dict[str, Service]:
    """Every service of the compose file at `path`, with `${...}` filled from `variables`."""
    document = interpolate(yaml.safe_load(path.read_text()), variables)
    return {name: _service(name, spec) for name, spec in document["services"].items()}


def interpolate(value: Any, variables: dict[str, str]) -> Any:
    """`value` with every `${...}` in its strings replaced as Compose does; `$$` is a literal `$`."""
    if isinstance(value, dict):
        return {key: interpolate(item, variables) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, variables) for item in value]
    if isinstance(value, str):
        escaped = value.split("$$")
        return "$".join(_VARIABLE.sub(lambda m: _substitute(m[1], variables), part) for part in escaped)
    return value


def _substitute(expression: str, variables: dict[str, str]) -> str:
    """The value of one `${expression}`: `VAR`, `VAR:-default` (unset or empty) or `VAR-default` (unset)."""
    match = _REFERENCE.match(expression)
    if match is None:
        raise ValueError(f"unsupported interpolation ${{{expression}}} in docker-compose.yml")
    value = variables.get(match["name"])
    if match["op"] == ":-" and not value:
        return match["default"]
    if match["op"] == "-" and value is None:
        return match["default"]
    return value or ""


def _service(name: str, spec: dict[str, Any]) -> Service:
    """A `Service` from its mapping; a command given as one string is an error (Compose would split it)."""
    command = spec.get("command", [])
    if not isinstance(command, list):
        raise ValueError(f"service {name}: give `command` as a list, not {command!r}")
    check = spec.get("healthcheck")
    return Service(
        name=name,
        command=[str(arg) for arg in command],
        environment={key: str(value) for key, value in (spec.get("environment") or {}).items()},
        expose=[int(port) for port in spec.get("expose", [])],
        profiles=list(spec.get("profiles", [])),
        healthcheck=None if check is None else _healthcheck(name, check),
        restart=str(spec.get("restart", "no")),
        stop_grace_s=_seconds(spec.get("stop_grace_period", "10s")),
    )


def _healthcheck(name: str, check: dict[str, Any]) -> Healthcheck:
    """The `CMD` form of a healthcheck, with Compose's defaults (30 s interval and timeout, 3 retries)."""
    test = [str(arg) for arg in check["test"]]
    if test[0] != "CMD":
        raise ValueError(f"service {name}: only the CMD form of a healthcheck is read, not {test[0]}")
    return Healthcheck(
        test=test[1:],
        interval_s=_seconds(check.get("interval", "30s")),
        timeout_s=_seconds(check.get("timeout", "30s")),
        retries=int(check.get("retries", 3)),
    )


def _seconds(duration: str) -> float:
    """A Compose duration of one unit (`5s`, `20m`) in seconds."""
    match = _DURATION.match(duration)
    if match is None:
        raise ValueError(f"unsupported duration {duration!r} in docker-compose.yml")
    return float(int(match[1]) * _SECONDS[match[2]])


@dataclass
class Loopback:
    """Free loopback ports standing in for the services' exposed ports, and the argument rewrites."""

    ports: dict[tuple[str, int], int] = field(default_factory=dict)

    def assign(self, service: Service) -> None:
        """Give each port `service` exposes a free local port."""
        for port in service.expose:
            self.ports[(service.name, port)] = free_port()

    def local(self, service: str, port: int) -> int:
        """The local port standing in for `service:port`."""
        return self.ports[(service, port)]

    def command(self, service: Service, args: list[str]) -> list[str]:
        """`args` (the service's command or healthcheck) rewritten to run on loopback."""
        own = {port: local for (name, port), local in self.ports.items() if name == service.name}
        rewritten = []
        for index, arg in enumerate(args):
            arg = self._references(arg, service.name)
            if arg == "0.0.0.0":
                arg = "127.0.0.1"
            elif arg.isdigit() and int(arg) in own and index > 0 and _names_a_port(args[index - 1]):
                arg = str(own[int(arg)])
            else:
                flag, sep, value = arg.partition("=")
                if sep and _names_a_port(flag) and value.isdigit() and int(value) in own:
                    arg = f"{flag}={own[int(value)]}"
            rewritten.append(arg)
        return rewritten

    def _references(self, arg: str, own_name: str) -> str:
        """`//service:port` (and, for the service itself, `//127.0.0.1:port`) pointed at loopback."""
        for (name, port), local in self.ports.items():
            hosts = [name, "127.0.0.1"] if name == own_name else [name]
            for host in hosts:
                arg = re.sub(rf"//{re.escape(host)}:{port}\b", f"//127.0.0.1:{local}", arg)
        return arg


def _names_a_port(flag: str) -> bool:
    """Whether a command-line flag takes a port: `--port`, `--metrics-port`, redis-cli's `-p`."""
    return flag == "-p" or (flag.startswith("--") and flag.endswith("port"))
