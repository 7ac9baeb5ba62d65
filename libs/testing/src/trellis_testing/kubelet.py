"""The kubelet's part of the pod test bed: :func:`run_pod_spec` runs a (webhook-patched) Pod
object's init containers in order (to completion, or left running if they are native
sidecars, whose startup probe must pass first), then its containers, each as
:meth:`~.pods.Pod.spawn` runs a process, with the volumes it can play (Secret, emptyDir and
projected-token volumes) and ``$(VAR)`` references expanded as the kubelet expands them.
Anything else it cannot run is refused, naming what, before anything starts.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from trellis_testing.netns import (
    _LOG_TAIL_LINES,
    _NO_STRINGS,
    _POLL_INTERVAL_S,
    _SYSTEM_PATH,
)
from trellis_testing.pods import (
    Pod,
)

# --- the kubelet's part -----------------------------------------------------------------


def expand_references(text: str, env: Mapping[str, str]) -> str:
    """Expand ``$(VAR)`` in ``text`` from ``env`` as the kubelet does.

    ``$$`` is a literal ``$`` (so ``$$(VAR)`` stays ``$(VAR)``), a reference to a variable
    not in ``env`` is left as written, and so is an unclosed ``$(``. A port of Kubernetes'
    ``third_party/forked/golang/expansion``.
    """
    out: list[str] = []
    cursor = 0
    while cursor < len(text):
        if text[cursor] != "$" or cursor + 1 == len(text):
            out.append(text[cursor])
            cursor += 1
            continue
        following = text[cursor + 1]
        if following == "(" and (closer := text.find(")", cursor + 2)) != -1:
            name = text[cursor + 2 : closer]
            out.append(env.get(name, f"$({name})"))
            cursor = closer + 1
            continue
        out.append("$" if following == "$" else "$" + following)  # "$$" is an escaped "$"
        cursor += 2
    return "".join(out)


@dataclass
class RunningPod:
    """What :func:`run_pod_spec` started: each container's process and log (native
    sidecars' too), and each other init container's output (stdout then stderr)."""

    pod: Pod
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    init_output: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _StartupProbe:
    """A native sidecar's ``startupProbe``, with the kubelet's defaults."""

    argv: list[str]
    initial_delay: int
    period: int
    timeout: int
    failure_threshold: int


@dataclass(frozen=True)
class _Container:
    """A container of the spec resolved into what :class:`Pod` runs."""

    name: str
    argv: list[str]
    env: dict[str, str]
    uid: int | None
    gid: int | None
    mounts: dict[str, Path]
    cwd: Path | None
    sidecar: bool  # an init container with restartPolicy Always
    startup_probe: _StartupProbe | None


def _field_values(pod: Pod, spec: Mapping[str, Any]) -> dict[str, str]:
    """The ``fieldRef`` paths we can answer, as the API server would have filled them in."""
    metadata = spec.get("metadata") or {}
    pod_spec = spec.get("spec") or {}
    return {
        "status.podIP": pod.ip,
        "metadata.name": metadata.get("name") or pod.name,
        "metadata.namespace": metadata.get("namespace") or "default",
        "spec.serviceAccountName": pod_spec.get("serviceAccountName") or "default",
    }


def _env_value(var: str, source: Mapping[str, Any], fields: Mapping[str, str]) -> str:
    """The value of env var ``var`` given by ``valueFrom`` ``source``."""
    field_path = (source.get("fieldRef") or {}).get("fieldPath")
    if set(source) != {"fieldRef"} or not isinstance(field_path, str) or field_path not in fields:
        raise NotImplementedError(
            f"env {var}: valueFrom {dict(source)!r} is not supported "
            f"(only fieldRef to {', '.join(fields)})"
        )
    return fields[field_path]


def _container_env(
    container: Mapping[str, Any], fields: Mapping[str, str], extra: Mapping[str, str], path: str
) -> dict[str, str]:
    """A container's environment: ``extra``, then its ``env`` items in order (each value's
    references expanded from the items before it), then PATH."""
    if container.get("envFrom"):
        raise NotImplementedError(f"container {container['name']}: envFrom is not supported")
    env = dict(extra)
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" in item:
            env[name] = _env_value(name, item["valueFrom"], fields)
        else:
            env[name] = expand_references(item.get("value", ""), env)
    env["PATH"] = path  # the image's PATH means nothing on the host
    return env


def _container_mounts(container: Mapping[str, Any], volumes: Mapping[str, Path]) -> dict[str, Path]:
    """Container path -> host path for each volume mount (``subPath`` within the volume,
    created if missing as the kubelet does; ``readOnly`` is not enforced)."""
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        volume = mount["name"]
        if volume not in volumes:
            raise KeyError(f"volume {volume!r} (mounted by container {container['name']})")
        source = volumes[volume]
        if mount.get("subPath"):
            source = source / mount["subPath"]
            if not source.exists():
                source.mkdir(parents=True)
        mounts[mount["mountPath"]] = source
    return mounts


def _probe_seconds(name: str, probe: Mapping[str, Any], key: str, default: int) -> int:
    """A probe's ``key`` in seconds; whole, as the API server requires."""
    value = probe.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"container {name}: startupProbe.{key} must be whole seconds: {value!r}")
    return value


