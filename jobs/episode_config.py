"""A stored episode's config read back: the ``EpisodeSpec`` a worker runs and a replay re-renders.

``jobs.spec.JobSpec.episode_config`` writes one ``EpisodeSpec`` dump per episode row; :func:`stored_episode_spec`
is its one reader (the Celery worker, the replay planner and the text-trajectory renderer all call it), so a
setting added since a row was stored reads the same everywhere.
"""

from __future__ import annotations

from typing import Any

from agent_runner.config import EpisodeSpec
from nexus.presets import stored_settings


def stored_episode_spec(config: dict[str, Any], *, device: str | None = None) -> EpisodeSpec:
    """The stored per-episode config (an ``EpisodeSpec`` dump) -> the EpisodeSpec to run: grading left to the
    ``grade`` queue, and the model on ``device`` when the host names one (``ServiceSettings.device``: it belongs
    to the host, not to the job). A method setting stored before it existed reads as the value the episode ran
    with (``nexus.presets.stored_settings``)."""
    config = dict(config)
    eviction = config.get("eviction")
    if isinstance(eviction, dict) and isinstance(eviction.get("method_params"), dict):
        # a setting added since it was stored: what it ran with
        params = stored_settings(eviction.get("method", ""), eviction["method_params"])
        config["eviction"] = {**eviction, "method_params": params}
    spec = EpisodeSpec.model_validate(config)
    update: dict[str, Any] = {"grade": False}
    if device:
        update["model"] = spec.model.model_copy(update={"device": device})
    return spec.model_copy(update=update)
