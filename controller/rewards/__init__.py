"""The controller's rewards: the reward service alone (no `reward.sources`), or the weighted sources.

`make_reward_client` is what `controller.main` scores with; `reward_metrics`
adds each source's metrics to a step's metrics line.
"""
from __future__ import annotations

from collections.abc import Callable

from rlfleet.config import JobConfig
from rlfleet.errors import ConfigError


def make_reward_client(cfg: JobConfig, addresses: dict[str, str], timeout_s: float, connect_timeout_s: float,
                       alive: Callable[[], bool] = lambda: True):
    """A `RewardClient` for the reward service, or `RewardSources` when `reward.sources` is set."""
    from controller.clients import RewardClient

    if not cfg.reward.sources:
        return RewardClient(addresses["reward"], timeout_s=timeout_s, connect_timeout_s=connect_timeout_s,
                            alive=alive)
    from controller.rewards.local import FunctionSource
    from controller.rewards.remote_client import RemoteSource
    from controller.rewards.sources import RewardSources

    built = []
    try:
        for source in cfg.reward.sources:
            if source.function:
                built.append(FunctionSource(source))
                continue
            address = source.address or addresses.get("reward")
            if not address:
                raise ConfigError(f"reward source {source.name!r} uses the reward service, but none runs "
                                  f"(set reward.address=HOST:PORT)")
            built.append(RemoteSource(source, address, connect_timeout_s, alive))
    except BaseException:
        for source in built:
            source.close()
        raise
    return RewardSources(built, cfg.reward.max_consecutive_failures)


def reward_metrics(client: object, groups: list) -> dict[str, float]:
    from controller.rewards.sources import RewardSources

    return client.step_metrics(groups) if isinstance(client, RewardSources) else {}
