"""proto <-> rlfleet.types. Nothing else in a servicer knows both worlds."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from itertools import chain
from typing import TYPE_CHECKING

from rlfleet import types as t
from rlfleet.errors import InvalidRequest
from rlfleet.proto.v1 import common_pb2, learner_pb2, reward_pb2, rollout_pb2

if TYPE_CHECKING:  # numpy is imported where the learner's Train path needs it: the reward service
    import numpy as np  # (which shares this module) imports no numpy (tests/e2e/test_role_imports.py)

_new = object.__new__  # frozen dataclasses made on hot paths without their __init__ (issue 44)


def sampling_to_proto(p: t.SamplingParams) -> common_pb2.SamplingParams:
    msg = common_pb2.SamplingParams(n=p.n, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
                                    max_new_tokens=p.max_new_tokens, stop=list(p.stop))
    if p.seed is not None:
        msg.seed = p.seed
    return msg


def sampling_from_proto(msg: common_pb2.SamplingParams) -> t.SamplingParams:
    return t.SamplingParams(
        n=msg.n or 1, temperature=msg.temperature, top_p=msg.top_p or 1.0, top_k=msg.top_k,
        max_new_tokens=msg.max_new_tokens, stop=tuple(msg.stop),
        seed=msg.seed if msg.HasField("seed") else None)


def row_to_proto(row: t.DataRow) -> rollout_pb2.DataRow:
    return rollout_pb2.DataRow(data_source=row.data_source, prompt=row.prompt, ground_truth=row.ground_truth,
                               extra_info_json=json.dumps(row.extra_info) if row.extra_info else "")


def row_from_proto(msg: rollout_pb2.DataRow, request_id: str) -> t.DataRow:
    return t.DataRow(data_source=msg.data_source, prompt=msg.prompt, ground_truth=msg.ground_truth,
                     extra_info=json_object(msg.extra_info_json,
                                            f"prompt {request_id!r}: row.extra_info_json"))


def json_object(text: str, what: str) -> dict:
    """A JSON object from `text` ("" is {}); InvalidRequest naming `what` otherwise."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be a JSON object")
    return value


def generate_request_to_proto(prompts: list[t.PromptRequest], params: t.SamplingParams,
                              payload_sink: str = "") -> rollout_pb2.GenerateRequest:
    return rollout_pb2.GenerateRequest(payload_sink=payload_sink,
        prompts=[rollout_pb2.PromptInput(request_id=p.request_id, prompt_ids=p.prompt_ids,
                                         row=row_to_proto(p.row) if p.row is not None else None)
                 for p in prompts],
        params=sampling_to_proto(params))


def prompts_from_proto(msg: rollout_pb2.GenerateRequest) -> list[t.PromptRequest]:
    return [t.PromptRequest(request_id=p.request_id, prompt_ids=list(p.prompt_ids),
                            row=row_from_proto(p.row, p.request_id) if p.HasField("row") else None)
            for p in msg.prompts]


def turn_to_proto(r: t.TurnRecord) -> common_pb2.TurnRecord:
    return common_pb2.TurnRecord(
        generated_tokens=r.generated_tokens, observed_tokens=r.observed_tokens,
        policy_version=r.policy_version, last_policy_version=r.last_policy_version, tool_calls=r.tool_calls,
        tool_errors=r.tool_errors, env_latency_s=r.env_latency_s, text=r.text, observation=r.observation,
        reward=r.reward, finish_reason=r.finish_reason)


def turn_from_proto(msg: common_pb2.TurnRecord) -> t.TurnRecord:
    return t.TurnRecord(
        generated_tokens=msg.generated_tokens, observed_tokens=msg.observed_tokens,
        policy_version=msg.policy_version, last_policy_version=msg.last_policy_version,
        tool_calls=msg.tool_calls, tool_errors=msg.tool_errors, env_latency_s=msg.env_latency_s,
        text=msg.text, observation=msg.observation, reward=msg.reward if msg.HasField("reward") else None,
        finish_reason=msg.finish_reason)


