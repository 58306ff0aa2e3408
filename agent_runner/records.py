"""What one episode leaves behind: messages, per-turn telemetry, and the episode result.

These are plain pydantic models so the service can store them whole (``model_dump(mode="json")``) and the
CLI can print them. Backends fill a :class:`Completion` per model call; the agent loop wraps it in a
:class:`TurnRecord` with the parsed action and the observation; :func:`agent_runner.episode.run_episode`
returns an :class:`EpisodeResult` with the patch and the grade.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from agent_runner.parsing import ParsedAction
from agent_runner.status import AGENT_EXITS, INFRA_FAILURE
from env.grading import GradeResult
from env.sandbox.tools import ToolCall

Role = Literal["system", "user", "assistant"]

# How an agent run ended: an agent exit or infra_failure (the words are agent_runner.status's; grading
# statuses come from grading.GradeResult). Built from those words, so a new exit is named once.
ExitStatus = Literal[tuple(sorted(AGENT_EXITS | {INFRA_FAILURE}))]


class Message(BaseModel):
    """One chat message. Messages are never edited after they are sent: a stateful backend (the hf one
    under true eviction) relies on the conversation only ever growing at the end."""

    model_config = ConfigDict(frozen=True)

    role: Role
    content: str


class LayerStats(BaseModel):
    """A per-layer quantity (e.g. physical cache slots) summarised over the model's layers."""

    min: float
    mean: float
    max: float

    @classmethod
    def of(cls, values: list[float] | list[int]) -> LayerStats:
        """Summarise one value per layer; ``values`` must be non-empty."""
        if not values:
            raise ValueError("LayerStats.of needs at least one per-layer value")
        return cls(min=min(values), mean=sum(values) / len(values), max=max(values))


class TurnTokens(BaseModel):
    """One turn's token stream as a backend fed and sampled it (hf): this turn's context is the previous
    stream's first ``keep`` tokens + ``append``; ``generated`` are the sampled tokens, the stop token included.
    Counterfactual replay (``measure.counterfactual``) feeds exactly this stream."""

    keep: int = Field(ge=0)
    append: list[int]
    generated: list[int]


#: how ``ForcedPrefix`` forced a stored turn (``agent_runner.backends.forced_prefix``)
ForcedFrom = Literal["ids", "text", "stepped"]


class CompletionInfo(BaseModel):
    """What only some backends report about one model call; ``None`` where the backend reports nothing.

    ``budget``: the hf backend's cache budget (layer 0's, tokens per head) this turn; ``forced_agreed``: hf, a
    turn forced by its token ids: how many of them the generator's own draw chose too (``TurnDecoder.agreed``);
    ``forced_from``: a turn ``ForcedPrefix`` forced, and how; ``attempts``, ``server_model``, ``request_id``: the
    openai backend's HTTP requests for this call (retries included), and the model and reply id the server named.
    Stored with the turn as ``turns.extra["info"]`` (``results.turn_data.TurnExtra``).
    """

    budget: int | None = None
    forced_agreed: int | None = None
    forced_from: ForcedFrom | None = None
    attempts: int | None = None
    server_model: str | None = None
    request_id: str | None = None


