"""A stored episode as the conversation its backend saw: the text a replay renders into another model's stream.

Trajectories of backends that see only text (``expert`` demonstrations, ``oracle``, ``openai``) carry no token
stream; ``replay JOB --model NAME`` renders their messages with NAME's chat template under each protocol
(``agent_runner.chat_stream.render_trajectory``) and teacher-forces that. The conversation is rebuilt from
what the episode stored:

1. the system message and the task's first user message, from the episode's scaffold and task (neither is
   stored as text); checked against the digest the episode stored of what it sent (``ScaffoldRecord``), so a
   prompt changed since the run is an error, never a silently different conversation;
2. per turn: the assistant message (the completion as generated: ``history="raw"``) and the user message that
   answered it (``user_message``: the observation with its step-budget line; none after the last turn).

``TextTrajectoryError`` says why an episode cannot be rebuilt (a steered turn, a resynthesised history, a
prompt that no longer matches); the replay stores it on the row as ``skipped``.
"""

from __future__ import annotations

from sqlalchemy import select

from agent_runner.records import Message
from db import Database
from db import store as db_store
from db.models import Turn
from env.tasks.task_cache import TaskCache
from jobs.episode_config import stored_episode_spec
from results.turn_data import TurnExtra


class TextTrajectoryError(ValueError):
    """The stored episode cannot be rebuilt into the conversation its backend saw (say why)."""


def conversation(db: Database, episode_id: str, tasks: TaskCache | None = None) -> list[Message]:
    """The messages of ``episode_id`` in order: system, the task, then assistant / user pairs (see the module)."""
    with db.session() as s:
        episode = db_store.get_episode(s, episode_id)
        config, result = dict(episode.config or {}), dict(episode.result or {})
        turns = list(s.execute(select(Turn).where(Turn.episode_id == episode_id).order_by(Turn.index)).scalars())
        rows = [(t.index, t.completion or "", TurnExtra.of_row(t)) for t in turns]
    if not rows:
        raise TextTrajectoryError(f"episode {episode_id} has no turns")
    spec = stored_episode_spec(config)
    if spec.agent.history != "raw":
        raise TextTrajectoryError(
            f"episode {episode_id} sent a {spec.agent.history} history: its assistant messages are not the "
            "completions, so the text replay would not be what the model saw"
        )
    scaffold = spec.agent.scaffold()
    task = (tasks or TaskCache()).task(spec)
    head = [scaffold.system_prompt(), scaffold.instance_prompt(task, spec.agent.soft_step_limit)]
    sent = (result.get("scaffold") or {}).get("sent_sha256")
    if sent is not None and scaffold.record(head)["sent_sha256"] != sent:
        raise TextTrajectoryError(
            f"episode {episode_id}: the system and task prompts rebuilt from its config differ from those it sent "
            "(the scaffold or the task changed since the run)"
        )
    messages = [Message(role="system", content=head[0]), Message(role="user", content=head[1])]
    for position, (index, completion, extra) in enumerate(rows):
        if index != position:
            raise TextTrajectoryError(f"episode {episode_id} lacks turn {position}")
        if extra.steered:  # an edit, a skip, a stop or a shell: not the model's own trajectory
            raise TextTrajectoryError(f"episode {episode_id}: turn {index} was steered by an operator")
        messages.append(Message(role="assistant", content=completion))
        reply = extra.user_message
        if reply is None:
            if position != len(rows) - 1:
                raise TextTrajectoryError(f"episode {episode_id}: turn {index} has no reply but is not the last")
            break
        messages.append(Message(role="user", content=reply))
    return messages
