"""Learner gRPC servicer: converts and delegates to Learner."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from rlfleet import types as t
from rlfleet.checkpoint_files import DigestChecks
from rlfleet.dataplane.flight import PayloadClient
from rlfleet.dataplane.plane import fetch_columns, payload_refs, payload_views
from rlfleet.dataplane.release import BackgroundReleases
from rlfleet.dataplane.staging import StagingStore, replica_of
from rlfleet.errors import NotReady
from rlfleet.metrics import ServiceMetrics
from rlfleet.proto.v1 import learner_pb2, learner_pb2_grpc
from rlfleet.rpc import convert, validate
from rlfleet.rpc.errors import rpc_method
from rlfleet.rpc.exclusive import Exclusive
from rlfleet.security_config import LimitsConfig
from services.learner.checkpoint import read_meta, resumable_checkpoints

if TYPE_CHECKING:  # imported once the device is known (rlfleet/app/serve.py): a CPU learner keeps Triton out
    from services.learner.learner import Learner

log = structlog.get_logger(__name__)

SERVICE_NAME = learner_pb2.DESCRIPTOR.services_by_name["Learner"].full_name


def _vocab_size(learner: Learner) -> int | None:
    try:
        return int(learner.model.get_input_embeddings().num_embeddings)
    except (AttributeError, TypeError):
        return None


def _by_replica(staged) -> list[tuple[str, list[str]]]:
    """(replica address, request ids) of staged groups (keyed by staging.staged_key)."""
    ids: dict[str, list[str]] = {}
    for key in staged:
        address, rid = replica_of(key)
        ids.setdefault(address, []).append(rid)
    return list(ids.items())


class LearnerServicer(learner_pb2_grpc.LearnerServicer):
    role = "learner"

    def __init__(self, host: str = "127.0.0.1", limits: LimitsConfig | None = None,
                 weight_token: str | None = None, payloads: PayloadClient | None = None,
                 staging: StagingStore | None = None, payload_sink: str = "") -> None:
        """`limits`: the largest requests served (default: LimitsConfig's); `weight_token`: the secret
        the weight group's rendezvous is signed with (security.token; None: unsigned); `payloads`: the
        data plane's client (controller.data_plane=flight), which fetches samples' tokens; `staging`:
        where the replicas push them before Train (served at `payload_sink`, reported by GetStatus)."""
        self.limits = limits or LimitsConfig()
        self.weight_token = weight_token
        self.payloads = payloads
        self.staging, self.payload_sink = staging, payload_sink
        self._unreleased: list[tuple[str, list[str]]] = []  # (replica, groups) trained, not checkpointed
        self._trained_staged: list[str] = []  # the last step's staged groups (kept for its retry)
        self._releases: BackgroundReleases | None = None
        self.metrics = ServiceMetrics.create(self.role)
        self.metrics_port = 0
        self.learner: Learner | None = None
        self.restored_from: Path | None = None
        self.last_error = ""
        self.host = host  # interface the weight-group store binds
        self.weight_ops = Exclusive("learner")  # one push at a time, the others refused at once
        # Each checkpoint's files are read once in this process (rlfleet.checkpoint_files.DigestChecks).
        self.digest_checks = DigestChecks()

    def attach(self, learner: Learner, restored_from: Path | None = None,
               digest_checks: DigestChecks | None = None) -> None:
        """`restored_from`: the checkpoint the learner was loaded from (reported by ListCheckpoints);
        `digest_checks`: the checkpoint verdicts made while loading, reused by ListCheckpoints."""
        self.learner = learner
        self.restored_from = restored_from
        if self.staging is not None:  # groups staged from here on arrive at its version (a restored one's)
            self.staging.advance(learner.version)
        if digest_checks is not None:
            self.digest_checks = digest_checks

    def _ready(self) -> Learner:
        if self.learner is None:
            raise NotReady("learner model is still loading")
        return self.learner

    @rpc_method
    def Train(self, request, context):
        learner = self._ready()
        self.weight_ops.refuse_while_held("Train")
        # controller.data_plane=flight: the ids and log-probs are staged here or fetched from the replicas,
        # each group as columns (rlfleet/dataplane/columns.py) the learner builds its tensors from
        refs = payload_refs(request)
        staged = self.staging.staged(refs.groups()) if self.staging is not None else {}
        fetched, groups = ([], {}) if self.payloads is None else fetch_columns(refs, self.payloads, staged)
        if fetched or staged:
            log.info("data plane resolved", staged=len(staged), fetched=sum(len(ids) for _, ids in fetched),
                     replicas=len(fetched))
        vocab = _vocab_size(learner)
        prompts = convert.train_prompts_from_proto(request)  # read once, for the checks and the samples
        validate.train(request, self.limits, vocab, prompts)
        groups.update((key, group.columns) for key, group in staged.items())
        batch = convert.train_batch_from_proto(request, payload_views(refs, groups, vocab), prompts)
        with self.metrics.queued(len(batch.samples)):
            result = self._ready().train(batch)
        # a learner restarted before its checkpoint replays the batch: the replicas keep their copies
        self._unreleased.extend(fetched + _by_replica(staged))
        if self.staging is not None and not result.repeated:  # the step before leaves the staging store;
            self.staging.release(self._trained_staged)  # this one's stay for a retry of its Train
            self._trained_staged = list(staged)
            expired = self.staging.advance(result.policy_version)  # and what no step can take any more
            if expired:
                log.info("data plane: staged groups no step can train forgotten", groups=expired)
        self.metrics.policy_version.labels(self.role).set(result.policy_version)
        if not result.repeated:  # a repeat trained nothing
            self.metrics.tokens.labels(self.role).inc(result.metrics.get("learner/tokens", 0.0))
        return learner_pb2.TrainResponse(policy_version=result.policy_version, metrics=result.metrics)

    def _release(self) -> None:
        """Groups trained before a checkpoint leave the staging store and their replicas' stores, these
        off the call (rlfleet/dataplane/release.py: a replica gone answers late or not at all)."""
        trained, self._unreleased = self._unreleased, []
        if self.staging is not None:
            self.staging.release(self._trained_staged)
            self._trained_staged = []
        by_address: dict[str, list[str]] = {}
        for address, ids in trained:
            by_address.setdefault(address, []).extend(ids)
        if by_address and self._releases is None:
            self._releases = BackgroundReleases(self.payloads)
        for address, ids in by_address.items():
            self._releases.submit(address, ids)

    @rpc_method
    def OpenWeightGroup(self, request, context):
        learner = self._ready()
        validate.open_weight_group(request, self.limits)
        timeout_s = request.timeout_s or min(120.0, self.limits.max_weight_timeout_s)
        # Not under weight_ops: an Open adds a group of its own and waits for nothing, so a stray
        # one neither replaces the run's group nor makes its push Busy (services/learner/weight_groups.py).
        address, backend = learner.open_weight_group(request.world_size, self.host, timeout_s,
                                                     token=self.weight_token,
                                                     members=list(request.member_placements))
        return learner_pb2.OpenWeightGroupResponse(address=address, backend=backend)

    @rpc_method
    def PushWeights(self, request, context):
        learner = self._ready()
        validate.version(request.version)
        # The push slot is taken once the group's ranks have all arrived (Learner.push_weights): a push
        # whose ranks never come (a stray one, to a group of its own) holds up no other (issue 42).
        stats = learner.push_weights(request.version, digest=request.digest, group=request.group,
                                     exclusive=lambda wait_s: self.weight_ops.hold("PushWeights", wait_s))
        self.metrics.weight_sync_seconds.labels(self.role).observe(stats["seconds"])
        return learner_pb2.PushWeightsResponse(version=request.version, bytes=int(stats.get("bytes", 0)),
                                               seconds=stats["seconds"], digest=stats.get("digest", ""))

    @rpc_method
    def AbortWeightGroup(self, request, context):
        learner = self._ready()
        validate.abort_weight_group(request)
        # Not under weight_ops: it must reach the push that holds it.
        pushing = learner.abort_weight_group(request.group, request.reason)
        return learner_pb2.AbortWeightGroupResponse(pushing=pushing)

    @rpc_method
    def SaveCheckpoint(self, request, context):
        learner = self._ready()
        self.weight_ops.refuse_while_held("SaveCheckpoint")
        validate.version(request.step, "step")
        path = learner.save_checkpoint(request.step)
        if self.payloads is not None:
            self._release()
        return learner_pb2.SaveCheckpointResponse(path=str(path))

    @rpc_method
    def ListCheckpoints(self, request, context):
        learner = self._ready()
        # The newest checkpoint that passes its digests (damaged newer ones left out, with a warning).
        # folders without meta.json were named when the resume was resolved (launcher or learner start)
        found = resumable_checkpoints(learner.checkpoint_dir, known_good=self.restored_from,
                                      checks=self.digest_checks, report_incomplete=False)
        reply = learner_pb2.ListCheckpointsResponse(checkpoints=[
            learner_pb2.CheckpointInfo(step=step, path=str(path)) for step, path in sorted(found.items())])
        if self.restored_from is not None:
            step = int(read_meta(self.restored_from)["step"])
            reply.restored_from.CopyFrom(learner_pb2.CheckpointInfo(step=step, path=str(self.restored_from)))
        return reply

    @rpc_method
    def GetStatus(self, request, context):
        learner = self.learner
        return convert.status_to_proto(t.ServiceStatus(
            role=self.role, ready=learner is not None, policy_version=learner.version if learner else 0,
            in_flight=self.metrics.in_flight_now() - 1, last_error=self.last_error,
            stats={**self.metrics.load_stats(), **({"step": float(learner.step)} if learner else {}),
                   **({"staged_tokens": float(self.staging.tokens)} if self.staging is not None else {})},
            metrics_port=self.metrics_port, payload_sink=self.payload_sink))