class Completion(BaseModel):
    """One model call's text and telemetry, as reported by a backend.

    Token counts are in the backend's tokenizer. ``logical_length`` is the length of the whole token
    stream the model has seen after this call (prompt + generated); ``physical_before/after`` are cache
    slots held per layer just before and after this turn's eviction (``None`` for backends without a
    visible cache, e.g. an HTTP endpoint). The KV memory figures (``nexus.memory``; ``None`` without a
    visible cache): ``kv_held_bytes`` (valid (layer, row, KV head, position) entries x (D_k + D_v) x element
    size) and ``kv_allocated_bytes`` (the K/V buffers, spare capacity and ragged padding included) after the
    turn; ``kv_peak_held_bytes`` and ``kv_peak_allocated_bytes`` the largest of each during the turn, from
    before its prefill to its end (the prefill's pre-eviction state included). Fields a backend cannot
    measure stay at their defaults.
    Every field is stored with the turn (``workers.stored_records.turn_row``). ``info`` holds what only some backends
    report (the hf backend's budget, an endpoint's request id), typed; ``extra`` is free-form, for a backend's
    own keys that nothing here reads (none today): a key that names an ``info`` field is refused there.
    """

    text: str
    tokens_appended: int = 0  # tokens newly fed to the model this turn (not present in the previous stream)
    tokens_generated: int = 0
    prompt_tokens: int = 0  # length of the prompt this call conditioned on (logical)
    logical_length: int = 0
    physical_before: LayerStats | None = None
    physical_after: LayerStats | None = None
    eviction_events: int = 0
    kv_held_bytes: int | None = None
    kv_allocated_bytes: int | None = None
    kv_peak_held_bytes: int | None = None
    kv_peak_allocated_bytes: int | None = None
    prefill_s: float = 0.0
    decode_s: float = 0.0
    tokens_per_s: float | None = None
    finish_reason: str | None = None  # "stop" (end of turn) | "length" (hit max_new_tokens) | backend's own
    tokens: TurnTokens | None = None  # the token stream (hf backend); None for backends that see only text
    context_full: bool = False  # the prompt alone filled the context window: nothing was fed or generated
    history_mismatch: bool = False  # the last assistant message was not the backend's own text (true_eviction)
    batch_rows: float | None = None  # episodes decoded together per forward this turn, on average (engine)
    forced: bool = False  # teacher-forced from a stored attempt's turn (``rerun --from-turn``), not sampled
    info: CompletionInfo = Field(default_factory=CompletionInfo)
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("extra")
    @classmethod
    def _nothing_known_in_extra(cls, extra: dict[str, Any]) -> dict[str, Any]:
        known = sorted(set(extra) & set(CompletionInfo.model_fields))
        if known:
            raise ValueError(f"Completion.extra is for keys nothing reads; set {known} on Completion.info")
        return extra


#: what the operator chose for a turn's action in an interactive rerun (``workers.interactive``)
OperatorChoice = Literal["continue", "edit", "skip", "stop"]


class ShellSession(BaseModel):
    """One shell the operator opened in the episode's container during a turn (``h``): its terminal transcript
    (each command as typed and echoed, with its output), bounded: ``cut`` characters were left out of its middle."""

    transcript: str
    cut: int = 0  # characters left out of the middle of a longer transcript
    seconds: float = 0.0
    exit_code: int | None = None


class OperatorAct(BaseModel):
    """What the operator did at one turn of an interactive rerun (stored as ``turns.extra["operator"]``).

    ``choice``: ``continue`` (the model's action ran), ``edit`` (a replacement ran instead), ``skip`` (nothing ran;
    the model was told so) or ``stop`` (the repository was submitted as it was). ``proposed``: the model's own
    action when the operator replaced or skipped it. ``forced``: a forced turn (``--from-turn``) that repeated the
    source attempt's act. ``shells``: the shells opened in the container before the choice.
    """

    choice: OperatorChoice = "continue"
    proposed: ToolCall | None = None
    forced: bool = False
    shells: list[ShellSession] = Field(default_factory=list)

    @property
    def steers(self) -> bool:
        """The operator changed what the agent saw or what the container holds: anything but a plain continue
        (a shell counts: nothing proves it changed nothing)."""
        return self.choice != "continue" or bool(self.shells)


#: the observation of a turn whose action the operator skipped: nothing ran in the container
SKIPPED_OBSERVATION = "[the operator skipped this action: it was not run, nothing was executed]"


@dataclass(frozen=True)
class Intervention:
    """An operator's answer to one turn (``workers.interactive``), what ``agent_runner.agent.Intervene`` may
    return: ``act`` is stored with the turn (``TurnRecord.operator``); ``action`` runs instead of the model's (edit,
    stop), or None: the model's own runs (``continue``) or, for ``act.choice == "skip"``, nothing runs and the
    observation is :data:`SKIPPED_OBSERVATION`."""

    act: OperatorAct
    action: ParsedAction | None = None


