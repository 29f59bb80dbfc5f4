"""The controller's CPU per generated group, stage by stage (issue 44: target <= 1 ms a group).

Pushes B real GroupResult protos (made by the rollout's own conversion, rlfleet.rpc.convert.group_to_proto:
8 samples of ~300 tokens, texts of realistic length, flight-style payload refs or the tokens inline)
through the controller's real per-group and per-step functions, in the order the loop runs them, and
prints microseconds per group for each stage and in all. Nothing runs over the network: gRPC's own
receive and send are not counted, the conversions on both sides of them are.

    PYTHONPATH=$PWD .venv/bin/python -m bench.controller_cost [--groups 512 2048] [--plane flight inline]

Stages marked (info) are not the controller's scoring/training side (protobuf's parse in the stream
thread, the `generated` journal line of the generation thread, a request id per RPC): shown, not summed.

The garbage collector runs inside whichever stage crosses its thresholds: one full (gen-2) collection
of the bench's heap is tens of ms, 20-60 us a group, so the stage it lands in moves when the code
before it allocates differently. The collections a run made are printed; `--no-gc` times the stages
with the collector off (their own Python alone), to tell a stage's change from a collection moving.
"""
from __future__ import annotations

import argparse
import gc
import heapq
import random
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from controller.episodes import split_group
from controller.groups import ScoredGroup
from controller.journal import Journal
from controller.outputs import RunWriter
from controller.sample_builder import SampleBuilder
from controller.sample_lines import group_pieces, step_lines
from controller.staleness import StalenessGate
from controller.step_metrics import step_metrics
from controller.train_parts import assemble_batch, prepare_for_training
from rlfleet import types as t
from rlfleet.config import load_config
from rlfleet.data.prompts import Prompt
from rlfleet.proto.v1 import rollout_pb2
from rlfleet.rpc import convert
from rlfleet.rpc.request_id import new_request_id

SAMPLES = 8
TOKENS = 300  # mean response length; lengths spread over 200-400
WORDS = ("the", "number", "answer", "so", "we", "add", "then", "multiply", "gives", "total", "of", "is",
         "step", "first", "second", "each", "which", "means", "#### 42", "apples", "minus", "twice")


def _text(rng: random.Random, tokens: int) -> str:
    """About 3.7 characters a token, as English text under a BPE tokenizer."""
    return " ".join(rng.choice(WORDS) for _ in range(int(tokens * 0.8)))


def make_groups(count: int, plane: str, seed: int = 0) -> tuple[list[Prompt], list[bytes]]:
    """`count` prompts and their groups as the Generate stream carries them (serialized protos)."""
    rng = random.Random(seed)
    prompts, wire = [], []
    for seq in range(count):
        prompt = Prompt(seq, "Solve: " + _text(rng, 60), list(range(100, 160)), "gsm8k",
                        str(rng.randint(1, 999)), extra_info={"split": "train", "index": seq})
        request_id = new_request_id()
        completions = []
        for i in range(SAMPLES):
            length = rng.randint(TOKENS - 100, TOKENS + 100)
            finish = "length" if length > TOKENS + 90 else "stop"
            if plane == "flight":
                ref = t.PayloadRef("10.0.0.7:7100", request_id, i, length)
                completions.append(t.Completion([], [], finish, 3, text=_text(rng, length),
                                                last_policy_version=4, payload=ref))
            else:
                completions.append(t.Completion([rng.randrange(32000) for _ in range(length)],
                                                [-rng.random() for _ in range(length)], finish, 3,
                                                text=_text(rng, length), last_policy_version=4))
        group = t.GroupResult(request_id, completions,
                              payload_address="10.0.0.7:7100" if plane == "flight" else "")
        prompts.append(prompt)
        wire.append(convert.group_to_proto(group).SerializeToString())
    return prompts, wire


def reward_response(items: list[t.ScoreItem]) -> bytes:
    """What the reward service answers (made here, outside the timed stages)."""
    results = [t.ScoreResult(item.id, float(hash(item.id) % 3) / 2) for item in items]
    return convert.score_results_to_proto(t.ScoredBatch(results)).SerializeToString()


class Clock:
    def __init__(self) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self._last = time.perf_counter_ns()

    def start(self) -> None:
        self._last = time.perf_counter_ns()

    def lap(self, stage: str) -> None:
        now = time.perf_counter_ns()
        self.ns[stage] += now - self._last
        self._last = now


