"""One command in a sandbox container: `/bin/sh -c` with stderr merged into stdout, under `timeout -s KILL` in the
container (the whole process group dies), plus a host-side guard; the output streamed and capped
(`env.sandbox.output`).

Every process a command starts carries `NEXUS_EXEC=<id>` in its environment; after a timeout every process
still carrying it is killed, which also catches children that left the process group with `setsid`.
`Sandbox.run` (`env.sandbox.container`) is the way in; the functions here take the docker-py objects so the
container's lifecycle and its commands stay apart.
"""

from __future__ import annotations

import contextlib
import shlex
import threading
import time
import uuid

from env.sandbox.config import SANDBOX_PATH, SandboxConfig, SandboxError
from env.sandbox.output import CappedBuffer, ExecResult


def exec_command(
    client, container, config: SandboxConfig, cmd: str, *, timeout: float, workdir: str | None
) -> ExecResult:
    """Run `cmd` in `container` with `/bin/sh -c` in `workdir`, killed inside the container after `timeout`
    seconds (and from the host `config.host_grace_s` later, should the container not manage it)."""
    exec_tag = uuid.uuid4().hex
    # exec 2>&1 merges in the container, so the order of stdout/stderr lines is the real one.
    wrapped = f"exec 2>&1; exec timeout -s KILL {timeout:.3f} /bin/sh -c {shlex.quote(cmd)}"
    # docker adds an exec's environment to the container's, so the tag never hides the image's ENV
    env = {**config.command_env(), "NEXUS_EXEC": exec_tag}
    api = client.api
    started = time.monotonic()
    try:
        exec_id = api.exec_create(
            container.id,
            ["/bin/sh", "-c", wrapped],
            stdout=True,
            stderr=True,
            workdir=workdir,
            environment=env,
        )["Id"]
        stream = api.exec_start(exec_id, stream=True, demux=False)
    except Exception as exc:
        raise SandboxError(
            f"exec in container {container.short_id} failed: {with_container_state(container, exc)}"
        ) from exc
    buffer = CappedBuffer(config.max_output_bytes)
    failure: list[BaseException] = []

    def pump() -> None:
        try:
            for chunk in stream:
                buffer.add(chunk)
        except Exception as exc:  # recorded and re-raised on the caller's thread
            failure.append(exc)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    reader.join(timeout + config.host_grace_s)
    host_timeout = reader.is_alive()
    seconds = time.monotonic() - started
    if host_timeout:
        kill_tagged(container, exec_tag)
        reader.join(10)
    if failure:
        raise SandboxError(f"reading command output failed: {with_container_state(container, failure[0])}")
    exit_code = api.exec_inspect(exec_id).get("ExitCode")
    exit_code = -1 if exit_code is None else int(exit_code)
    # timeout(1) kills its whole process group with KILL, itself included: 137 after ~timeout seconds.
    timed_out = host_timeout or (exit_code in (124, 137) and seconds >= timeout * 0.98)
    if timed_out:
        kill_tagged(container, exec_tag)
    output, truncated = buffer.text()
    return ExecResult(output=output, exit_code=exit_code, timed_out=timed_out, truncated=truncated, seconds=seconds)


def kill_tagged(container, exec_tag: str) -> None:
    """KILL every process whose environment carries this command's tag (escapees of setsid too)."""
    script = (
        f"for p in /proc/[0-9]*; do grep -qsz '^NEXUS_EXEC={exec_tag}$' $p/environ 2>/dev/null "
        "&& kill -9 ${p#/proc/} 2>/dev/null; done; true"
    )
    # the container may be gone; the caller reports the timeout either way. As root, whatever the
    # container's user, so the kill reaches processes of every user.
    with contextlib.suppress(Exception):
        container.exec_run(["/bin/sh", "-c", script], environment={"PATH": SANDBOX_PATH}, user="0")


def with_container_state(container, exc: BaseException) -> str:
    """`exc` with the container's state, which says whether it died (OOM-killed, say) or is gone."""
    try:
        container.reload()
        state = container.attrs.get("State", {})
        return f"{exc} (container status {state.get('Status')}, OOMKilled={state.get('OOMKilled')})"
    except Exception:
        return f"{exc} (container gone)"