def completion_to_proto(c: t.Completion) -> common_pb2.Completion:
    return common_pb2.Completion(token_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason,
                                 policy_version=c.policy_version, text=c.text,
                                 last_policy_version=max(c.last_policy_version, c.policy_version),
                                 loss_mask=c.loss_mask or [], turns=[turn_to_proto(r) for r in c.turns],
                                 env_reward=c.env_reward, env_failure=c.env_failure, env_error=c.env_error,
                                 opening_tokens=c.opening_tokens, prompt_trim=c.prompt_trim,
                                 env_metrics=c.env_metrics,
                                 response_length=c.payload.length if c.payload is not None else 0)


def completion_from_proto(msg: common_pb2.Completion, payload: t.PayloadRef | None = None) -> t.Completion:
    """`payload`: where its tokens wait on the data plane (group_from_proto)."""
    # The token payloads stay the message's own (read-only) sequences: the controller only passes them
    # on to the learner's TrainRequest, which copies them in C; turning each into a Python list and
    # back cost ~90 us per 300-token sample, a third of the controller's CPU per group (issue 34).
    # Made without the frozen __init__, its __dict__ filled from one literal in one pass: ~2.3 us of a
    # sample's ~4.5 us that way; t.assemble's field check was another ~0.3 us (issue 44). Every field
    # is named here (tests/unit/test_convert_hot_paths.py checks none falls back to the class).
    completion = _new(t.Completion)
    completion.__dict__.update({
        "token_ids": msg.token_ids, "logprobs": msg.logprobs, "finish_reason": msg.finish_reason,
        "policy_version": msg.policy_version, "text": msg.text,
        "last_policy_version": msg.last_policy_version,
        "loss_mask": list(msg.loss_mask) if msg.loss_mask else None,
        "turns": tuple(turn_from_proto(r) for r in msg.turns) if msg.turns else (),
        "env_reward": msg.env_reward if msg.HasField("env_reward") else None,
        "env_failure": msg.env_failure, "env_error": msg.env_error,
        "opening_tokens": msg.opening_tokens, "prompt_trim": msg.prompt_trim,
        "env_metrics": dict(msg.env_metrics) if msg.env_metrics else {}, "payload": payload})
    return completion


def group_to_proto(g: t.GroupResult) -> rollout_pb2.GroupResult:
    return rollout_pb2.GroupResult(request_id=g.request_id, payload_address=g.payload_address,
                                   completions=[completion_to_proto(c) for c in g.completions])


def group_from_proto(msg: rollout_pb2.GroupResult) -> t.GroupResult:
    # Each Completion made once, with its payload (a dataclasses.replace after it doubled the cost of a
    # flight group: 157 -> ~75 us for 16 samples, issue 44)
    if msg.payload_address:  # the data plane holds the ids and log-probs: each sample says where
        address, request_id = msg.payload_address, msg.request_id
        # PayloadRef by its own __init__: filling its __dict__ instead (~0.35 us against ~0.6) gives
        # each one a dict object of its own, and the extra objects cost more in the collector's
        # passes than they saved (bench/controller_cost.py: a gen-2 collection more a run, issue 44)
        completions = [completion_from_proto(m, t.PayloadRef(address, request_id, i, m.response_length))
                       for i, m in enumerate(msg.completions)]
    else:
        completions = [completion_from_proto(m) for m in msg.completions]
    return t.GroupResult(request_id=msg.request_id, completions=completions,
                         payload_address=msg.payload_address)


def score_items_to_proto(items: list[t.ScoreItem]) -> reward_pb2.ScoreRequest:
    request = reward_pb2.ScoreRequest()
    add = request.items.add  # built in place, not made apart and copied in
    extra_json = ""
    extra = None
    for i in items:
        if i.extra_info is not extra:  # a group's items share their prompt's extra_info: encoded once
            extra = i.extra_info
            extra_json = json.dumps(extra) if extra else ""
        add(id=i.id, data_source=i.data_source, prompt=i.prompt, response=i.response,
            ground_truth=i.ground_truth, extra_info_json=extra_json, finish_reason=i.finish_reason)
    return request