def _startup_probe(container: Mapping[str, Any]) -> _StartupProbe | None:
    """A sidecar's ``startupProbe`` (``exec`` only), or None if it has none."""
    name, probe = container["name"], container.get("startupProbe")
    if not probe:
        return None
    command = (probe.get("exec") or {}).get("command")
    if not command:
        raise NotImplementedError(
            f"container {name}: startupProbe {dict(probe)!r} is not supported (only exec)"
        )
    seconds = partial(_probe_seconds, name, probe)
    return _StartupProbe(
        argv=list(command),
        initial_delay=seconds("initialDelaySeconds", 0),
        period=seconds("periodSeconds", 10),
        timeout=seconds("timeoutSeconds", 1),
        failure_threshold=seconds("failureThreshold", 3),
    )


def _resolve(
    container: Mapping[str, Any],
    pod_security: Mapping[str, Any],
    fields: Mapping[str, str],
    volumes: Mapping[str, Path],
    extra: Mapping[str, str],
    path: str,
) -> _Container:
    """Resolve one container of the spec, or raise before anything of the pod has run."""
    name = container["name"]
    command = container.get("command")
    if not command:
        raise ValueError(f"container {name} has no command: the image's entrypoint is unknown here")
    env = _container_env(container, fields, extra, path)
    security = {**pod_security, **(container.get("securityContext") or {})}
    working_dir = container.get("workingDir")
    sidecar = container.get("restartPolicy") == "Always"
    return _Container(
        name=name,
        argv=[expand_references(word, env) for word in [*command, *(container.get("args") or [])]],
        env=env,
        uid=security.get("runAsUser"),
        gid=security.get("runAsGroup"),
        mounts=_container_mounts(container, volumes),
        cwd=Path(working_dir) if working_dir else None,
        sidecar=sidecar,
        startup_probe=_startup_probe(container) if sidecar else None,
    )


def run_pod_spec(
    pod: Pod,
    spec: Mapping[str, Any],
    volumes: Mapping[str, Path],
    *,
    workdir: Path,
    path: str | None = None,
    env_extra: Mapping[str, str] = _NO_STRINGS,
    init_timeout: float = 30,
) -> RunningPod:
    """Run a Kubernetes Pod object (as patched by a webhook) in ``pod``, as the kubelet would.

    First each ``spec.initContainers[]`` in order, to completion (a failure raises with its
    output); then each ``spec.containers[]``, logging to ``workdir/<container>.log``.
    Each runs its ``command`` + ``args`` ($(VAR) references expanded), with its ``env``
    (``value``, or ``valueFrom.fieldRef`` to ``status.podIP``, ``metadata.name``,
    ``metadata.namespace``, ``spec.serviceAccountName``) after ``env_extra``, and PATH set to
    ``path`` or the caller's PATH; as ``securityContext.runAsUser``/``runAsGroup``
    (the container's, else the pod's, else root); in ``workingDir`` if given; with each
    ``volumeMounts`` item bound from ``volumes`` (volume name -> host directory).

    An init container with ``restartPolicy: Always`` is a native sidecar (Kubernetes 1.29+):
    it is started like a container (logged to ``workdir/<container>.log``, in
    ``processes``, stopped with the pod) and left running, and the next init container, or
    the containers, start once its ``startupProbe`` passes, or right away if it has none.
    The probe is ``exec`` only: its ``command`` runs in the pod as the container does (its
    uid, env and mounts), first after ``initialDelaySeconds`` (0), then every
    ``periodSeconds`` (10), each attempt allowed ``timeoutSeconds`` (1); after
    ``failureThreshold`` (3) failures in a row ``RuntimeError`` names the sidecar and the
    probe's last output (the kubelet would restart the sidecar and keep trying). A sidecar
    that exits before its probe passes raises ``RuntimeError`` with the tail of its log.
    Either way the sidecar stays with the pod, for :meth:`Pod.stop` to end.

    The image is not used: the command must exist on this machine, hence a container with
    no ``command`` (whose entrypoint would come from the image) raises ``ValueError``. An
    unknown volume raises ``KeyError``; an env source other than those fieldRefs, or a
    startup probe other than ``exec``, raises ``NotImplementedError``: all before anything
    runs.
    """
    pod_spec = spec.get("spec") or {}
    resolve = partial(
        _resolve,
        pod_security=pod_spec.get("securityContext") or {},
        fields=_field_values(pod, spec),
        volumes=volumes,
        extra=env_extra,
        path=path if path is not None else os.environ.get("PATH", _SYSTEM_PATH),
    )
    inits = [resolve(container) for container in pod_spec.get("initContainers") or []]
    containers = [resolve(container) for container in pod_spec.get("containers") or []]
    running = RunningPod(pod)
    for init in inits:
        if init.sidecar:
            _start(running, init, workdir)
            _await_startup(running, init)
        else:
            running.init_output[init.name] = _run_init(pod, init, init_timeout)
    for container in containers:
        _start(running, container, workdir)
    return running


