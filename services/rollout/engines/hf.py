"""Transformers backend: batched generation with the sampled tokens' logprobs.

Generation runs rlfleet's static-KV-cache decode loop (`static_generate.py`, replayed as a
CUDA graph on GPU) for the architectures it supports, else transformers' `generate()`.
A lock serialises generation chunks and weight swaps, so a chunk is generated
entirely by one policy version and an update lands between chunks.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import structlog
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlfleet import host_memory
from rlfleet.config import RolloutConfig
from rlfleet.devices import placement
from rlfleet.errors import ConfigError
from rlfleet.ops.logprobs import token_logprobs
from rlfleet.profiling import StepProfiler
from rlfleet.types import Completion, GroupResult, PromptRequest, SamplingParams
from rlfleet.weights import apply_to_module
from rlfleet.weights.digest import weights_digest
from rlfleet.weights.naming import model_weights
from services.rollout.engine import RolloutEngine, check_prompts
from services.rollout.engines.decoder import unsupported_reason
from services.rollout.engines.static_generate import StaticGenerator, left_padded
from services.rollout.weight_sync import InProcessWeightSync

log = structlog.get_logger(__name__)


class HFEngine(RolloutEngine):
    def __init__(self, model_path: Path, device: torch.device, dtype: torch.dtype,
                 max_batch_sequences: int = 256,
                 decode: str = "auto", cuda_graphs: bool = True, compile_decode: bool = True):
        self._device = device
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
        self.model.requires_grad_(False)
        self.max_batch_sequences = max_batch_sequences
        self.max_seq_len = getattr(self.model.config, "max_position_embeddings", 1 << 30)
        self.eos_ids = self._eos_ids()
        pad_id = self.tokenizer.pad_token_id
        self.pad_id = pad_id if pad_id is not None else self.eos_ids[0]
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        self._static = self._static_generator(decode, cuda_graphs, compile_decode)
        self._lock = threading.Lock()
        self.policy_version = 0
        self._weights = InProcessWeightSync(device, self.apply_weights)
        self._profiler = StepProfiler("rollout")  # RLFLEET_PROFILE_STEPS (rlfleet/profiling.py)

    def _static_generator(self, decode: str, cuda_graphs: bool,
                          compile_decode: bool) -> StaticGenerator | None:
        """rlfleet's decode loop unless `generate` was asked for; `auto` falls back to generate()
        for architectures the loop does not run, `static` insists (rollout.hf_decode)."""
        if decode == "generate":
            return None
        reason = unsupported_reason(self.model)
        if reason is None:
            return StaticGenerator(self.model, self.pad_id, self.eos_ids, cuda_graphs, compile_decode)
        if decode == "static":
            raise ConfigError("rollout.hf_decode=static: the static decode loop cannot run this model "
                              f"({reason}); "
                              "use rollout.hf_decode=generate")
        log.info("rollout.static_decode_unavailable", reason=reason, using="transformers generate()")
        return None

    @property
    def device(self) -> torch.device:
        return self._device

    def placement(self) -> str:
        return placement(self._device, ipc_capable=True)  # InProcessWeightSync maps CUDA IPC buffers

    def join_weight_group(self, address: str, rank: int, world_size: int, backend: str, timeout_s: float,
                          token: str | None = None) -> None:
        self._weights.join(address, rank, world_size, backend, timeout_s, token)

    def pull_weights(self, version: int) -> dict[str, float]:
        return self._weights.pull(version)

    def _eos_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return list(eos) if isinstance(eos, (list, tuple)) else [eos]

    def validate(self, prompts: list[PromptRequest], params: SamplingParams) -> None:
        check_prompts(prompts, params, self.vocab_size, self.max_seq_len, "the model's")

    def generate(self, prompts: list[PromptRequest], params: SamplingParams) -> Iterator[GroupResult]:
        self.validate(prompts, params)
        groups_per_chunk = max(1, self.max_batch_sequences // params.n)
        for start in range(0, len(prompts), groups_per_chunk):
            yield from self._generate_chunk(prompts[start:start + groups_per_chunk], params)

    @torch.no_grad()
    def _generate_chunk(self, prompts: list[PromptRequest], params: SamplingParams) -> list[GroupResult]:
        rows = [p.prompt_ids for p in prompts for _ in range(params.n)]
        with self._lock:
            version = self.policy_version
            with self._profiler.trace(self._profiler.next_call()):
                if self._static is not None:
                    new_ids, logprobs = self._static.generate(rows, params)
                else:
                    new_ids, logprobs = self._transformers_generate(rows, params)
        if self._device.type == "cpu":  # the chunk's freed buffers are host memory (rlfleet/host_memory.py)
            host_memory.step_done()
        completions = [self._completion(new_ids[i].tolist(), logprobs[i].tolist(), params, version)
                       for i in range(len(rows))]
        return [GroupResult(request_id=p.request_id, completions=completions[g * params.n:(g + 1) * params.n])
                for g, p in enumerate(prompts)]

    def _transformers_generate(self, rows: list[list[int]],
                               params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """New tokens and their logprobs [rows, T] from transformers' generate()
        (rollout.hf_decode=generate)."""
        width = max(len(r) for r in rows)
        input_ids, valid, _ = left_padded(rows, width, self.pad_id)  # generate() derives the positions itself
        attention = valid.long()
        greedy = params.temperature == 0
        if params.seed is not None:
            torch.manual_seed(params.seed)
        out = self.model.generate(
            input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device),
            do_sample=not greedy, temperature=None if greedy else params.temperature,
            top_p=None if greedy else params.top_p, top_k=None if greedy else (params.top_k or 0),
            max_new_tokens=params.max_new_tokens, min_new_tokens=1,
            stop_strings=list(params.stop) or None, tokenizer=self.tokenizer if params.stop else None,
            pad_token_id=self.pad_id, eos_token_id=self.eos_ids,
            return_dict_in_generate=True, output_logits=True)
        new_ids = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float()
        return new_ids.cpu(), token_logprobs(logits, new_ids, 1.0 if greedy else params.temperature).cpu()

    def _completion(self, ids: list[int], logprobs: list[float], params: SamplingParams,
                    version: int) -> Completion:
        # Cut after the first eos (kept, so the learner learns to stop) or at a stop string.
        end, finish = len(ids), "length"
        for j, tok in enumerate(ids):
            if tok in self.eos_ids:
                end, finish = j + 1, "stop"
                break
        if params.stop:  # generate() pads after a stop string: cut right after the token completing it
            for j in range(end):
                if any(s in self.tokenizer.decode(ids[:j + 1], skip_special_tokens=True)
                       for s in params.stop):
                    end, finish = j + 1, "stop"
                    break
        ids, logprobs = ids[:end], logprobs[:end]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(token_ids=ids, logprobs=logprobs, finish_reason=finish, policy_version=version,
                          text=text)

    def weights_digest(self) -> str:
        with self._lock:
            return weights_digest(model_weights(self.model))

    def apply_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        """Swaps in a complete set of weights between two generation chunks."""
        with self._lock:
            apply_to_module(self.model, tensors, strict=True)
            self.policy_version = version


def create_engine(model_path: Path, device: torch.device, dtype: torch.dtype, cfg: RolloutConfig,
                  seed: int) -> HFEngine:
    """`rollout.backend=hf` (registered in rlfleet.extensions.ROLLOUT_ENGINES)."""
    return HFEngine(model_path, device, dtype, cfg.max_batch_sequences, cfg.hf_decode, cfg.cuda_graphs,
                    cfg.compile_decode)