def score_items_from_proto(msg: reward_pb2.ScoreRequest) -> list[t.ScoreItem]:
    items = []
    for item in msg.items:
        try:
            extra = json.loads(item.extra_info_json) if item.extra_info_json else {}
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"item {item.id!r}: extra_info_json is not JSON: {exc}") from None
        if not isinstance(extra, dict):
            raise InvalidRequest(f"item {item.id!r}: extra_info_json must be a JSON object")
        items.append(t.ScoreItem(id=item.id, data_source=item.data_source, prompt=item.prompt,
                                 response=item.response, ground_truth=item.ground_truth, extra_info=extra,
                                 finish_reason=item.finish_reason))
    return items


def score_results_to_proto(results: list[t.ScoreResult]) -> reward_pb2.ScoreResponse:
    return reward_pb2.ScoreResponse(
        results=[reward_pb2.ScoreResult(id=r.id, score=r.score, ok=r.ok, error=r.error,
                                        components=r.components)
                 for r in results],
        source_metrics=results.source_metrics if isinstance(results, t.ScoredBatch) else {})


def score_results_from_proto(msg: reward_pb2.ScoreResponse) -> t.ScoredBatch:
    # An empty map read as {} without a conversion: 16 items a group, a third of this call's cost. Each
    # result made without the frozen __init__, and without t.assemble's per-object field check
    # (~1.5 -> ~1.0 us an item, issue 44): _RESULT_FIELDS is checked against ScoreResult's at import.
    new = object.__new__
    results = t.ScoredBatch((), dict(msg.source_metrics))
    for r in msg.results:
        components = r.components
        result = new(t.ScoreResult)
        result.__dict__.update(id=r.id, score=r.score, ok=r.ok, error=r.error,
                               components=dict(components) if components else {})
        results.append(result)
    return results


_RESULT_FIELDS = {"id", "score", "ok", "error", "components"}
if {f.name for f in dataclasses.fields(t.ScoreResult)} != _RESULT_FIELDS:  # a new field must be set above
    raise ImportError(f"score_results_from_proto sets {sorted(_RESULT_FIELDS)}, ScoreResult has "
                      f"{sorted(f.name for f in dataclasses.fields(t.ScoreResult))}")


def train_batch_to_proto(b: t.TrainBatch) -> learner_pb2.TrainRequest:
    expected = b.expected_version if b.expected_version >= 0 else None
    request = learner_pb2.TrainRequest(step=b.step, temperature=b.temperature, expected_version=expected)
    _add_train_samples(request, b.samples)
    return request


def _add_train_samples(request: learner_pb2.TrainRequest, samples: list[t.TrainSample]) -> None:
    add = request.samples.add  # built in place: a TrainSample made apart is copied in again (2.4x slower)
    for s in samples:
        # The token fields only where they hold something (on the data plane they are empty): an empty
        # sequence passed in still costs its conversion, a third of a flight sample's (issue 44)
        sample = add(prompt_ids=s.prompt_ids, advantage=s.advantage, generation_version=s.generation_version,
                     reward=s.reward)
        if len(s.response_ids):
            sample.response_ids.extend(s.response_ids)
        if len(s.behaviour_logprobs):
            sample.behaviour_logprobs.extend(s.behaviour_logprobs)
        if s.loss_mask:
            sample.loss_mask.extend(s.loss_mask)
        if s.payload is not None:
            ref, src = sample.payload, s.payload
            ref.address, ref.request_id, ref.sample = src.address, src.request_id, src.sample


def train_samples_wire(samples: list[t.TrainSample]) -> bytes:
    """`samples` as a TrainRequest's wire bytes carry them (its `samples` entries, field 2, nothing else):
    made a group at a time as groups are scored, so a step's request only joins them (train_request_wire;
    issue 44: the whole batch's conversion at once held the GIL against the event loop at each step)."""
    request = learner_pb2.TrainRequest()
    _add_train_samples(request, samples)
    return request.SerializeToString()


