"""A density sweep stored the way workers store one: three jobs (density 0.1, 0.2, 0.5) of snapkv and nexus on
three tasks, dense in the first job only, every attempt written through the real claim / record_turn / finish /
grade API with per-turn cache telemetry that depends on the method and the density.

The numbers are chosen, not measured (what is under test is that compare, its formats, the pages and the
report carry exactly what the episodes stored); :func:`expected_cost` recomputes a cell's cost from the stored
rows independently of ``results.cost``."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import mean

from db import Database, job_rows
from db import store as db_store
from db.models import Episode, Turn
from jobs.spec import JobSpec

TASKS = ["t1", "t2", "t3"]
DENSITIES = (0.1, 0.2, 0.5)
METHODS = ("snapkv", "nexus")
LAYERS_BYTES = 4096  # bytes per kept slot, summed over layers (a toy model's)


@dataclass
class Sweep:
    db: Database
    job_ids: list[str]
    episode_ids: dict[tuple[str, str, float | None], str] = field(default_factory=dict)  # (task, method, density)


def _resolved(task: str, method: str, density: float | None) -> bool:
    """dense resolves all; nexus resolves more as density grows (1, 2, 3 tasks); snapkv one less."""
    if density is None:
        return True
    rank = {0.1: 1, 0.2: 2, 0.5: 3}[density] - (method == "snapkv")
    return TASKS.index(task) < rank


def _turns(task: str, method: str, density: float | None) -> list[dict]:
    """Two or three turns whose kept slots follow the density (dense keeps every token)."""
    n = 2 + TASKS.index(task) % 2
    turns = []
    for i in range(n):
        logical = 400 * (i + 1) + 17 * TASKS.index(task)
        kept = logical if density is None else max(16.0, round(density * logical) + (method == "nexus"))
        turns.append(
            {
                "logical_length": logical,
                "physical_after": {"min": kept - 2, "mean": kept, "max": kept + 2},
                # held after the turn; allocated with a slack's spare slots; the peaks at the prefill, full
                "kv_held_bytes": int(kept * LAYERS_BYTES),
                "kv_allocated_bytes": int((kept + 32) * LAYERS_BYTES),
                "kv_peak_held_bytes": int(logical * LAYERS_BYTES),
                "kv_peak_allocated_bytes": int((logical + 256) * LAYERS_BYTES),
                "tokens_generated": 30 + 5 * i,
                "prompt_tokens": logical - 30 - 5 * i,
                "completion": f"turn {i} of {method}",
            }
        )
    return turns


def _spec(density: float, methods: list[str]) -> JobSpec:
    return JobSpec.from_dict(
        {
            "name": f"sweep d={density}",
            "backend": "oracle",
            "methods": methods,
            "density": density,
            "tasks": {"suite": "sweep"},
            "grade": False,
        }
    )


def store_sweep(db: Database) -> Sweep:
    sweep = Sweep(db, [])
    for i, density in enumerate(DENSITIES):
        methods = (["dense"] if i == 0 else []) + list(METHODS)
        spec = _spec(density, methods)
        with db.session() as s:
            job = job_rows.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash())
            job_rows.add_episodes(s, job.id, spec.episodes(TASKS))
            job_id = job.id
        sweep.job_ids.append(job_id)
        with db.session() as s:
            rows = [(e.id, e.task_id, e.method) for e in db_store.episodes_for_job(s, job_id)]
        for episode_id, task, method in rows:
            d = None if method == "dense" else density
            sweep.episode_ids[(task, method, d)] = episode_id
            _run(db, episode_id, _turns(task, method, d), _resolved(task, method, d), wall_s=10.0 + len(task) + 3 * i)
    return sweep


def _run(db: Database, episode_id: str, turns: list[dict], resolved: bool, *, wall_s: float) -> None:
    with db.session() as s:
        claim = db_store.claim_episode(s, episode_id)
    for index, turn in enumerate(turns):
        with db.session() as s:
            db_store.record_turn(s, claim, index, **turn)
    with db.session() as s:
        db_store.finish_episode(s, claim, "resolved" if resolved else "unresolved", wall_s=wall_s)


def expected_cost(db: Database, episode_ids: list[str]) -> dict[str, float]:
    """A cell's cost recomputed from the stored rows: means over the episodes of each episode's own value."""
    per_episode = []
    with db.session() as s:
        for episode_id in episode_ids:
            e = s.get(Episode, episode_id)
            turns = s.query(Turn).filter(Turn.episode_id == episode_id).all()
            per_episode.append(
                {
                    "kept_fraction": mean(t.physical_after["mean"] / t.logical_length for t in turns),
                    "mean_kv_held_bytes": mean(t.kv_held_bytes for t in turns),
                    "mean_kv_peak_held_bytes": e.kv_peak_held_bytes,
                    "mean_kv_peak_allocated_bytes": e.kv_peak_allocated_bytes,
                    "turns": e.n_turns,
                    "generated_tokens": e.generated_tokens,
                    "wall_s": e.wall_s,
                }
            )
    out = {k: mean(p[k] for p in per_episode) for k in per_episode[0]}
    out["max_kv_peak_allocated_bytes"] = max(p["mean_kv_peak_allocated_bytes"] for p in per_episode)
    return out
