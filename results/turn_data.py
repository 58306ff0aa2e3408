"""A stored turn's typed data: the fields of a ``TurnRecord`` and of its ``Completion`` that have no column of
their own in ``turns`` (``db.models.Turn``), stored in its ``extra`` JSON and read back by attribute.

One model, :class:`TurnExtra`, is both ways: ``workers.stored_records.turn_row`` stores
``TurnExtra.of(turn).stored(turn.observation)`` and every reader (the dashboard, ``rerun --interactive``, the text
replay, ``inspect``) parses a row with :meth:`TurnExtra.of_row` (its ``extra`` and its ``observation``). Nothing reads
``turns.extra`` by key.

The message sent back after a turn is its observation plus the step-budget line: stored whole it repeated the
observation (~4 KB a turn), so a ``user_message`` that starts with the row's observation is stored as the rest of it
(``USER_MESSAGE_TAIL``) and read back as observation + rest. Rows stored whole before read as they are.

Rows stored before a field existed read as that field's default; keys no field knows are ignored. Rows stored
before ``Completion.info`` kept the backend's known keys in ``backend`` (the openai reply id as ``id``): they are
read into ``info`` (:meth:`TurnExtra._before_info`), so old and new rows read alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent_runner.records import CompletionInfo, OperatorAct, TurnRecord

#: the keys of ``backend`` that rows stored before ``Completion.info`` used for its fields
#: the stored key holding what ``user_message`` adds after the row's observation (module docstring)
USER_MESSAGE_TAIL = "user_message_after_observation"

_BACKEND_KEYS = {
    "budget": "budget",
    "forced_agreed": "forced_agreed",
    "forced_from": "forced_from",
    "attempts": "attempts",
    "server_model": "server_model",
    "id": "request_id",
}


class TurnExtra(BaseModel):
    """The ``turns.extra`` JSON of one turn: each field is the ``TurnRecord`` / ``Completion`` field of that name
    (``backend`` is ``Completion.extra``, the backend's free-form keys), except ``format_error``, ``None`` on rows
    stored before it was (:meth:`format_error_or` reads those as "no action was parsed")."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    # the TurnRecord's
    parse_error: str | None = None
    format_error: bool | None = None
    intervened: bool = False  # an operator's intervene hook replaced (or skipped) the parsed action
    operator: OperatorAct | None = None  # what the operator did at this turn (interactive rerun); None: nothing
    user_message: str | None = None  # what was sent back (the observation + the step-budget line); None: the last
    submitted: bool = False
    model_s: float = 0.0
    steps_remaining: int = 0
    # the Completion's
    finish_reason: str | None = None
    context_full: bool = False
    history_mismatch: bool = False
    batch_rows: float | None = None
    forced: bool = False
    info: CompletionInfo = Field(default_factory=CompletionInfo)
    backend: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(cls, turn: TurnRecord) -> TurnExtra:
        """The fields of ``turn`` that ``turns`` has no column for."""
        c = turn.completion
        return cls(
            parse_error=turn.parse_error,
            format_error=turn.format_error,
            intervened=turn.intervened,
            operator=turn.operator,
            user_message=turn.user_message,
            submitted=turn.submitted,
            model_s=turn.model_s,
            steps_remaining=turn.steps_remaining,
            finish_reason=c.finish_reason,
            context_full=c.context_full,
            history_mismatch=c.history_mismatch,
            batch_rows=c.batch_rows,
            forced=c.forced,
            info=c.info,
            backend=c.extra,
        )

    def stored(self, observation: str | None) -> dict[str, Any]:
        """The JSON ``turns.extra`` stores beside the row's ``observation``: a ``user_message`` that starts with the
        observation keeps only the rest (module docstring)."""
        dumped = self.model_dump(mode="json")
        if dumped["operator"] is None:  # no operator at this turn (every agent turn): nothing stored
            del dumped["operator"]
        message = self.user_message
        if message is not None and observation and message.startswith(observation):
            dumped["user_message"] = None
            dumped[USER_MESSAGE_TAIL] = message[len(observation) :]
        return dumped

    @classmethod
    def read(cls, extra: Mapping[str, Any] | None, observation: str | None = None) -> TurnExtra:
        """A row's ``turns.extra`` (``None`` or ``{}``: every field at its default) and its ``observation``, typed.
        ``ValueError`` when the stored user message is kept as a tail and ``observation`` is not given."""
        data = dict(extra or {})
        tail = data.pop(USER_MESSAGE_TAIL, None)
        if tail is not None:
            if observation is None:
                raise ValueError("this turn's user message is stored after its observation: read it with of_row")
            data["user_message"] = observation + tail
        return cls.model_validate(data)

    @classmethod
    def of_row(cls, row: Any) -> TurnExtra:
        """:meth:`read` of a ``db.models.Turn`` row, or of a mapping of its columns."""
        if isinstance(row, Mapping):
            return cls.read(row.get("extra"), row.get("observation"))
        return cls.read(row.extra, row.observation)

    @property
    def steered(self) -> bool:
        """An operator changed this turn (``TurnRecord.steered``): replaced or skipped its action, stopped, a shell."""
        return self.intervened or (self.operator is not None and self.operator.steers)

    @property
    def skipped(self) -> bool:
        """The operator skipped this turn's action: nothing ran (the stored action is the model's, not run)."""
        return self.operator is not None and self.operator.choice == "skip"

    @property
    def replaced(self) -> bool:
        """The stored action is the operator's, not the model's (an edit or a stop; rows stored before
        ``operator``: every intervened turn)."""
        return self.intervened and not self.skipped

    def format_error_or(self, action: Mapping[str, Any] | None) -> bool:
        """Whether the turn had no usable call: the stored flag, or for a row stored without it, no action."""
        return self.format_error if self.format_error is not None else action is None

    @model_validator(mode="before")
    @classmethod
    def _before_info(cls, data: Any) -> Any:
        """A row stored before ``Completion.info``: its known keys move from ``backend`` to ``info`` (a value
        that is not of the field's type, e.g. a server's odd reply id, stays in ``backend``)."""
        if not isinstance(data, Mapping) or "info" in data or not isinstance(data.get("backend"), Mapping):
            return data
        backend, info = dict(data["backend"]), {}
        for key, field in _BACKEND_KEYS.items():
            if key in backend and _fits(field, backend[key]):
                info[field] = backend.pop(key)
        return {**data, "info": info, "backend": backend}


def _fits(field: str, value: Any) -> bool:
    try:
        CompletionInfo.model_validate({field: value})
    except ValidationError:
        return False
    return True
