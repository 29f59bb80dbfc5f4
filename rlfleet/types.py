"""Plain values that cross service boundaries.

Cores speak these types; only `rlfleet.rpc.convert` knows their proto twins.
Token payloads are plain lists of ints/floats so cores never depend on protobuf.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    max_new_tokens: int = 16
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class DataRow:
    """The data row a prompt came from: what an environment starts an episode from."""

    data_source: str = ""
    prompt: str = ""  # the rendered prompt text
    ground_truth: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PromptRequest:
    """One prompt to sample a group of `n` completions for (each an episode, with an environment)."""

    request_id: str
    prompt_ids: list[int]
    row: DataRow | None = None


@dataclass(frozen=True)
class TurnRecord:
    """One model turn of a multi-turn episode and the observation that followed it."""

    generated_tokens: int
    observed_tokens: int
    policy_version: int  # the oldest version that generated a token of this turn
    last_policy_version: int
    tool_calls: int = 0
    tool_errors: int = 0
    env_latency_s: float = 0.0
    text: str = ""
    observation: str = ""
    reward: float | None = None
    finish_reason: str = "stop"


@dataclass(frozen=True)
class PayloadRef:
    """Where one sample's token payload waits on the data plane: a replica's Flight address, its group's
    request id, its index in the group (rlfleet/dataplane)."""

    address: str
    request_id: str
    sample: int
    length: int = 0  # its token count (the controller's figures; the learner counts what it fetched)


@dataclass(frozen=True)
class Completion:
    # Lists where an engine made them; received over gRPC, the message's own sequences (read-only
    # by convention: rlfleet.rpc.convert.completion_from_proto)
    token_ids: list[int]
    logprobs: list[float]  # log-prob of each sampled token under the sampling distribution
    finish_reason: str  # "stop" (eos or stop string) or "length"
    policy_version: int  # the oldest version that generated any of its tokens
    text: str = ""
    last_policy_version: int = -1  # the newest one; -1 means the same as policy_version
    # Multi-turn episodes: token_ids/logprobs then hold the model's turns and the observations between
    # them (logprob 0); loss_mask marks the model's tokens (None: all are, one turn).
    loss_mask: list[int] | None = None
    turns: tuple[TurnRecord, ...] = ()
    env_reward: float | None = None  # the environment's reward (its last), if it gave one
    env_failure: str = ""  # why the episode failed, by cause (unavailable, timeout, invalid_reply, …)
    env_error: str = ""  # the failure in words, naming the episode
    opening_tokens: int = 0  # observation tokens before the first turn
    # Prompt tokens the episode's context dropped from the prompt's end (its generation prompt, which an
    # opening observation re-adds after itself): the context is prompt_ids[:len - prompt_trim] + token_ids.
    prompt_trim: int = 0
    env_metrics: dict[str, float] = field(default_factory=dict)  # the environment's metrics, episode means
    # controller.data_plane=flight: token_ids and logprobs stay on the replica (rlfleet/dataplane) and are
    # empty here; `payload` says where they are and how many tokens they hold.
    payload: PayloadRef | None = None

    @property
    def response_tokens(self) -> int:
        """The response's token count, wherever its ids are."""
        return self.payload.length if self.payload is not None else len(self.token_ids)

    @property
    def failed(self) -> bool:
        """An episode whose environment failed: it has no reward and is left out of training."""
        return bool(self.env_failure)

    @property
    def final_text(self) -> str:
        """What the reward service scores: the model's last turn (the whole text for one turn)."""
        return self.turns[-1].text if self.turns else self.text


@dataclass(frozen=True)
class GroupResult:
    request_id: str
    completions: list[Completion]
    payload_address: str = ""  # data plane: the replica's Flight address holding the token payloads


@dataclass(frozen=True)
class ScoreItem:
    id: str
    data_source: str
    prompt: str
    response: str
    ground_truth: str
    extra_info: dict[str, Any] = field(default_factory=dict)
    # how the response's generation ended: "stop", "length" (cut at the token budget), or "" (unknown)
    finish_reason: str = ""


@dataclass(frozen=True)
class ScoreResult:
    id: str
    score: float
    ok: bool = True
    error: str = ""
    components: dict[str, float] = field(default_factory=dict)  # per reward source, before weighting


class ScoredBatch(list):
    """The ScoreResults of one Score call, in item order, with what scoring them cost per reward source
    (`<source>/calls`, `<source>/errors`, …: rlfleet.reward_stats), which the reward service's combined
    `reward.sources` report and any other scorer leaves empty."""

    def __init__(self, results=(), source_metrics: dict[str, float] | None = None):
        super().__init__(results)
        self.source_metrics = dict(source_metrics or {})


@dataclass(frozen=True)
class TrainSample:
    prompt_ids: list[int]
    response_ids: list[int]
    behaviour_logprobs: list[float]
    advantage: float
    generation_version: int
    reward: float = 0.0  # the sample's (shaped) reward, for estimators the learner runs (gae, reinforce_pp)
    loss_mask: list[int] | None = None  # per response token, 0: not trained on (an observation); None: all 1
    payload: PayloadRef | None = None  # data plane: response_ids and behaviour_logprobs are fetched from it

    @property
    def response_tokens(self) -> int:
        if self.payload is not None and not self.response_ids:
            return self.payload.length
        return len(self.response_ids)


@dataclass(frozen=True)
class TrainBatch:
    step: int
    samples: list[TrainSample]
    temperature: float = 1.0
    # The learner's version before this step. With it a repeated step returns its stored result instead
    # of training again (services/learner/step_results.py). -1: no check (direct callers; RPC refuses it).
    expected_version: int = -1


@dataclass(frozen=True)
class TrainResult:
    policy_version: int  # version after this optimizer step
    metrics: dict[str, float]
    repeated: bool = False  # a repeat of a step already applied: this is its stored result


@dataclass(frozen=True)
class ServiceStatus:
    role: str
    ready: bool
    policy_version: int = 0
    in_flight: int = 0
    last_error: str = ""
    stats: dict[str, float] = field(default_factory=dict)
    metrics_port: int = 0
    placement: str = ""  # a rollout's: rlfleet.devices.placement()
    payload_sink: str = ""  # a learner's on the data plane: its staging Flight server (host:port)


_FIELD_NAMES: dict[type, frozenset[str]] = {}


def assemble(cls: type[T], values: dict[str, Any]) -> T:
    """An instance of the frozen dataclass `cls` with every field in `values`, made without its generated
    __init__, which sets each field through object.__setattr__ (frozen): a 15-field Completion costs
    ~2.3 us that way against ~0.6 us here, and the controller made several such objects per sample
    (issue 44). For hot paths only; `values` must name every field (checked: a missing one would be
    read from the class, and one with a default_factory has no class value)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = frozenset(f.name for f in fields(cls))
    if values.keys() != names:
        raise TypeError(f"{cls.__name__}: fields {sorted(names ^ values.keys())} missing or unknown")
    obj = object.__new__(cls)
    obj.__dict__.update(values)
    return obj
