"""`rlfleet model import`: a GGUF file or an HF folder becomes a clean HF folder.

The output is what every rlfleet command takes as `model.path` / `--model`: a
config without quantization settings, safetensors weights, the tokenizer with its
chat template, and a generation config whose eos matches the tokenizer's.

GGUF files are read by transformers (which dequantizes them); a GGUF loads into a
model that refuses `save_pretrained` (its config still says "quantized"), so the
weights are moved into a fresh model built from the cleaned config. The folder is
written next to its final place and renamed in one step: an import that fails
leaves nothing behind, and the written folder is reloaded and its logits compared
with the source's before it is kept.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlfleet.errors import ConfigError
from rlfleet.models.context import model_context

GGUF_MAGIC = b"GGUF"
DTYPES = ("auto", "float32", "bfloat16", "float16")
# Prompt for the reload check: a few ordinary tokens through every layer.
_CHECK_TEXT = "Natalia sold clips to 48 of her friends in April."


@dataclass(frozen=True)
class ImportReport:
    output: Path
    source_kind: str  # "gguf" or "hf"
    architecture: str
    parameters: int
    layers: int
    vocab_size: int
    context_length: int | None
    dtype: str
    eos_token: str | None
    chat_template: bool
    max_logit_diff: float

    def lines(self) -> list[str]:
        ctx = self.context_length if self.context_length is not None else "unknown"
        template = "yes" if self.chat_template else "NO (prompts are used as is)"
        shape = (f"  architecture {self.architecture}, {self.parameters / 1e6:.1f}M parameters, "
                 f"{self.layers} layers, vocabulary {self.vocab_size}, context {ctx} tokens, "
                 f"saved as {self.dtype}")
        return [f"imported {self.source_kind} -> {self.output}", shape,
                f"  eos {self.eos_token!r}, chat template {template}",
                f"  reloaded and checked: largest logit difference {self.max_logit_diff:.2e}"]


def is_gguf(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(4) == GGUF_MAGIC


def _gguf_fields(path: Path) -> dict[str, Any]:
    """The GGUF file's metadata fields (read without loading any tensor)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ConfigError("reading GGUF files needs the `gguf` package: pip install gguf") from None
    try:
        return GGUFReader(str(path)).fields
    except Exception as exc:  # noqa: BLE001 - the reader raises assorted types on a damaged file
        raise ConfigError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None


def gguf_metadata(path: Path) -> tuple[str, int | None]:
    """The GGUF file's architecture and the end-of-sequence token it declares (a chat model's end of
    turn), from one read of its metadata: each read walks the whole vocabulary (~2 s for 49k tokens)."""
    fields = _gguf_fields(path)
    field = fields.get("general.architecture")
    if field is None:
        raise ConfigError(f"{path}: a GGUF file without general.architecture")
    eos = fields.get("tokenizer.ggml.eos_token_id")
    return (bytes(field.parts[field.data[0]]).decode(),
            int(eos.parts[eos.data[0]][0]) if eos is not None else None)


def _supported_gguf_architectures() -> list[str]:
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    return sorted(GGUF_CONFIG_MAPPING)


def _load_source(src: Path) -> tuple[str, Any, Any]:
    """(kind, model, tokenizer) of a GGUF file or an HF folder, on the CPU in float32."""
    if src.is_dir():
        if not (src / "config.json").is_file():
            raise ConfigError(f"{src}: a folder without config.json (an HF model folder or a .gguf file "
                              "is needed)")
        kind, kwargs, eos_id = "hf", {}, None
    elif src.is_file():
        if not is_gguf(src):
            raise ConfigError(f"{src}: neither a GGUF file (no GGUF magic bytes) nor an HF model folder")
        arch, eos_id = gguf_metadata(src)
        supported = _supported_gguf_architectures()
        if arch not in supported:
            raise ConfigError(f"{src}: GGUF architecture {arch!r} cannot be read by this transformers "
                              f"(it reads {', '.join(supported)})")
        kind, kwargs, src = "gguf", {"gguf_file": src.name}, src.parent
    else:
        raise ConfigError(f"{src}: no such file or folder")
    # torch and transformers only now: a bad source is refused in a fraction of the seconds they take
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(src, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, **kwargs)
    except (ValueError, OSError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{src}: transformers cannot load it as a causal language model: {first}") from None
    if eos_id is not None and tokenizer.eos_token_id != eos_id:
        # Some transformers versions take another special token for eos from a GGUF (5.17 took
        # SmolLM2's <|im_start|>): the file's own eos is what the model ends its turns with.
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_id)
    return kind, model, tokenizer