def train_request_wire(b: t.TrainBatch, sample_parts: Iterable[bytes]) -> bytes:
    """The serialized TrainRequest of `b` whose samples are `sample_parts` (train_samples_wire of each
    part of `b.samples`, in order): the same bytes as train_batch_to_proto(b).SerializeToString(). A
    message's fields are written in field-number order and a repeated field's entries one after another,
    so step (1), the samples' entries (2), then temperature (3) and expected_version (4) join as they are."""
    expected = b.expected_version if b.expected_version >= 0 else None
    head = learner_pb2.TrainRequest(step=b.step).SerializeToString()
    tail = learner_pb2.TrainRequest(temperature=b.temperature, expected_version=expected).SerializeToString()
    return b"".join((head, *sample_parts, tail))


def train_prompts_from_proto(msg: learner_pb2.TrainRequest) -> tuple[np.ndarray, list[int]]:
    """Every sample's prompt ids, read once into one int32 array, and their bounds (sample i's are
    [starts[i], starts[i + 1])): what validate.train checks with whole-array operations and the data
    plane's samples take views of. A list per sample and a min/max over each cost ~0.3 s at 32k samples."""
    import numpy as np

    samples = msg.samples
    starts = [0]
    for s in samples:
        starts.append(starts[-1] + len(s.prompt_ids))
    ids = np.fromiter(chain.from_iterable(s.prompt_ids for s in samples), np.int32, starts[-1])
    return ids, starts


def _train_sample_from_proto(s: learner_pb2.TrainSample) -> t.TrainSample:
    return t.TrainSample(prompt_ids=list(s.prompt_ids), response_ids=list(s.response_ids),
                         behaviour_logprobs=list(s.behaviour_logprobs), advantage=s.advantage,
                         generation_version=s.generation_version, reward=s.reward,
                         loss_mask=list(s.loss_mask) if s.loss_mask else None,
                         payload=t.PayloadRef(s.payload.address, s.payload.request_id, s.payload.sample)
                         if s.HasField("payload") else None)


def train_batch_from_proto(msg: learner_pb2.TrainRequest,
                           resolved: tuple[list, list] | None = None,
                           prompts: tuple[np.ndarray, list[int]] | None = None) -> t.TrainBatch:
    """`resolved`: per sample, the response ids and behaviour log-probs the data plane holds for it (None
    where it holds none: rlfleet/dataplane/plane.payload_views); such a sample is made once with them,
    its prompt ids a view of `prompts` (train_prompts_from_proto, read here if not given), no payload."""
    views_ids, views_logprobs = resolved if resolved is not None else (None, None)
    if views_ids is not None and prompts is None:
        prompts = train_prompts_from_proto(msg)
    prompt_ids, starts = prompts if views_ids is not None else (None, None)
    samples = []
    for i, s in enumerate(msg.samples):
        response_ids = views_ids[i] if views_ids is not None else None
        if response_ids is None:  # its tokens came with it, or the data plane left it to the learner
            samples.append(_train_sample_from_proto(s))
            continue
        samples.append(t.TrainSample(prompt_ids[starts[i]:starts[i + 1]], response_ids, views_logprobs[i],
                                     s.advantage, s.generation_version, s.reward,
                                     list(s.loss_mask) if s.loss_mask else None))
    return t.TrainBatch(
        step=msg.step, temperature=msg.temperature or 1.0,
        expected_version=msg.expected_version if msg.HasField("expected_version") else -1, samples=samples)


def status_to_proto(s: t.ServiceStatus) -> common_pb2.ServiceStatus:
    return common_pb2.ServiceStatus(role=s.role, ready=s.ready, policy_version=s.policy_version,
                                    in_flight=s.in_flight, last_error=s.last_error, stats=s.stats,
                                    metrics_port=s.metrics_port, placement=s.placement,
                                    payload_sink=s.payload_sink)


def status_from_proto(msg: common_pb2.ServiceStatus) -> t.ServiceStatus:
    return t.ServiceStatus(role=msg.role, ready=msg.ready, policy_version=msg.policy_version,
                           in_flight=msg.in_flight, last_error=msg.last_error, stats=dict(msg.stats),
                           metrics_port=msg.metrics_port, placement=msg.placement,
                           payload_sink=msg.payload_sink)
