"""The agent's view of a task's sandbox: run one tool call, take the diff, close.

:class:`Environment` is the protocol the loop needs (tests use small in-process doubles of it);
:class:`DockerEnvironment` is the real one, built from ``env``'s pieces: the task image
(``env.tasks.images.ensure_task_image``), a ``env.sandbox.container.Sandbox`` container (``network_mode="none"``,
limits from ``SandboxConfig``) and the R2E tools installed into it (``env.sandbox.tools.ToolBox``); then the
layout's grading material is removed and the tree snapshotted (``env.tasks.layouts``), so the diff holds only the
agent's changes. ``env`` is imported inside ``open`` so importing this module does not need Docker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from env.sandbox.tools import ToolCall, ToolResult

if TYPE_CHECKING:
    from env.sandbox.config import SandboxConfig
    from env.sandbox.container import Sandbox
    from env.sandbox.tools import ToolBox
    from env.tasks.loading import Task


@runtime_checkable
class Environment(Protocol):
    def step(self, call: ToolCall) -> ToolResult:
        """Run one tool call; the observation is the tool's R2E-formatted text. Raises on infra failure."""
        ...

    def diff(self) -> str:
        """The working tree's changes against the tree as it was when the episode started."""
        ...

    def close(self) -> None: ...


class DockerEnvironment:
    """A task's container with the agent tools installed. Use ``DockerEnvironment.open(...)`` as a context
    manager so the container is removed on every path out."""

    def __init__(self, sandbox: Sandbox, toolbox: ToolBox, *, image: str) -> None:
        self.sandbox, self.toolbox, self.image = sandbox, toolbox, image
        self._closed = False

    @classmethod
    def open(
        cls,
        task: Task,
        *,
        labels: dict[str, str] | None = None,
        sandbox_config: SandboxConfig | None = None,
        job: str = "agent",
        episode: str | None = None,
        client: Any = None,
    ) -> DockerEnvironment:
        """Ensure the task image, start its sandbox and install the tools. ``job``/``episode`` go into the
        container's labels (``reap`` uses them). Raises env's ImageMissing / ImageBuildFailed / SandboxError
        (the caller records them); a half-started sandbox is closed before re-raising."""
        from env.sandbox.config import SandboxConfig
        from env.sandbox.container import Sandbox
        from env.sandbox.tools import ToolBox
        from env.tasks.images import ensure_task_image
        from env.tasks.layouts import prepare_agent_sandbox

        image = ensure_task_image(task, client) if client is not None else ensure_task_image(task)
        sandbox = Sandbox.start(
            image,
            config=sandbox_config or SandboxConfig(),
            labels=dict(labels or {}),
            job=job,
            episode=episode or task.instance_id,
            client=client,
        )
        try:
            toolbox = ToolBox(sandbox)
            toolbox.install()
            prepare_agent_sandbox(sandbox, task)
        except BaseException:
            sandbox.close()
            raise
        return cls(sandbox, toolbox, image=image)

    def step(self, call: ToolCall) -> ToolResult:
        return self.toolbox.call(call)

    def diff(self) -> str:
        return self.sandbox.diff()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.sandbox.close()

    def __enter__(self) -> DockerEnvironment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
