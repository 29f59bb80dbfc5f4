"""`rlfleet model import SRC --output DIR`: a GGUF file or an HF folder becomes a clean HF folder."""
from __future__ import annotations

import argparse

from rlfleet.models.importer import DTYPES


def add_parser(sub: argparse._SubParsersAction) -> None:
    model = sub.add_parser("model", help="prepare model folders")
    verbs = model.add_subparsers(dest="verb", required=True)
    imp = verbs.add_parser("import", help="a .gguf file (any architecture transformers reads from "
                           "GGUF) or an HF folder -> an HF folder (safetensors, config, tokenizer, chat "
                           "template, generation config) for model.path / --model")
    imp.add_argument("src", help="a .gguf file or an HF model folder")
    imp.add_argument("--output", "-o", required=True, help="folder to write (must not exist or be empty)")
    imp.add_argument("--dtype", default="auto", choices=DTYPES,
                     help="weights' dtype on disk (default auto: float32 for GGUF, which is dequantized)")
    imp.add_argument("--force", action="store_true", help="replace --output if it exists")


def run(args: argparse.Namespace) -> int:
    from rlfleet.models.importer import import_model

    report = import_model(args.src, args.output, dtype=args.dtype, force=args.force)
    print("\n".join(report.lines()))
    return 0
