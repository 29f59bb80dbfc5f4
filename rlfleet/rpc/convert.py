"""proto <-> rlfleet.types. Nothing else in a servicer knows both worlds."""
from __future__ import annotations

import json

from rlfleet import types as t
from rlfleet.errors import InvalidRequest
from rlfleet.proto.v1 import common_pb2, learner_pb2, reward_pb2, rollout_pb2


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


def generate_request_to_proto(prompts: list[t.PromptRequest],
                              params: t.SamplingParams) -> rollout_pb2.GenerateRequest:
    return rollout_pb2.GenerateRequest(
        prompts=[rollout_pb2.PromptInput(request_id=p.request_id, prompt_ids=p.prompt_ids) for p in prompts],
        params=sampling_to_proto(params))


def prompts_from_proto(msg: rollout_pb2.GenerateRequest) -> list[t.PromptRequest]:
    return [t.PromptRequest(request_id=p.request_id, prompt_ids=list(p.prompt_ids)) for p in msg.prompts]


def completion_to_proto(c: t.Completion) -> common_pb2.Completion:
    return common_pb2.Completion(token_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason,
                                 policy_version=c.policy_version, text=c.text,
                                 last_policy_version=max(c.last_policy_version, c.policy_version))


def completion_from_proto(msg: common_pb2.Completion) -> t.Completion:
    return t.Completion(token_ids=list(msg.token_ids), logprobs=list(msg.logprobs),
                        finish_reason=msg.finish_reason, policy_version=msg.policy_version, text=msg.text,
                        last_policy_version=msg.last_policy_version)


def group_to_proto(g: t.GroupResult) -> rollout_pb2.GroupResult:
    return rollout_pb2.GroupResult(request_id=g.request_id,
                                   completions=[completion_to_proto(c) for c in g.completions])


def group_from_proto(msg: rollout_pb2.GroupResult) -> t.GroupResult:
    return t.GroupResult(request_id=msg.request_id,
                         completions=[completion_from_proto(c) for c in msg.completions])


def score_items_to_proto(items: list[t.ScoreItem]) -> reward_pb2.ScoreRequest:
    return reward_pb2.ScoreRequest(items=[
        reward_pb2.ScoreItem(id=i.id, data_source=i.data_source, prompt=i.prompt, response=i.response,
                             ground_truth=i.ground_truth,
                             extra_info_json=json.dumps(i.extra_info) if i.extra_info else "",
                             finish_reason=i.finish_reason)
        for i in items])


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
    return t.ScoredBatch([t.ScoreResult(id=r.id, score=r.score, ok=r.ok, error=r.error,
                                        components=dict(r.components)) for r in msg.results],
                         dict(msg.source_metrics))


def train_batch_to_proto(b: t.TrainBatch) -> learner_pb2.TrainRequest:
    return learner_pb2.TrainRequest(
        step=b.step, temperature=b.temperature,
        expected_version=b.expected_version if b.expected_version >= 0 else None,
        samples=[learner_pb2.TrainSample(prompt_ids=s.prompt_ids, response_ids=s.response_ids,
                                         behaviour_logprobs=s.behaviour_logprobs, advantage=s.advantage,
                                         generation_version=s.generation_version, reward=s.reward)
                 for s in b.samples])


def train_batch_from_proto(msg: learner_pb2.TrainRequest) -> t.TrainBatch:
    return t.TrainBatch(
        step=msg.step, temperature=msg.temperature or 1.0,
        expected_version=msg.expected_version if msg.HasField("expected_version") else -1,
        samples=[t.TrainSample(prompt_ids=list(s.prompt_ids), response_ids=list(s.response_ids),
                               behaviour_logprobs=list(s.behaviour_logprobs), advantage=s.advantage,
                               generation_version=s.generation_version, reward=s.reward)
                 for s in msg.samples])


def status_to_proto(s: t.ServiceStatus) -> common_pb2.ServiceStatus:
    return common_pb2.ServiceStatus(role=s.role, ready=s.ready, policy_version=s.policy_version,
                                    in_flight=s.in_flight, last_error=s.last_error, stats=s.stats,
                                    metrics_port=s.metrics_port, placement=s.placement)


def status_from_proto(msg: common_pb2.ServiceStatus) -> t.ServiceStatus:
    return t.ServiceStatus(role=msg.role, ready=msg.ready, policy_version=msg.policy_version,
                           in_flight=msg.in_flight, last_error=msg.last_error, stats=dict(msg.stats),
                           metrics_port=msg.metrics_port, placement=msg.placement)
