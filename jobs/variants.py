"""Variant labels: the name a replay row's (method, settings) is tabled under, computed here and nowhere else.

A replay of method ``m`` normally runs with exactly the settings its job gave ``m`` (``JobSpec.eviction_config``:
the stored preset and ``method_params``; for a method the job did not run, its preset's). ``nexus-eval replay
--method-params`` runs it with other settings; such a row is a **variant** and must never share a cell with the
method's default rows. Its label is ``m[key=value,...]`` with the settings that differ from the job's own, keys
sorted (``nexus[head_scores=per_head]``); a row with the job's own settings keeps the plain name ``m``.

What is compared: the row's stored ``EvictionConfig`` against the job's for ``m``, field by field, over the
shared fields a method may set for itself (``window``, ``block_size``, ``slack_blocks``, ``budget_tokens``) and the
method's own hyperparameters (``method_params``). Never compared: ``method``, and ``density``, ``scope`` and
``seed``, which are cells (or samples) of their own. A setting the row does not record is not a difference
(nothing says what it ran with); a row's recorded ``method_params`` lacking a setting added since it was stored
reads as the value it ran with (``nexus.presets.stored_settings``), as a stored job's do. ``budget_tokens`` is
compared like the rest: a row with another absolute budget than its job's is not what its density cell says.

The job's settings come from ``Job.config`` (``Replay.job_id``): :func:`row_labels` reads each job once through
the rows' session (or takes ``job_configs``). A job whose stored spec no longer validates leaves its rows
labelled by their plain method: there is nothing to compare them with (a replay of such a job is refused by
``measure.replay.plan_replays`` anyway).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from nexus.config import EvictionConfig
from nexus.methods import METHODS
from nexus.presets import stored_settings

if TYPE_CHECKING:
    from jobs.spec import JobSpec

#: EvictionConfig fields that are never part of a variant: the method itself and the cells of their own
CELL_FIELDS: tuple[str, ...] = ("method", "scope", "density", "seed")
#: the shared EvictionConfig fields a variant may differ in (the method's own hyperparameters are the others)
SHARED_VARIANT_FIELDS: tuple[str, ...] = tuple(
    name for name in EvictionConfig.__dataclass_fields__ if name not in (*CELL_FIELDS, "method_params")
)


def job_spec_for(config: Mapping[str, Any] | None, methods: Sequence[str]) -> JobSpec:
    """A stored job's spec (``JobSpec.from_stored``), extended to ``methods`` it did not run: their settings
    resolved from its preset. pydantic's ``ValidationError`` (a ``ValueError``) when the stored spec does not
    validate."""
    from jobs.spec import JobSpec

    data = dict(config or {})
    listed = list(data.get("methods") or [])
    extra = [m for m in methods if m not in listed]
    return JobSpec.from_stored({**data, "methods": [*listed, *extra]})


def settings_of(method: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The comparable settings an ``EvictionConfig`` dump records: its shared variant fields and its
    ``method_params`` (read as stored: :func:`nexus.presets.stored_settings`), one flat mapping."""
    out = {name: config[name] for name in SHARED_VARIANT_FIELDS if name in config}
    params = config.get("method_params")
    if isinstance(params, Mapping):
        out.update(stored_settings(method, dict(params)))
    return out


def _canonical(job_config: Mapping[str, Any]) -> str:
    return json.dumps(job_config, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


@lru_cache(maxsize=512)
def _job_settings(job_json: str, method: str) -> Mapping[str, Any] | None:
    """``method``'s settings in the job stored as ``job_json`` (None: its spec does not validate)."""
    from pydantic import TypeAdapter

    try:
        spec = job_spec_for(json.loads(job_json), [method])
        config = spec.eviction_config(method, spec.scopes[0], spec.seeds[0])
    except ValueError:  # pydantic's ValidationError included
        return None
    return MappingProxyType(settings_of(method, TypeAdapter(EvictionConfig).dump_python(config, mode="json")))


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), sort_keys=True)


def _label(job_json: str | None, method: str, config: Mapping[str, Any] | None) -> str:
    own = _job_settings(job_json, method) if job_json is not None else None
    if own is None or not isinstance(config, Mapping):
        return method
    mine = settings_of(method, config)
    differ = {k: v for k, v in mine.items() if k not in own or own[k] != v}
    if not differ:
        return method
    return f"{method}[" + ",".join(f"{k}={_value_text(v)}" for k, v in sorted(differ.items())) + "]"


def variant_label(job_config: Mapping[str, Any] | None, method: str, config: Mapping[str, Any] | None) -> str:
    """The label a replay row of ``method`` that ran ``config`` (its stored ``EvictionConfig``) is tabled under, in
    the job stored as ``job_config``: ``method`` for the job's own settings, ``method[key=value,...]`` (sorted keys,
    the row's values) for the settings that differ. See the module docstring for what is compared."""
    return _label(None if job_config is None else _canonical(job_config), method, config)


def base_method(label: str) -> str:
    """The method a label names: ``nexus[head_scores=per_head]`` -> ``nexus``."""
    return label.split("[", 1)[0]


def is_variant(label: str) -> bool:
    return label != base_method(label)


def order_labels(labels: Iterable[str], canonical: Sequence[str] = METHODS) -> list[str]:
    """The distinct ``labels`` in ``canonical``'s method order (unknown methods after, by name), each method's
    plain name first and its variants right after it, sorted."""
    rank = {m: i for i, m in enumerate(canonical)}

    def key(label: str) -> tuple[int, str, bool, str]:
        base = base_method(label)
        return rank.get(base, len(rank)), base, label != base, label

    return sorted(set(labels), key=key)


def load_job_configs(rows: Sequence[Any]) -> dict[str, Any]:
    """``{job id: Job.config}`` of the jobs of ``rows`` (``db.measure_models.Replay`` rows), read once per job
    through the rows' own session (a job already loaded in it costs no query). ``ValueError`` for rows outside a
    session."""
    if not rows:
        return {}
    from sqlalchemy.exc import NoInspectionAvailable
    from sqlalchemy.orm import object_session
    from sqlalchemy.orm.exc import UnmappedInstanceError

    from db.models import Job

    try:
        session = object_session(rows[0])
    except (UnmappedInstanceError, NoInspectionAvailable):
        session = None
    if session is None:
        raise ValueError("replay rows outside a database session: pass their jobs' configs (job_configs)")
    configs = {}
    for job_id in dict.fromkeys(r.job_id for r in rows):
        job = session.get(Job, job_id)
        if job is not None:
            configs[job_id] = job.config
    return configs


def row_labels(rows: Iterable[Any], job_configs: Mapping[str, Any] | None = None) -> list[str]:
    """:func:`variant_label` of each replay row (``job_id``, ``method``, ``config``), in order. ``job_configs``:
    ``{job id: Job.config}``; default: read from the rows' session (:func:`load_job_configs`)."""
    rows = list(rows)
    configs = load_job_configs(rows) if job_configs is None else job_configs
    canonical = {job_id: _canonical(c) for job_id, c in configs.items() if c is not None}
    return [_label(canonical.get(r.job_id), r.method, r.config) for r in rows]
