"""Learner -> rollout weight transfer over a private torch.distributed broadcast group."""
from rlfleet.weights.group import WeightGroup
from rlfleet.weights.manifest import DEFAULT_BUCKET_BYTES, BucketSpec, Entry, Manifest, checksum, plan_buckets
from rlfleet.weights.receiver import ReceivedWeights, WeightReceiver, apply_to_module
from rlfleet.weights.sender import WeightSender

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "BucketSpec",
    "Entry",
    "Manifest",
    "ReceivedWeights",
    "WeightGroup",
    "WeightReceiver",
    "WeightSender",
    "apply_to_module",
    "checksum",
    "plan_buckets",
]