def _start(running: RunningPod, container: _Container, workdir: Path) -> None:
    """Start a long-running container, logging to ``workdir/<container>.log``."""
    log = running.logs[container.name] = workdir / f"{container.name}.log"
    running.processes[container.name] = running.pod.spawn(
        container.argv,
        env=container.env,
        uid=container.uid,
        gid=container.gid,
        mounts=container.mounts,
        cwd=container.cwd,
        log=log,
    )


def _await_startup(running: RunningPod, sidecar: _Container) -> None:
    """Return once the sidecar's startup probe passes (at once if it has none); raise
    ``RuntimeError`` if it fails ``failureThreshold`` times in a row or the sidecar exits."""
    probe = sidecar.startup_probe
    if probe is None:
        return
    _watch_sidecar(running, sidecar, probe.initial_delay)
    for attempt in range(1, probe.failure_threshold + 1):
        started = time.monotonic()
        try:
            running.pod.run(
                probe.argv,
                env=sidecar.env,
                uid=sidecar.uid,
                gid=sidecar.gid,
                mounts=sidecar.mounts,
                cwd=sidecar.cwd,
                timeout=probe.timeout,
            )
            return
        except RuntimeError as error:
            if attempt == probe.failure_threshold:
                _check_alive(running, sidecar)  # an exit is the better explanation
                raise RuntimeError(
                    f"sidecar {sidecar.name} of pod {running.pod.name}: its startup probe "
                    f"failed {attempt} times; the last: {error}"
                ) from error
        _watch_sidecar(running, sidecar, probe.period - (time.monotonic() - started))


def _watch_sidecar(running: RunningPod, sidecar: _Container, seconds: float) -> None:
    """Wait ``seconds``; raise ``RuntimeError`` with its log's tail if the sidecar exits."""
    deadline = time.monotonic() + seconds
    while True:
        _check_alive(running, sidecar)
        if time.monotonic() >= deadline:
            return
        time.sleep(_POLL_INTERVAL_S)


def _check_alive(running: RunningPod, sidecar: _Container) -> None:
    """Raise ``RuntimeError`` with the tail of its log if the sidecar has exited."""
    process = running.processes[sidecar.name]
    if process.poll() is None:
        return
    lines = running.logs[sidecar.name].read_text(errors="replace").splitlines()
    tail = "\n".join(lines[-_LOG_TAIL_LINES:])
    raise RuntimeError(
        f"sidecar {sidecar.name} of pod {running.pod.name} exited (rc {process.returncode}) "
        f"before its startup probe passed; its log ends:\n{tail}"
    )


def _run_init(pod: Pod, init: _Container, timeout: float) -> str:
    """Run an init container to completion; its output, or a RuntimeError naming it."""
    try:
        result = pod.run(
            init.argv,
            env=init.env,
            uid=init.uid,
            gid=init.gid,
            mounts=init.mounts,
            cwd=init.cwd,
            timeout=timeout,
        )
    except RuntimeError as error:
        raise RuntimeError(f"init container {init.name} of pod {pod.name}: {error}") from error
    return result.stdout + result.stderr