def _clean_model(model: Any, dtype: str) -> Any:
    """A fresh model of the same config, without quantization settings, holding the same weights."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model.config
    quant = getattr(config, "quantization_config", None)
    if quant is not None and not _is_gguf_quantization(quant):
        method = (quant.get("quant_method") if isinstance(quant, dict)
                  else getattr(quant, "quant_method", quant))
        raise ConfigError(f"the model is quantized ({method}): its weights cannot be trained; "
                          "import the full-precision model instead")
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    target = torch.float32 if dtype == "auto" else getattr(torch, dtype)
    config.dtype = target
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(model.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ConfigError("the loaded weights do not fit the model's own config (missing "
                          f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    fresh.tie_weights()
    fresh.generation_config = model.generation_config
    return fresh.to(target)


def _is_gguf_quantization(quant: Any) -> bool:
    text = str(quant.get("quant_method") if isinstance(quant, dict)
               else getattr(quant, "quant_method", quant))
    return "gguf" in text.lower()


def _fix_generation_config(model: Any, tokenizer: Any) -> None:
    """The eos the rollout stops at is the tokenizer's (a chat model's end-of-turn token)."""
    gen = model.generation_config
    if tokenizer.eos_token_id is not None:
        eos = gen.eos_token_id
        known = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id not in known:
            gen.eos_token_id = [tokenizer.eos_token_id, *sorted(known)] if known else tokenizer.eos_token_id
    if gen.pad_token_id is None and tokenizer.pad_token_id is not None:
        gen.pad_token_id = tokenizer.pad_token_id
    # Sampling settings belong to the rollout config, not to the model folder.
    for key in ("do_sample", "temperature", "top_p", "top_k"):
        if hasattr(gen, key):
            setattr(gen, key, None)


def _max_logit_diff(a: Any, b: Any, tokenizer: Any) -> float:
    import torch

    ids = torch.tensor([tokenizer(_CHECK_TEXT, add_special_tokens=False)["input_ids"][:32]])
    with torch.no_grad():
        return float((a(ids).logits.float() - b(ids).logits.float()).abs().max())


def import_model(src: str | Path, output: str | Path, dtype: str = "auto",
                 force: bool = False) -> ImportReport:
    """Writes the clean HF folder `output` from `src` (a .gguf file or an HF folder)."""
    src, output = Path(src).expanduser(), Path(output).expanduser()
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r}: one of {', '.join(DTYPES)}")
    occupied = output.is_file() or (output.is_dir() and any(output.iterdir()))
    if occupied and not force:
        raise ConfigError(f"--output {output} exists and is not empty (pass --force to replace it)")
    kind, source, tokenizer = _load_source(src)
    import torch
    from transformers import AutoModelForCausalLM

    model = _clean_model(source, dtype)
    _fix_generation_config(model, tokenizer)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        reloaded = AutoModelForCausalLM.from_pretrained(staging, dtype=torch.float32)
        diff = _max_logit_diff(source, reloaded, tokenizer)
        # Saving in a narrower dtype than the source moves logits by its rounding; float32 must be exact.
        limit = 1e-4 if dtype in ("auto", "float32") else 1.0
        if not diff <= limit:
            raise ConfigError(f"the written model's logits differ from the source's by {diff:.3g} (limit "
                              f"{limit})")
        if output.exists():
            shutil.rmtree(output) if output.is_dir() else output.unlink()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's folder is private; a model folder is not
        staging.rename(output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    config, context = reloaded.config, model_context(output)  # the context rlfleet's length checks will use
    return ImportReport(output=output, source_kind=kind, architecture=type(reloaded).__name__,
                        parameters=sum(p.numel() for p in reloaded.parameters()),
                        layers=getattr(config, "num_hidden_layers", 0), vocab_size=config.vocab_size,
                        context_length=context[0] if context else None,
                        dtype=str(model.dtype).removeprefix("torch."),
                        eos_token=tokenizer.eos_token,
                        chat_template=bool(getattr(tokenizer, "chat_template", None)),
                        max_logit_diff=diff)
