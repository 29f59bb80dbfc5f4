"""Bucketing, manifest round trip, checksum sensitivity and apply_to_module (no processes)."""
from __future__ import annotations

import pytest
import torch

from rlfleet.errors import WeightSyncError
from rlfleet.weights import Manifest, apply_to_module, checksum, plan_buckets
from rlfleet.weights.manifest import BucketSpec, Entry


def _named() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("embed", torch.randn(32, 64, generator=g)),  # 8 KiB float32: larger than the bucket
        ("l0.w", torch.randn(16, 16, generator=g)),  # 1 KiB each
        ("l0.b", torch.randn(16, generator=g).bfloat16()),
        ("l1.w", torch.randn(16, 16, generator=g)),
        ("l1.b", torch.randn(16, generator=g).bfloat16()),
        ("l2.w", torch.randn(16, 16, generator=g)),
        ("l2.w2", torch.randn(16, 16, generator=g)),
        ("step", torch.tensor(7)),  # 0-d int64
        ("pos", torch.arange(10)),
    ]


def test_buckets_group_by_dtype_and_respect_size() -> None:
    man = plan_buckets(_named(), version=1, bucket_bytes=2048)
    dtypes = [b.dtype for b in man.buckets]
    assert dtypes == ["float32", "float32", "float32", "bfloat16", "int64"]
    assert man.buckets[0].numel == 32 * 64  # the oversized tensor sits alone
    assert [e.name for e in man.entries if e.bucket == 1] == ["l0.w", "l1.w"]
    assert [e.name for e in man.entries if e.bucket == 2] == ["l2.w", "l2.w2"]
    for b in man.buckets[1:]:
        assert b.nbytes <= 2048
    by_name = {e.name: e for e in man.entries}
    assert by_name["l1.w"].offset == 256 and by_name["step"].shape == () and by_name["pos"].offset == 1
    assert man.total_bytes == sum(t.numel() * t.element_size() for _, t in _named())


def test_one_bucket_when_everything_fits() -> None:
    man = plan_buckets([("a", torch.zeros(3)), ("b", torch.zeros(5))], version=0)
    assert len(man.buckets) == 1 and man.buckets[0].numel == 8


def test_duplicate_names_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        plan_buckets([("a", torch.zeros(1)), ("a", torch.zeros(1))], version=0)


def test_manifest_round_trip() -> None:
    man = plan_buckets(_named(), version=42, bucket_bytes=2048)
    man.buckets = [BucketSpec(b.dtype, b.numel, (i, 10**17 + i)) for i, b in enumerate(man.buckets)]
    data = man.to_bytes()
    assert isinstance(data, bytes) and data.startswith(b"{")
    back = Manifest.from_bytes(data)
    assert back == man


@pytest.mark.parametrize("data", [
    b"not json",
    b'{"format": "other", "version": 1, "entries": [], "buckets": []}',
    Manifest(1, [Entry("x", (4,), "float32", 0, 0, 4)], [BucketSpec("float32", 3)]).to_bytes(),
    Manifest(1, [Entry("x", (4,), "float32", 1, 0, 4)], [BucketSpec("float32", 4)]).to_bytes(),
    Manifest(1, [Entry("x", (4,), "int64", 0, 0, 4)], [BucketSpec("float32", 4)]).to_bytes(),
    Manifest(1, [], [BucketSpec("not_a_dtype", 4)]).to_bytes(),
])
def test_malformed_manifest_raises(data: bytes) -> None:
    with pytest.raises(WeightSyncError):
        Manifest.from_bytes(data)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool])
def test_checksum_detects_a_flipped_byte(dtype: torch.dtype) -> None:
    flat = (torch.arange(1001) % 7).to(dtype)  # odd byte count for 1-byte dtypes
    ref = checksum(flat)
    assert checksum(flat.clone()) == ref
    raw = flat.view(torch.uint8)
    for pos in (0, raw.numel() // 2, raw.numel() - 1):
        bad = raw.clone()
        bad[pos] ^= 1  # low bit: also a valid 0<->1 flip for bool
        assert checksum(bad.view(dtype)) != ref, f"flip at byte {pos} went unnoticed"


def test_checksum_detects_swapped_words() -> None:
    flat = torch.arange(64, dtype=torch.int16)
    swapped = flat.clone()
    swapped[[3, 40]] = swapped[[40, 3]]
    assert checksum(swapped) != checksum(flat)
    assert checksum(torch.empty(0)) == (0, 0)


def test_checksum_spans_chunks() -> None:
    flat = torch.randint(-(2**15), 2**15, (4_300_000,), dtype=torch.int16,
                         generator=torch.Generator().manual_seed(1))
    ref = checksum(flat)
    flat[4_250_000] += 1
    assert checksum(flat) != ref


class _Tiny(torch.nn.Module):
    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3).to(dtype)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))


