"""Shared parts of bench/e2e_grpo.py and bench/small_job.py: the model folder, the prompts, the
throughput arithmetic, and following a run's metrics.jsonl as it grows.

The model is a Qwen2 of a chosen shape with random weights and the embedded tiny model's
digit-level tokenizer (rlfleet.models.tiny.build_tokenizer); the vocabulary is padded to the
shape's size (151,936 for 0.5B). Ids beyond the tokenizer decode to nothing, so a random
model's completions decode to short strings and almost always run to max_new_tokens, which
is what a throughput measurement wants: every arm generates and trains the same token count.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path



def subprocess_env(repo: Path) -> dict[str, str]:
    """This environment with `repo` first on PYTHONPATH, for the runs a bench starts."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(repo), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


class JsonlFollower:
    """The complete JSON lines appended to a file (a run's metrics.jsonl) since the last look."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, ""

    def new_lines(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self.offset)
            self.partial += f.read()
            self.offset = f.tell()
        *complete, self.partial = self.partial.split("\n")
        return [json.loads(text) for text in complete if text.strip()]


# hidden, intermediate, layers, heads, kv heads, vocab (tied embeddings in both)
SHAPES: dict[str, tuple[int, int, int, int, int, int]] = {
    "0.5b": (896, 4864, 24, 14, 2, 151936),  # Qwen2.5-0.5B
    "tiny": (128, 384, 2, 2, 2, 1024),
}


def build_model_dir(shape: str, cache_dir: Path, device: str, seed: int = 0) -> Path:
    """A Qwen2 folder (config, bf16 safetensors, tokenizer) in `cache_dir`, built once per shape."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from rlfleet.models.tiny import build_tokenizer

    h, inter, layers, heads, kv, vocab = SHAPES[shape]
    key = hashlib.sha256(json.dumps([SHAPES[shape], seed, 1]).encode()).hexdigest()[:10]
    out = Path(cache_dir) / f"qwen2-{shape}-random-{key}"
    if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file():
        return out
    tok = build_tokenizer()
    tok.model_max_length = 32768
    assert len(tok) <= vocab, (len(tok), vocab)
    cfg = Qwen2Config(hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads,
                      num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=True,
                      max_position_embeddings=32768, rms_norm_eps=1e-6,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id,
                      dtype="bfloat16")
    torch.manual_seed(seed)
    build_on = torch.device("cuda" if device == "cuda" and torch.cuda.is_available() else "cpu")
    with build_on:
        model = Qwen2ForCausalLM(cfg)
    model = model.to(torch.bfloat16).cpu()
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)  # a partial build
    os.replace(tmp, out)
    return out


def write_prompts(path: Path, n: int, seed: int = 0) -> list[dict]:
    """The built-in digits_reverse task in verl's schema (the same rows rlfleet's builtin task makes)."""
    from rlfleet.data import tasks

    tasks.write_parquet(path, n, seed)
    return tasks.make_rows(n, seed)


def max_prompt_tokens(model_dir: Path, rows: list[dict]) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    return max(len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"])


@dataclass
class StepRecord:
    step: int
    t_end: float  # seconds since the arm's process started, when the step was seen to end
    samples: int  # completions trained in the step
    gen_tokens: int  # completion tokens of those samples
    extra: dict = field(default_factory=dict)


@dataclass
class ArmResult:
    name: str
    steps: list[StepRecord]
    total_s: float  # whole invocation of the arm, start-up included
    note: str = ""
    error: str = ""

    def measured(self, warmup: int) -> dict:
        """Throughput from the end of step `warmup` to the end of the last step."""
        done = [s for s in self.steps if s.step > warmup]
        base = [s for s in self.steps if s.step == warmup]
        if not done or not base:
            return {}
        wall = done[-1].t_end - base[0].t_end
        samples = sum(s.samples for s in done)
        tokens = sum(s.gen_tokens for s in done)
        return {"steps": len(done), "wall_s": wall, "samples": samples, "gen_tokens": tokens,
                "samples_per_s": samples / wall, "gen_tokens_per_s": tokens / wall,
                "s_per_step": wall / len(done),
                "mean_len": tokens / max(samples, 1),
                "reward": sum(s.extra.get("reward", 0.0) for s in done) / len(done)}


def format_table(results: list[ArmResult], warmup: int) -> str:
    head = ("arm", "steps", "wall s", "s/step", "samples/s", "gen tok/s", "mean len", "reward", "total s",
            "vs TRL")
    rows = []
    ref = next((r.measured(warmup).get("gen_tokens_per_s") for r in results
                if r.name.startswith("trl")), None)
    for r in results:
        m = r.measured(warmup)
        if not m:
            rows.append((r.name, "-", "-", "-", "-", "-", "-", "-", f"{r.total_s:.1f}",
                         r.error[:60] or "no steps"))
            continue
        ratio = f"{m['gen_tokens_per_s'] / ref:.2f}x" if ref else "-"
        ratio += " (partial)" if r.error else ""
        rows.append((r.name, str(m["steps"]), f"{m['wall_s']:.1f}", f"{m['s_per_step']:.2f}",
                     f"{m['samples_per_s']:.1f}", f"{m['gen_tokens_per_s']:.0f}", f"{m['mean_len']:.1f}",
                     f"{m['reward']:.3f}", f"{r.total_s:.1f}", ratio))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
