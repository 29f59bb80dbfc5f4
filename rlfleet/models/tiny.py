"""A tiny Qwen2 model built locally for the embedded default job.

No hub downloads: the tokenizer is trained on text generated from the built-in
task (``rlfleet.data.tasks``), the model is randomly initialised and then given a
short supervised warm-start on a "noisy teacher" (each answer digit replaced by
a random digit with probability ``sft_noise``).  The result knows the prompt
format and the skill, but samples at temperature 1.0 are only partly right, so
GRPO has something visible to sharpen.

Public API: ``build_tokenizer()``, ``tiny_config(tokenizer)``,
``build_tiny_model(out_dir, seed)``, ``ensure_tiny_model(cache_dir)``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

from rlfleet.data import tasks

log = logging.getLogger(__name__)

BOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = [BOS_TOKEN, PAD_TOKEN, IM_START, EOS_TOKEN]

# Qwen-style chat template: generation continues after "<|im_start|>assistant\n"
# and the assistant turn ends with the eos token "<|im_end|>".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Everything that determines the built artefact.  Changing any value changes the
# cache folder name, so stale builds are never reused.
RECIPE = {
    "version": 1,
    "task": tasks.TASK_NAME,
    "tokenizer": {"type": "bpe-bytelevel-digits", "vocab_size": 320, "corpus": 2000},
    "model": {
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": 384,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
    },
    # Warm-start: ``clean_steps`` on exact answers teach the skill, then
    # ``noisy_steps`` on the noisy teacher spread the sampling distribution.
    "sft": {
        "clean_steps": 150,
        "noisy_steps": 150,
        "batch_size": 64,
        "lr": 3e-3,
        "warmup": 30,
        "noise": 0.7,
        "weight_decay": 0.0,
        "threads": 2,
    },
    "seed": 0,
}


def recipe_hash(recipe: dict | None = None) -> str:
    blob = json.dumps(recipe or RECIPE, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


# --------------------------------------------------------------------------- tokenizer


def build_tokenizer():
    """A byte-level BPE tokenizer trained on task text; every digit is one token.

    Returns a ``transformers.PreTrainedTokenizerFast`` with bos/eos/pad set
    (pad != eos) and a chat template.  Deterministic.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = RECIPE["tokenizer"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec["vocab_size"],
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = []
    for i, text in enumerate(tasks.tokenizer_corpus(spec["corpus"], seed=0)):
        role = "user" if i % 2 == 0 else "assistant"
        corpus.append(f"{IM_START}{role}\n{text}{EOS_TOKEN}\n")
    tok.train_from_iterator(corpus, trainer=trainer)

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        model_max_length=RECIPE["model"]["max_position_embeddings"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


# --------------------------------------------------------------------------- model


def tiny_config(tokenizer):
    """Qwen2 config: hidden 128, 2 layers, 2 heads of head_dim 64, 2 KV heads."""
    from transformers import Qwen2Config

    m = RECIPE["model"]
    assert m["hidden_size"] // m["num_attention_heads"] == 64, "vLLM CPU needs head_dim 64"
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=m["hidden_size"],
        intermediate_size=m["intermediate_size"],
        num_hidden_layers=m["num_hidden_layers"],
        num_attention_heads=m["num_attention_heads"],
        num_key_value_heads=m["num_key_value_heads"],
        max_position_embeddings=m["max_position_embeddings"],
        tie_word_embeddings=m["tie_word_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def _sft_batches(tokenizer, steps: int, batch_size: int, noise: float, seed: int):
    """Yield (input_ids, attention_mask, labels) tensors; loss on answer + eos only."""
    import torch

    if steps <= 0:
        return
    pairs = tasks.make_sft_pairs(steps * batch_size, seed=seed, noise=noise)
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
        )
        for p, _ in pairs
    ]
    p_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    a_ids = tokenizer([a + EOS_TOKEN for _, a in pairs], add_special_tokens=False)["input_ids"]
    pad = tokenizer.pad_token_id
    for s in range(steps):
        rows = range(s * batch_size, (s + 1) * batch_size)
        seqs = [p_ids[i] + a_ids[i] for i in rows]
        width = max(len(x) for x in seqs)
        ids = torch.full((batch_size, width), pad, dtype=torch.long)
        mask = torch.zeros((batch_size, width), dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        for j, i in enumerate(rows):
            n_p, n_a = len(p_ids[i]), len(a_ids[i])
            ids[j, : n_p + n_a] = torch.tensor(seqs[j])
            mask[j, : n_p + n_a] = 1
            labels[j, n_p : n_p + n_a] = torch.tensor(a_ids[i])
        yield ids, mask, labels


def _warm_start(model, tokenizer, seed: int, clean_steps: int, noisy_steps: int) -> None:
    import itertools

    import torch

    spec = RECIPE["sft"]
    steps = clean_steps + noisy_steps
    opt = torch.optim.AdamW(
        model.parameters(), lr=spec["lr"], betas=(0.9, 0.98), weight_decay=spec["weight_decay"]
    )
    warmup = min(spec["warmup"], max(steps // 4, 1))

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(steps - warmup, 1)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * t))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    t0 = time.time()
    batches = itertools.chain(
        _sft_batches(tokenizer, clean_steps, spec["batch_size"], 0.0, seed),
        _sft_batches(tokenizer, noisy_steps, spec["batch_size"], spec["noise"], seed + 1),
    )
    for step, (ids, mask, labels) in enumerate(batches):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == steps - 1:
            log.info(
                "tiny warm-start step %d/%d loss %.4f (%.1fs)", step + 1, steps, loss.item(), time.time() - t0
            )
    model.eval()


def build_tiny_model(out_dir: Path, seed: int = 0, *, sft_steps: int | None = None) -> Path:
    """Build tokenizer + tiny Qwen2, warm-start it, save both into ``out_dir``.

    ``sft_steps`` overrides the recipe's warm-start length (split between the
    clean and noisy phases in the recipe's proportion; tests use a few steps, 0
    skips it).  Deterministic given ``seed`` (and thread count).
    """
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = tiny_config(tokenizer)
    spec = RECIPE["sft"]
    clean, noisy = spec["clean_steps"], spec["noisy_steps"]
    if sft_steps is not None:
        noisy = round(sft_steps * noisy / max(clean + noisy, 1))
        clean = sft_steps - noisy
    steps = clean + noisy
    prev_threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_num_threads(max(1, min(prev_threads, RECIPE["sft"]["threads"])))
        try:
            model = Qwen2ForCausalLM(config)
            if steps > 0:
                _warm_start(model, tokenizer, seed, clean, noisy)
        finally:
            torch.set_num_threads(prev_threads)
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "rlfleet_recipe.json").write_text(
        json.dumps(
            {"recipe": RECIPE, "hash": recipe_hash(), "seed": seed, "sft_steps": steps},
            indent=2,
            sort_keys=True,
        )
    )
    return out_dir


def build_in_child(out_dir: Path, seed: int = 0, *, sft_steps: int | None = None) -> Path:
    """`build_tiny_model` in a child interpreter. The caller is typically the launcher of a first
    `rlfleet run`, which then runs the controller for the whole job: building in-process would leave
    torch, transformers and the warm start's freed buffers resident in it (~650 MB instead of ~150 MB,
    bench/RESULTS.md "Memory of the small CPU job"). The child imports this same rlfleet."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from rlfleet.models.tiny import build_tiny_model; "
            "build_tiny_model(Path(sys.argv[1]), seed=int(sys.argv[2]), "
            "sft_steps=None if sys.argv[3] == '-' else int(sys.argv[3]))")
    package_root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    proc = subprocess.run([sys.executable, "-c", code, str(out_dir), str(seed),
                           "-" if sft_steps is None else str(sft_steps)], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"building the tiny model in {out_dir} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
    return Path(out_dir)


# --------------------------------------------------------------------------- cache


def default_cache_root() -> Path:
    env = os.environ.get("RLFLEET_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "rlfleet"


def _is_complete(path: Path) -> bool:
    return all(
        (path / f).is_file()
        for f in ("config.json", "model.safetensors", "tokenizer.json", "rlfleet_recipe.json")
    )


def ensure_tiny_model(cache_dir: Path | None = None) -> Path:
    """Return the cached tiny model folder, building it on first use.

    The folder is ``<cache>/tiny-qwen2-v<version>-<recipe hash>`` under
    ``cache_dir`` or ``$RLFLEET_CACHE`` or ``~/.cache/rlfleet``.  The build
    happens in a temporary sibling folder that is renamed into place, under an
    exclusive ``flock``, so concurrent callers wait and never see a half build.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    root.mkdir(parents=True, exist_ok=True)
    name = f"tiny-qwen2-v{RECIPE['version']}-{recipe_hash()}"
    final = root / name
    if _is_complete(final):
        return final
    lock_path = root / f".{name}.lock"
    with open(lock_path, "a+") as lock_file:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        try:
            if _is_complete(final):
                return final
            if final.exists():  # leftover from an interrupted, non-atomic state
                shutil.rmtree(final, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
            try:
                t0 = time.time()
                build_in_child(tmp, seed=RECIPE["seed"])
                for f in tmp.iterdir():  # mkdtemp/safetensors create owner-only modes
                    f.chmod(0o644)
                tmp.chmod(0o755)
                os.rename(tmp, final)
                log.info("built tiny model at %s in %.1fs", final, time.time() - t0)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    shutil.rmtree(tmp)
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)
    return final