def test_apply_to_module_copies_and_casts() -> None:
    src = _Tiny(torch.float32)
    src.steps.fill_(5)
    dst = _Tiny(torch.bfloat16)
    tensors = dict(src.named_parameters()) | dict(src.named_buffers())
    assert sorted(apply_to_module(dst, tensors)) == ["lin.bias", "lin.weight", "steps"]
    assert dst.lin.weight.dtype == torch.bfloat16 and dst.lin.weight.requires_grad
    assert torch.equal(dst.lin.weight, src.lin.weight.bfloat16()) and int(dst.steps) == 5


def test_apply_to_module_strict_names_and_shapes() -> None:
    dst = _Tiny()
    before = dst.lin.weight.detach().clone()
    tensors = {"lin.weight": torch.ones(3, 4), "lin.bias": torch.ones(3), "steps": torch.tensor(1),
               "extra": torch.ones(1)}
    with pytest.raises(WeightSyncError, match="extra"):
        apply_to_module(dst, tensors)
    assert apply_to_module(dst, tensors, strict=False) == ["lin.weight", "lin.bias", "steps"]
    with pytest.raises(WeightSyncError, match="shape mismatch"):
        apply_to_module(_Tiny(), {"lin.weight": torch.ones(4, 3), "lin.bias": torch.ones(3)}, strict=False)
    fresh = _Tiny()
    fresh.lin.weight.data.copy_(before)
    with pytest.raises(WeightSyncError):  # nothing is written when validation fails
        apply_to_module(fresh, {"lin.weight": torch.zeros(3, 4), "lin.bias": torch.zeros(2)}, strict=False)
    assert torch.equal(fresh.lin.weight, before)


def test_layout_and_header_round_trip() -> None:
    import json
    from dataclasses import asdict

    from rlfleet.weights.manifest import HEADER_WORDS, decode_header, encode_header, layout_digest

    man = plan_buckets(_named(), version=5, bucket_bytes=2048)
    man.buckets[0] = BucketSpec(man.buckets[0].dtype, man.buckets[0].numel, (3, 4))
    # to_bytes no longer goes through asdict, but must write the same document
    doc = {"format": "rlfleet.weights.manifest/1", "version": 5, "entries": [asdict(e) for e in man.entries],
           "buckets": [asdict(b) for b in man.buckets]}
    assert json.loads(man.to_bytes()) == json.loads(json.dumps(doc))
    layout = man.layout()
    assert layout.version == 0 and all(b.checksum == () for b in layout.buckets)
    assert layout.to_bytes() == plan_buckets(_named(), version=9, bucket_bytes=2048).layout().to_bytes()
    digest = layout_digest(layout.to_bytes())
    other = layout_digest(plan_buckets(_named()[1:], 0, 2048).layout().to_bytes())
    assert len(digest) == 4 and digest != other
    words = encode_header(-3, len(layout.buckets), 123, 1, digest)
    assert len(words) == HEADER_WORDS and decode_header(words) == (-3, len(layout.buckets), 123, 1, digest)
    pushed = layout.with_push(11, [(i, i + 1) for i in range(len(layout.buckets))])
    assert pushed.version == 11 and pushed.buckets[2].checksum == (2, 3) and pushed.entries is layout.entries
    with pytest.raises(WeightSyncError):
        decode_header(words[:-1])


def _reference_checksum(data: bytes) -> tuple[int, int]:
    """The definition, word by word in Python: s1 = sum(w_i), s2 = sum(w_i * (i mod 65521 + 1)) over the
    little-endian int16 words, an odd last byte folded in at the next position, both mod 2**61 - 1."""
    s1 = s2 = 0
    n2 = len(data) // 2 * 2
    for i in range(0, n2, 2):
        w = int.from_bytes(data[i:i + 2], "little", signed=True)
        s1 += w
        s2 += w * ((i // 2) % 65521 + 1)
    if n2 < len(data):
        s1 += data[-1]
        s2 += data[-1] * ((n2 // 2) % 65521 + 1)
    return s1 % ((1 << 61) - 1), s2 % ((1 << 61) - 1)


@pytest.mark.parametrize("numel", [0, 1, 7, 65522, 140001])
def test_checksum_equals_its_definition_including_extreme_words(numel: int) -> None:
    g = torch.Generator().manual_seed(numel)
    raw = torch.randint(0, 256, (numel,), dtype=torch.uint8, generator=g)
    raw[: min(numel, 8)] = torch.tensor([0x00, 0x80, 0xFF, 0x7F, 0x00, 0x80, 0xFF, 0x7F][: min(numel, 8)],
                                        dtype=torch.uint8)  # -32768 and 32767: the largest products
    assert checksum(raw) == _reference_checksum(bytes(raw.tolist()))
