"""``replay_job``: score a job's dense trajectories under other methods' caches, without running an agent.

An episode costs thousands of decode steps and a container; "how much does method X perturb this agent?" can
be measured far more cheaply by teacher-forcing the token stream a dense run produced through a cache managed
by X (``measure.counterfactual``) and storing how well the model still predicts its own completions.

What is replayed: every **dense** replay source of the job (``db.replays.replay_sources``: a key's result attempt,
driven by the agent alone, whose trajectory is a whole sample: never an interactive or steered attempt, a resample,
a run that broke or one still running) whose turns all carry their token stream
(``turns.tokens``, written by the hf backend), under every requested (method, scope, protocol). By default
those are the job's own; a method is replayed with exactly the settings that job gave it (``JobSpec`` resolves
them from the stored preset and overrides, with the source episode's seed), so a replay row and the job's live
episodes of that method are comparable. ``method_params`` overrides some of them for one replay: its rows are a
*variant*, tabled apart under a label of its own (``jobs.variants``: ``nexus[head_scores=per_head]``). Dense
itself is replayed once per protocol (its scope is moot): it is the baseline of ``compare``'s delta-NLL. Asked for
other methods only, dense is still replayed where an episode has no dense replay under that protocol yet.

A sweep resumes where it stopped: a planned replay whose configuration (source episode, method, scope, protocol,
``db.replays.config_key``) already has an ``ok`` row measured the same way (``chunked``) is left out of the plan's
``items`` and listed in its ``done``; a failed or skipped row is planned again, and ``redo=True`` plans every one
(each new row replaces the stored one). The summary's cells are over every stored row, those of earlier runs too.

Bad names, an unknown job or a job without dense episodes fail in :func:`plan_replays`, before a model is loaded.
Running the plan (:func:`run_plan`, and what each planned replay's row says) is ``measure.replay_run``'s; this
module re-exports it and the plan's data types, so ``from measure.replay import plan_replays, run_plan`` holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from pydantic import TypeAdapter, ValidationError

from agent_runner.config import ModelSpec, check_protocol
from agent_runner.measuring_dtypes import REFERENCE_DTYPE, check_measuring_dtype
from db import Database, job_rows
from db import store as db_store
from db.models import ACTIVE_STATUSES
from db.replays import config_key, is_replay_source, replay_keys, replayable_token_streams
from jobs.episode_config import stored_episode_spec
from jobs.spec import JobSpec
from jobs.variants import job_spec_for
from measure.replay_run import Progress, ReplayItem, ReplayPlan, ReplayResult, ReplaySummary, run_plan
from nexus.config import EvictionConfig, keyed
from nexus.methods import DENSE, check_method, check_scope

__all__ = [
    "Progress",
    "ReplayItem",
    "ReplayPlan",
    "ReplayResult",
    "ReplaySummary",
    "plan_replays",
    "replay_job",
    "run_plan",
]

_EVICTION = TypeAdapter(EvictionConfig)


def check_replay_settings(
    methods: Sequence[str] | None,
    scopes: Sequence[str] | None,
    protocols: Sequence[str] | None,
    densities: Sequence[float] | None = None,
) -> None:
    """ValueError naming the first unknown method, scope or protocol, or a density outside (0, 1]."""
    for m in methods or ():
        check_method(m, noun="method")
    for s in scopes or ():
        check_scope(s)
    for p in protocols or ():
        check_protocol(p)
    for d in densities or ():
        if not 0 < d <= 1:
            raise ValueError(f"density must be in (0, 1], got {d!r}")


def _job_spec(job: Any, methods: Sequence[str], method_params: Mapping[str, Any] | None = None) -> JobSpec:
    """The job's spec, extended to ``methods`` it did not run (their settings resolved from its preset), with
    ``method_params`` (per method: settings) merged over those methods' resolved settings: this replay's only, the
    stored job is not changed. The override is validated as a job's ``method_params`` are (an unknown setting, then
    each overridden policy built: ``JobSpec.check_with_library``, which imports torch but loads no model);
    ``ValueError`` names the method and the setting."""
    try:
        spec = job_spec_for(job.config, methods)
    except ValidationError as exc:
        raise ValueError(f"job {job.id}: its stored spec does not validate: {exc}") from None
    if not method_params:
        return spec
    source = "replay method_params"
    if not isinstance(method_params, Mapping):
        raise ValueError(f"{source}: must map each method to its settings, got {type(method_params).__name__}")
    for method, settings in method_params.items():
        check_method(method, noun="method")
        if method == DENSE:
            raise ValueError(f"{source}: dense keeps every token; it has no settings to vary")
        if method not in methods:
            raise ValueError(f"{source}: {method!r} is not replayed (methods: {', '.join(methods)})")
        if not isinstance(settings, Mapping):
            raise ValueError(f"{source}: {method}: settings must be a mapping, got {settings!r}")
    merged = {m: {**spec.method_params.get(m, {}), **dict(o)} for m, o in method_params.items()}
    data = {**spec.model_dump(mode="json"), "method_params": {**spec.method_params, **merged}}
    varied = JobSpec.from_dict(data, source=source)  # JobSpecError (a ValueError): an unknown setting, a bad value
    varied.model_copy(update={"methods": [m for m in varied.methods if m in merged]}).check_with_library(source=source)
    return varied


def plan_replays(
    db: Database,
    job_id: str,
    *,
    methods: Sequence[str] | None = None,
    scopes: Sequence[str] | None = None,
    protocols: Sequence[str] | None = None,
    densities: Sequence[float] | None = None,
    device: str | None = None,
    model: str | None = None,
    method_params: Mapping[str, Mapping[str, Any]] | None = None,
    tasks: Sequence[str] | None = None,
    chunked: bool = True,
    redo: bool = False,
    dtype: str = REFERENCE_DTYPE,
) -> ReplayPlan:
    """What :func:`replay_job` would run (on ``device``, default the job's own model device). ``densities``: replay
    each method at each of these densities instead of the job's own (a sweep over the budget on the same dense
    trajectories; a method whose ``method_params`` fix its density keeps it). ``model``: render each trajectory's
    text into this model's stream (``measure.text_trajectories``) instead of replaying a stored token stream: the
    way to replay a backend that sees only text (expert, oracle, openai). ``method_params``: per method, settings
    merged over the job's own for this replay only (``{"nexus": {"head_scores": "per_head"}}``); its rows are a
    *variant*, tabled apart from the method's default rows under ``nexus[head_scores=per_head]``
    (``jobs.variants``). ``tasks``: only the episodes of these task ids (shell-style globs; default every
    task). ``chunked``: how :func:`run_plan` will feed completions; a replay already stored ``ok`` with the same
    ``chunked`` is not planned again but listed in ``plan.done`` (a token-by-token run re-measures chunked rows, and
    the other way round), unless ``redo``: then every replay is planned, and each new row replaces its stored one.
    ``dtype``: what the model is measured in (``float32`` | ``bfloat16``; ``measure.measuring_dtype.choose_dtype``
    resolves ``auto``): part of each row's configuration, so rows of another dtype are neither done nor replaced.
    ``LookupError`` for an unknown job, ``ValueError`` for a bad name, density or setting
    or a job without dense episodes. Loads no model; imports no torch unless ``method_params`` is given (its
    policies are built to check the values)."""
    check_replay_settings(methods, scopes, protocols, densities)
    check_measuring_dtype(dtype)
    with db.session() as s:
        job = job_rows.get_job(s, job_id)
        methods = list(methods or (job.config or {}).get("methods") or [])
        spec = _job_spec(job, methods, method_params)
        specs = [spec.model_copy(update={"density": d}) for d in densities] if densities else [spec]
        scopes, protocols = list(scopes or spec.scopes), list(protocols or spec.protocols)
        dense = [
            e
            for e in db_store.result_attempts(s, [job.id])
            if e.method == DENSE and (not tasks or any(fnmatchcase(e.task_id, t) for t in tasks))
        ]
        if not dense:
            among = f" of tasks {', '.join(tasks)}" if tasks else ""
            raise ValueError(
                f"job {job.id} has no dense episode{among} the agent ran: a replay scores a dense trajectory"
            )
        stored = [r for r in replay_keys(s, [job.id]) if r.status == "ok"]  # one query: every row's key
        have_dense = {
            (r.episode_id, r.protocol) for r in stored if r.method == DENSE and r.model == model and r.dtype == dtype
        }
        done = {(r.episode_id, r.method, r.scope, r.protocol, r.config_key) for r in stored if r.chunked == chunked}
        combos = [(m, sc, p) for m in methods for sc in (scopes[:1] if m == DENSE else scopes) for p in protocols]
        plan = ReplayPlan(job.id, None, [], combos, protocols, text_model=model, dtype=dtype)
        for episode in dense:
            if not is_replay_source(episode, DENSE):
                why = (
                    f"still {episode.status}"
                    if episode.status in ACTIVE_STATUSES
                    else f"not a sample: {episode.status}"
                )
                plan.missing.append((episode.id, episode.task_id, why))
                continue
            if not episode.n_turns:
                plan.missing.append((episode.id, episode.task_id, "no turns"))
                continue
            if model is None and replayable_token_streams(s, episode.id) is None:
                backend = (episode.config or {}).get("backend", "hf")
                why = f"no stored token stream (a {backend} trajectory is text: replay it with --model NAME)"
                plan.missing.append((episode.id, episode.task_id, why))
                continue
            own = stored_episode_spec(episode.config, device=device).model
            measuring = own if model is None else ModelSpec(name=model, device=own.device)
            plan.model = plan.model or measuring.model_copy(update={"dtype": dtype})
            wanted = list(combos)
            if DENSE not in methods:  # the delta-NLL baseline, where this episode has none yet
                wanted += [(DENSE, scopes[0], p) for p in protocols if (episode.id, p) not in have_dense]
            for method, scope, protocol in wanted:
                for at in [spec] if method == DENSE else specs:  # dense keeps every token: the job's own settings
                    config = keyed(_EVICTION.dump_python(at.eviction_config(method, scope, episode.seed), mode="json"))
                    item = ReplayItem(episode.id, episode.task_id, method, scope, protocol, config, model, dtype)
                    key = (episode.id, method, scope, protocol, config_key(config, model, dtype))
                    (plan.done if not redo and key in done else plan.items).append(item)
    return plan


def replay_job(
    db: Database,
    job_id: str,
    *,
    chunked: bool = True,
    host: Any = None,
    progress: Progress | None = None,
    **selection: Any,
) -> ReplaySummary:
    """Plan (:func:`plan_replays`, which takes ``selection``: methods, scopes, protocols, densities, model,
    method_params, redo) and run (:func:`run_plan`) the replays of ``job_id``'s dense episodes: those not yet
    stored ``ok`` measured the same way (``chunked``), or every one with ``redo``."""
    plan = plan_replays(db, job_id, chunked=chunked, **selection)
    return run_plan(db, plan, chunked=chunked, host=host, progress=progress)