def run_once(prompts: list[Prompt], wire: list[bytes], score_groups: int, step_groups: int,
             run_dir: Path) -> dict[str, int]:
    cfg = load_config()
    builder = SampleBuilder(cfg.algorithm, 512)
    gate = StalenessGate(step_groups, 4)
    journal = Journal(run_dir)
    writer = RunWriter(run_dir, tensorboard=False)
    clock = Clock()
    buffer: list[tuple[int, int, ScoredGroup]] = []
    # The reward service's answers, made before the clock runs
    answers = []
    for first in range(0, len(wire), score_groups):
        items = []
        for seq in range(first, min(first + score_groups, len(wire))):
            g = convert.group_from_proto(rollout_pb2.GroupResult.FromString(wire[seq]))
            items += split_group(prompts[seq], g.completions, g.request_id)[1]
        answers.append(reward_response(items))
    gc.collect()
    clock.start()
    # ---- scoring side: a Score call per `score_groups` groups ----
    for call, first in enumerate(range(0, len(wire), score_groups)):
        seqs = range(first, min(first + score_groups, len(wire)))
        msgs = [rollout_pb2.GroupResult.FromString(wire[seq]) for seq in seqs]
        clock.lap("parse (info)")
        groups = [convert.group_from_proto(m) for m in msgs]
        clock.lap("group_from_proto")
        for seq, g in zip(seqs, groups):
            journal.record("generated", seq=seq, version=min(c.policy_version for c in g.completions),
                           replica="10.0.0.7:7000")
        clock.lap("journal generated (info)")
        split = [split_group(prompts[seq], g.completions, g.request_id) for seq, g in zip(seqs, groups)]
        items = [item for _, to_score in split for item in to_score]
        clock.lap("split_group")
        convert.score_items_to_proto(items).SerializeToString()
        clock.lap("score request")
        new_request_id()
        clock.lap("request id (info)")
        scored_items = iter(convert.score_results_from_proto(
            convert.reward_pb2.ScoreResponse.FromString(answers[call])))
        clock.lap("score response")
        # as GenerationSide._score_batch: the groups, their `scored` lines in one write, then buffered
        scored_groups = []
        for seq, g, (fixed, to_score) in zip(seqs, groups, split):
            results = [r if r is not None else next(scored_items) for r in fixed]
            scored_groups.append(ScoredGroup(seq, prompts[seq], g.completions, results, 1.0, 0.01,
                                             replica="10.0.0.7:7000"))
        journal.record_all("scored", [{"seq": s.seq, "failed": s.failed} for s in scored_groups])
        clock.lap("scored groups + journal")
        # as ScoringSide._score_batch: each group's samples, request bytes and record pieces, ahead
        for scored in scored_groups:
            prepare_for_training(builder, scored)
        clock.lap("prepare for training")
        for scored in scored_groups:
            scored.record_pieces = group_pieces(scored)
        clock.lap("record pieces")
        for scored in scored_groups:
            env_failed = sum(c.failed for c in scored.completions)
            failed_items = scored.failed - env_failed  # noqa: F841 - the loop's counters
            heapq.heappush(buffer, (scored.version, scored.seq, scored))
        clock.lap("scored groups + journal")
    # ---- training side: a step per `step_groups` groups ----
    step = 0
    while buffer:
        step += 1
        version = 4
        batch: list[ScoredGroup] = []
        while buffer and len(batch) < step_groups:
            _, _, group = heapq.heappop(buffer)
            usable = len(group.scored()) >= 2
            if gate.is_fresh(group.version, version) and usable and builder.keep(group):
                batch.append(group)
        clock.lap("take batch")
        train_batch, sample_metrics = assemble_batch(builder, step, batch, 1.0, version)
        samples = train_batch.samples
        clock.lap("assemble batch")
        convert.train_request_wire(train_batch, train_batch.sample_wire)
        clock.lap("train request")
        journal.record_all("trained", [{"seq": g.seq, "step": step, "version": version,
                                        "generation_version": g.version} for g in batch])
        clock.lap("journal trained")
        metrics = step_metrics(step, version, batch, samples, {"actor/pg_loss": 0.1}, dropped=Counter(),
                               wait_s=0.1, train_s=1.0, sync_s=0.1, step_s=1.2)
        metrics.update(sample_metrics)
        clock.lap("step_metrics")
        writer.write_sample_lines(step_lines(step, version, batch, None))
        clock.lap("samples file")
    journal.close()
    writer.close()
    return dict(clock.ns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--plane", nargs="+", default=["flight", "inline"], choices=["flight", "inline"])
    parser.add_argument("--score-groups", type=int, default=8, help="groups per Score call")
    parser.add_argument("--step-groups", type=int, default=64, help="groups per training step")
    parser.add_argument("--repeats", type=int, default=3, help="the fastest of this many runs is shown")
    parser.add_argument("--no-gc", action="store_true", help="time the stages with the collector off")
    args = parser.parse_args()
    if args.no_gc:
        gc.disable()
    for plane in args.plane:
        for count in args.groups:
            prompts, wire = make_groups(count, plane)
            best: dict[str, int] = {}
            for _ in range(args.repeats):
                before = [s["collections"] for s in gc.get_stats()]
                with tempfile.TemporaryDirectory() as tmp:
                    ns = run_once(prompts, wire, args.score_groups, args.step_groups, Path(tmp))
                collections = [s["collections"] - b for s, b in zip(gc.get_stats(), before)]
                for stage, value in ns.items():
                    best[stage] = min(best.get(stage, value), value)
            total = sum(v for k, v in best.items() if not k.endswith("(info)"))
            print(f"\n{plane}, B = {count} groups of {SAMPLES} (us per group, fastest of {args.repeats})")
            for stage, value in best.items():
                print(f"  {stage:28s} {value / count / 1e3:8.1f}")
            print(f"  {'total (scoring + training)':28s} {total / count / 1e3:8.1f}")
            print(f"  gc collections a run, by generation: {collections}"
                  + (" (collector off; gc.collect() before each run)" if args.no_gc else ""))


if __name__ == "__main__":
    main()