class TurnRecord(BaseModel):
    """One turn: a completion, what the parser made of it, and what the environment answered.

    ``observation`` is the tool's text (or the no-function-call reminder) without the "Steps Remaining"
    suffix; ``user_message`` is exactly what was sent back to the model (observation + suffix), or
    ``None`` on the final turn when nothing more was sent.
    """

    index: int  # 0-based
    completion: Completion
    thought: str
    action: ToolCall | None
    parse_error: str | None = None
    format_error: bool = False  # no usable function call in the completion
    intervened: bool = False  # the caller's intervene hook replaced (or skipped) the parsed action
    operator: OperatorAct | None = None  # what the operator did at this turn (interactive rerun), else None
    observation: str
    user_message: str | None = None
    submitted: bool = False
    env_s: float = 0.0
    model_s: float = 0.0  # wall time of model.complete as seen by the loop
    steps_remaining: int = 0  # the soft budget left after this turn (may go negative)

    @property
    def raw(self) -> str:
        """The raw completion text exactly as the model produced it."""
        return self.completion.text

    @property
    def steered(self) -> bool:
        """An operator changed this turn (replaced or skipped its action, stopped, opened a shell): the attempt
        is ``steered`` (``db.claims.record_turn``)."""
        return self.intervened or (self.operator is not None and self.operator.steers)


class EpisodeTotals(BaseModel):
    """Sums over the turns of an episode."""

    turns: int = 0
    tokens_generated: int = 0
    tokens_appended: int = 0
    eviction_events: int = 0
    format_errors: int = 0
    max_logical_length: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    model_s: float = 0.0
    env_s: float = 0.0

    @classmethod
    def of(cls, turns: list[TurnRecord]) -> EpisodeTotals:
        return cls(
            turns=len(turns),
            tokens_generated=sum(t.completion.tokens_generated for t in turns),
            tokens_appended=sum(t.completion.tokens_appended for t in turns),
            eviction_events=sum(t.completion.eviction_events for t in turns),
            format_errors=sum(1 for t in turns if t.format_error),
            max_logical_length=max((t.completion.logical_length for t in turns), default=0),
            prefill_s=sum(t.completion.prefill_s for t in turns),
            decode_s=sum(t.completion.decode_s for t in turns),
            model_s=sum(t.model_s for t in turns),
            env_s=sum(t.env_s for t in turns),
        )


class ScaffoldRecord(BaseModel):
    """Which prompts an episode sent (``agent_runner.scaffold.Scaffold.record``): ours or R2E-Gym's own."""

    name: Literal["nexus", "r2egym"]
    label: str  # "nexus" | "r2egym (from <the YAML's path>)"
    prompts: str | None = None  # the R2E-Gym YAML that was read
    sources: dict[str, str] = Field(default_factory=dict)  # per text: the file it came from, or "nexus (<why>)"
    templates_sha256: str  # every text the scaffold can send, before filling: equal digests, equal scaffold
    sent_sha256: str  # the system message and the first user message as sent


class EpisodeResult(BaseModel):
    """The outcome of one episode.

    ``exit_status`` is how the agent loop ended; ``grade`` is grading's ``GradeResult`` (its ``log`` is what
    ``env.grading.regrade`` needs), ``None`` when not graded.
    ``status`` is the one word the service reports: the grade's status when graded, else the exit status.
    ``error`` says why, for every exit but ``submitted``; ``grade_error`` is set when grading itself raised.
    ``retention`` is the final cache's retention map (see ``nexus.retention``) for backends that keep a cache.
    """

    task_id: str
    exit_status: ExitStatus
    error: str | None = None
    patch: str | None = None  # None when the diff could not be taken (e.g. the container died)
    grade: GradeResult | None = None
    grade_error: str | None = None
    turns: list[TurnRecord] = Field(default_factory=list)
    messages: list[Message] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)  # e.g. setup_s, agent_s, diff_s, grade_s, total_s
    totals: EpisodeTotals = Field(default_factory=EpisodeTotals)
    scaffold: ScaffoldRecord | None = None  # None when no agent ran (e.g. the sandbox did not open)
    # the final cache's retention map (nexus.retention: {"logical_length", "kv_heads", "layers": runs}), read
    # from the backend when the loop ended; None for backends without a cache (oracle, openai)
    retention: dict[str, Any] | None = None
    # the exception behind an infra_failure or an unexpected end (never stored): callers tell a time limit
    # raised into the loop (in the model, a tool or a hook) from a crash by its type, not by reading ``error``
    _exception: BaseException | None = PrivateAttr(None)

    @property
    def exception(self) -> BaseException | None:
        return self._exception

    @exception.setter
    def exception(self, exc: BaseException | None) -> None:
        self._exception = exc

    @property
    def status(self) -> str:
        return self.grade.status if self.grade is not None else self.exit_status
