"""`rlfleet reward check ADDRESS`: does a reward server keep the rlfleet.v1.Reward contract?

Each check is one small conversation with the server; the result is PASS, FAIL
(the contract is broken; the detail says how) or N/A (an optional part the
server does not implement). The items sent are GSM8K-style by default; a server
that scores something else takes sample items with `--item '{"data_source": …,
"response": …, "ground_truth": …}'`.
"""
from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from rlfleet.proto.v1 import common_pb2, reward_pb2, reward_pb2_grpc
from rlfleet.app import conformance
from rlfleet.app.conformance import FAIL, NA, PASS, Check, Failed, ServerChecker  # noqa: F401 (re-exported)

REWARD_SERVICE = "rlfleet.v1.Reward"
DEFAULT_ITEMS = [
    {"data_source": "openai/gsm8k", "prompt": "What is 6 * 7?", "response": "6 * 7 = 42\n#### 42",
     "ground_truth": "42"},
    {"data_source": "openai/gsm8k", "prompt": "What is 6 * 7?", "response": "I think it is 41.",
     "ground_truth": "42"},
    {"data_source": "openai/gsm8k", "prompt": "What is 2 + 2?", "response": "no idea", "ground_truth": "4"},
    {"data_source": "openai/gsm8k", "prompt": "Half of 9?", "response": "#### 4.5", "ground_truth": "4.5"},
]


class ContractChecker(ServerChecker):
    SERVICE = REWARD_SERVICE

    def __init__(self, address: str, timeout_s: float = 10.0, samples: list[dict] | None = None):
        super().__init__(address, timeout_s)
        self.samples = samples or DEFAULT_ITEMS
        self.stub = reward_pb2_grpc.RewardStub(self.channel)
        self._ids = 0

    def items(self, count: int, **override: str) -> list[reward_pb2.ScoreItem]:
        out = []
        for k in range(count):
            self._ids += 1
            fields = {"id": f"check-{self._ids}", "prompt": "", "extra_info_json": "",
                      **self.samples[k % len(self.samples)], **override}
            out.append(reward_pb2.ScoreItem(**fields))
        return out

    def score(self, items: list[reward_pb2.ScoreItem],
              timeout_s: float | None = None) -> reward_pb2.ScoreResponse:
        return self.stub.Score(reward_pb2.ScoreRequest(items=items), timeout=timeout_s or self.timeout_s)

    def well_formed(self, items: list[reward_pb2.ScoreItem], reply: reward_pb2.ScoreResponse) -> str:
        results = list(reply.results)
        if len(results) != len(items):
            raise Failed(f"{len(results)} results for {len(items)} items")
        for position, (item, result) in enumerate(zip(items, results)):
            if result.id != item.id:
                raise Failed(f"result {position} has id {result.id!r}, expected {item.id!r}")
            if result.ok and not math.isfinite(result.score):
                raise Failed(f"item {item.id}: ok with non-finite score {result.score}")
            if not result.ok and not result.error:
                raise Failed(f"item {item.id}: ok=false without an error message")
        failed = sum(not r.ok for r in results)
        unscorable = f", {failed} unscorable (ok=false)" if failed else ""
        return f"{len(results)} result{'s' * (len(results) != 1)} in order" + unscorable


    # ---- the checks, in order ------------------------------------------------------------------
    def check_empty(self) -> str:
        reply = self.score([])
        if reply.results:
            raise Failed(f"{len(reply.results)} results for an empty batch")
        return "0 results"

    def check_single(self) -> str:
        items = self.items(1)
        return self.well_formed(items, self.score(items))

    def check_batch_order(self) -> str:
        items = self.items(16)
        return self.well_formed(items, self.score(items))

    def check_batch_equals_singles(self) -> str:
        items = self.items(len(self.samples))
        batch = list(self.score(items).results)
        self.well_formed(items, reward_pb2.ScoreResponse(results=batch))
        for item, together in zip(items, batch):
            alone = self.score([item]).results[0]
            if alone.ok != together.ok or (alone.ok and abs(alone.score - together.score) > 1e-6):
                raise Failed(f"item {item.id}: {alone.ok}/{alone.score} alone, "
                             f"{together.ok}/{together.score} "
                             f"in a batch")
        return f"{len(items)} items score the same alone and batched"

    def check_large_batch(self) -> str:
        items = self.items(256)
        started = time.monotonic()
        detail = self.well_formed(items, self.score(items))
        return f"{detail} in {time.monotonic() - started:.2f}s"

    def check_concurrent(self) -> str:
        batches = [self.items(8) for _ in range(4)]
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(self.score, batches))
        for items, reply in zip(batches, replies):
            self.well_formed(items, reply)
        return "4 concurrent calls answered correctly"

    def check_deadline(self) -> str:
        items = self.items(256)
        try:
            reply = self.score(items, timeout_s=0.001)
            outcome = f"answered within 1 ms ({self.well_formed(items, reply)})"
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Failed(f"a 1 ms deadline ended with {err.code().name}, not DEADLINE_EXCEEDED") from None
            outcome = "DEADLINE_EXCEEDED"
        after = self.items(2)
        self.well_formed(after, self.score(after))
        return f"{outcome}; serves normally afterwards"

    def check_duplicate_ids(self) -> str:
        items = self.items(2)
        items[1].id = items[0].id
        return self.expect_code(lambda: self.score(items), grpc.StatusCode.INVALID_ARGUMENT)

    def check_empty_id(self) -> str:
        return self.expect_code(lambda: self.score(self.items(1, id="")), grpc.StatusCode.INVALID_ARGUMENT)

    def check_bad_extra_info(self) -> str:
        return self.expect_code(lambda: self.score(self.items(1, extra_info_json="{not json")),
                                grpc.StatusCode.INVALID_ARGUMENT)

    def check_recovers(self) -> str:
        items = self.items(3)
        detail = self.well_formed(items, self.score(items))
        return f"{detail}; {self.check_health()}"

    def check_status(self) -> str:
        status = self.optional("GetStatus", lambda: self.stub.GetStatus(common_pb2.GetStatusRequest(),
                                                                         timeout=self.timeout_s))
        if status is NA:
            return NA
        return f"role={status.role or '-'} ready={status.ready}"

    CHECKS = (
        ("health", ServerChecker.check_health), ("empty batch", check_empty), ("single item", check_single),
        ("batch keeps order", check_batch_order), ("batch = one by one", check_batch_equals_singles),
        ("batch of 256", check_large_batch), ("concurrent calls", check_concurrent),
        ("deadline", check_deadline), ("malformed: duplicate ids", check_duplicate_ids),
        ("malformed: empty id", check_empty_id), ("malformed: extra_info_json", check_bad_extra_info),
        ("serves after errors", check_recovers), ("GetStatus (optional)", check_status),
        ("reflection (optional)", ServerChecker.check_reflection),
    )


def format_table(address: str, checks: list[Check]) -> str:
    return conformance.format_table("reward", address, checks)


def check_server(address: str, timeout_s: float = 10.0, samples: list[dict] | None = None) -> list[Check]:
    checker = ContractChecker(address, timeout_s, samples)
    try:
        return checker.run()
    finally:
        checker.close()


def parse_items(raw: list[str]) -> list[dict]:
    from rlfleet.errors import ConfigError

    items = []
    for text in raw:
        try:
            item = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--item {text!r} is not JSON: {exc}") from None
        allowed = {"data_source", "prompt", "response", "ground_truth", "extra_info_json"}
        if not isinstance(item, dict) or set(item) - allowed:
            raise ConfigError(f"--item must be a JSON object with keys among {sorted(allowed)}")
        items.append(item)
    return items
