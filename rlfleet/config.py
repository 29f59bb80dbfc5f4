"""Job configuration: one YAML file, validated by pydantic, with dotted overrides.

`load_config(path, ["learner.lr=1e-6", "controller.max_staleness=2"])` merges the
overrides into the file (or into the built-in defaults when there is no file) and
validates the result. Every error names the offending key and value.

The defaults ARE the embedded default job: a tiny model built locally, trained on
the built-in task on CPU. For real models start from `deploy/configs/*.yaml`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from rlfleet.addresses import check_address
from rlfleet.algorithm import AlgorithmConfig, load_plugins, registered
from rlfleet.errors import ConfigError
from rlfleet.extensions import ROLLOUT_ENGINES
from rlfleet.config_hints import describe_unknown_key
from rlfleet.config_sections import Section, ServiceEndpointConfig
from rlfleet.learner_config import LearnerConfig
from rlfleet.overrides import apply_overrides, yaml_problem
from rlfleet.reward_config import RewardModelConfig, RewardSourceConfig, check_sources
from rlfleet.security_config import LimitsConfig, SecurityConfig
from rlfleet.tracking_config import TrackingConfig

BUILTIN_MODEL = "builtin:tiny"


class RunConfig(Section):
    name: str = Field("default", min_length=1, description="run name; outputs go to output_dir/name")
    output_dir: str = Field("outputs", description="root folder of run outputs")
    seed: int = Field(0, ge=0, description="seed for data order, sampling and model init")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="least severe log "
                                                                    "level written to logs/ and stderr")
    threads_per_service: int = Field(0, ge=0, description="torch CPU threads per service; 0 lets "
                                     "`rlfleet run` split the cores between services")
    release_freed_memory: bool = Field(
        False, description="a rollout or learner on the CPU gives the memory its step freed back to the OS "
        "after each generation chunk / train step (glibc malloc_trim): ~90 MB less summed RSS on the "
        "small CPU job, but the next step faults the pages in again (sync samples/s -6 % median there); "
        "see bench/RESULTS.md")
    max_restarts: int = Field(3, ge=0, description="`rlfleet run` restarts a service that dies up to "
                              "this many times (exponential backoff from 1 s); 0 stops the run and names "
                              "the service")

    @property
    def dir(self) -> Path:
        return Path(self.output_dir) / self.name


class ModelConfig(Section):
    path: str = Field(BUILTIN_MODEL, description="HF model folder, or builtin:tiny to build the tiny model")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: float32 on CPU, bfloat16 on CUDA")


class DataConfig(Section):
    train_files: list[str] = Field(default_factory=list, description="Parquet files in the verl schema; "
                                   "empty means the built-in task")
    prompt_key: str = Field("prompt", description="column holding a chat message list or a string")
    max_prompt_length: int | None = Field(None, ge=1, description="prompts longer than this (tokens) are "
                                          "left out and counted before step 1; null: what the model's "
                                          "context leaves after rollout.max_new_tokens")
    shuffle: bool = Field(True, description="visit the prompts in a new seeded order every epoch")
    builtin_size: int = Field(2048, ge=1, description="number of prompts generated for the built-in task")
    val_files: list[str] = Field(default_factory=list, description="Parquet files evaluated every "
                                 "controller.eval_every steps; empty with the built-in task: 64 "
                                 "held-out prompts")


class RolloutConfig(ServiceEndpointConfig):
    backend: str = Field("hf", description="generation engine, a name registered in "
                         "rlfleet.extensions.ROLLOUT_ENGINES: hf (transformers) or vllm, or a plugin's")
    replicas: int = Field(1, ge=1, le=64, description="rollout services `rlfleet run` starts; the controller "
                          "spreads groups across them and pushes weights to all in one broadcast")
    addresses: list[str] = Field(default_factory=list, description="host:port of running rollout replicas "
                                 "(instead of address, for several)")
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM tensor parallelism per replica")

    @field_validator("addresses")
    @classmethod
    def _hosts_ports(cls, value: list[str]) -> list[str]:
        return [check_address(a) for a in value]

    gpu_memory_utilization: float | None = Field(
        None, gt=0.0, le=1.0, description="share of its GPU's memory the rollout may take (vLLM's setting; "
        "the transformers engine caps its allocator at it); null: 0.85 on a GPU of its own; on a GPU shared "
        "with the learner, the memory plan's estimate in whole percents, at least 0.30, at most what a set "
        "learner.gpu_memory_utilization leaves of 0.95 (docs/performance.md, one GPU)")
    max_model_len: int | None = Field(None, ge=16, description="vLLM context length; null: the model's")
    inflight_updates: bool = Field(True, description="vLLM: requests in flight continue under new weights "
                                   "(else a weight update waits for them to finish)")
    n: int = Field(8, ge=1, le=1024, description="completions per prompt (GRPO group size)")
    temperature: float = Field(1.0, ge=0.0, le=10.0, description="sampling temperature; 0 is greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling: keep the smallest set of tokens "
                         "whose probability reaches top_p; 1 keeps all")
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    max_new_tokens: int = Field(8, ge=1, le=65536, description="longest response, in tokens")
    stop: list[str] = Field(default_factory=list, description="stop strings")
    max_batch_sequences: int = Field(256, ge=1, description="sequences generated together in one batch")
    hf_decode: Literal["auto", "static", "generate"] = Field(
        "auto", description="transformers backend's decode loop: `static` is rlfleet's static-KV-cache loop "
        "(Llama/Qwen2/Qwen3/Mistral), `generate` transformers' generate(); auto: static where supported")
    cuda_graphs: bool = Field(True, description="transformers backend on GPU: replay the static "
                              "loop's decode step as a CUDA graph")
    compile_decode: bool = Field(True, description="transformers backend on GPU: compile the static loop's "
                                 "decode step (torch.compile) before capturing it; fewer, fused kernels")

    max_turns: int = Field(4, ge=1, le=1024, description="with an environment (env.name or env.address): "
                           "most model turns of one episode; an episode still running then is ended")
    max_episode_tokens: int | None = Field(None, ge=1, description="with an environment: most tokens of an "
                                           "episode's response (the model's turns and the observations); "
                                           "null: what the model's context leaves after the prompt")

    @field_validator("backend")
    @classmethod
    def _registered_engine(cls, name: str) -> str:
        return registered(ROLLOUT_ENGINES, name)


class EnvConfig(Section):
    """Multi-turn episodes against an environment server (docs/environments.md)."""

    name: str | None = Field(None, description="a built-in environment (calculator, python, digits_game) or "
                             "pkg.module:Class that `rlfleet run` serves in a process of its own; null: none "
                             "(or env.address)")
    kind: Literal["grpc", "openenv"] = Field(
        "grpc", description="the environment's transport: grpc (rlfleet.v1.Environment, any language) or "
        "openenv (an OpenEnv HTTP/WebSocket server, one session per episode; needs rlfleet[envs])")
    address: str | None = Field(None, description="the running environment server, set: every sample is "
                                "an episode. grpc: host:port; openenv: http://host:port or ws://host:port")
    reward: Literal["sum", "last", "service"] | None = Field(
        None, description="env.kind=openenv: the episode's reward is the sum of its steps' rewards, the last "
        "one given, or service (the reward service scores the final turn); null: sum. gRPC environments "
        "give the episode's reward themselves (the last one given)")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of env.name's "
                                   "constructor, e.g. {max_tries: 3}")
    port: int = Field(0, ge=0, le=65535, description="port `rlfleet run`, `rlfleet eval` and `rlfleet env "
                      "serve --config` serve env.name on; 0 picks a free one")
    timeout_s: float = Field(30.0, gt=0.0, le=3600.0, description="deadline of one call (a batch of "
                             "episodes' turns); a late call fails its episodes (env/failed/timeout)")
    batch_size: int = Field(64, ge=1, le=4096, description="episodes per call to the environment at most "
                            "(a round's Steps go in env.max_concurrency calls at once)")
    max_concurrency: int = Field(4, ge=1, le=256, description="calls in flight to the environment at once "
                                 "(env.kind=openenv: messages, one per episode; raise it for a slow server)")
    max_outage_s: float = Field(120.0, gt=0.0, le=86400.0, description="how long the run waits while the "
                                "environment cannot be reached (UNAVAILABLE, whatever its health says): "
                                "admission pauses; after this the run stops with the cause")
    max_consecutive_failures: int = Field(1024, ge=0, description="stop the run after this many episodes in "
                                          "a row failed (a timeout, a bad reply, an error; unavailable "
                                          "counts toward env.max_outage_s instead); 0 never stops")
    tools_in_prompt: bool | Literal["auto"] = Field(
        "auto", description="put the tools the environment describes (Describe) into every chat prompt: as "
        "the chat template's tools where it renders them, else in a system message naming the "
        "<tool_call>{json}</tool_call> format. auto: when it describes some; true: it must; false: never")

    @property
    def enabled(self) -> bool:
        return bool(self.name or self.address)

    @model_validator(mode="after")
    def _check_kind(self) -> "EnvConfig":
        web = (self.address or "").split("://", 1)[0] in ("http", "https", "ws", "wss")
        if self.kind == "grpc" and web:
            raise ValueError(f"env.address={self.address!r} is a web address: an OpenEnv server needs "
                             "env.kind=openenv (a gRPC environment is host:port)")
        if self.kind == "openenv" and self.name:
            raise ValueError(f"env.name={self.name!r} is served over gRPC by rlfleet; env.kind=openenv "
                             "reaches a running OpenEnv server at env.address instead")
        if self.kind == "grpc" and self.reward not in (None, "last"):
            raise ValueError(f"env.reward={self.reward} applies to env.kind=openenv; a gRPC environment "
                             "gives the episode's reward itself (leave env.reward unset)")
        return self

    @property
    def reward_mode(self) -> str:
        return self.reward or ("sum" if self.kind == "openenv" else "last")


class RewardConfig(ServiceEndpointConfig):
    fn: str = Field("auto", description="auto (choose by data_source), a built-in reward name "
                    "(gsm8k, math, code, …) or an import path pkg.module:function")
    model: RewardModelConfig = Field(default_factory=RewardModelConfig,
                                     description="an HF reward model served by the reward service")
    sources: list[RewardSourceConfig] = Field(default_factory=list, description="external servers, "
                                              "functions and the reward service, combined with weights; "
                                              "empty: the reward service alone")
    max_consecutive_failures: int = Field(1024, ge=0, description="stop the run after this many samples "
                                          "in a row got no reward from reward.sources; 0 never stops")
    fn_isolation: Literal["auto", "process", "none"] = Field(
        "auto", description="where reward.fn runs. auto: built-in rules of bounded cost (digits, gsm8k and "
        "its variants, arithmetic, exact_match, format, length_penalty, code, whose programs run in their "
        "own sandbox) in the reward service's process; math (sympy, no deadline) and your functions in the "
        "worker pool; process: every function in the pool; none: every function in-process (you mark "
        "yours safe)")
    fn_workers: int = Field(2, ge=1, le=256, description="worker processes that run reward.fn (and "
                            "each function source of reward.sources) in the reward service (isolated: a "
                            "hang or crash fails one item, not the service); started with the service "
                            "when reward.fn needs them")
    fn_timeout_s: float = Field(60.0, gt=0.0, le=3600.0, description="deadline of one item's reward.fn "
                                "(or function source) call; a late item is a failed item and its worker is "
                                "replaced")
    max_outage_s: float = Field(300.0, gt=0.0, le=86400.0, description="how long the run waits while no "
                                "reward source can score (reward service or an external server "
                                "unreachable, circuit open): admission pauses, generated groups wait; "
                                "after this the run stops with the cause")

    @model_validator(mode="after")
    def _check_sources(self) -> "RewardConfig":
        check_sources(self.sources)
        return self


class ControllerConfig(Section):
    host: str = Field("127.0.0.1", description="interface the controller's status service binds")
    port: int = Field(0, ge=0, le=65535, description="status service port; 0 picks a free one")
    max_steps: int = Field(40, ge=1, description="training steps (optimizer steps of the policy "
                           "version) to run")
    prompts_per_step: int = Field(8, ge=1, description="groups per optimizer step")
    max_staleness: int = Field(1, ge=0, description="a group generated by version v may be trained at "
                               "step s only while s - v <= max_staleness; 0 is synchronous on-policy")
    prompts_per_request: int | None = Field(
        None, ge=1, description="prompts sent in one Generate call; null: as many as fill a replica's "
        "rollout.max_batch_sequences (max_batch_sequences // n), at most prompts_per_step spread over the "
        "replicas")
    data_plane: Literal["inline", "flight"] = Field(
        "inline", description="how token ids and log-probs reach the learner: inline, through the "
        "controller on the Generate stream and in the Train request; flight, held by each rollout replica "
        "on an Arrow Flight server (rlfleet/dataplane), pushed to the learner's staging store as each group "
        "is generated (learner.staging_max_tokens) and fetched by the learner where not staged, the "
        "controller seeing ids, lengths, versions and rewards only (issue 44; not yet the default: "
        "docs/performance.md, "
        "'The data plane', says what is left)")
    rpc_timeout_s: float = Field(600.0, gt=0.0, description="deadline of one Generate/Score/Train call")
    connect_timeout_s: float = Field(120.0, gt=0.0, description="how long to wait for services to be ready")
    samples_per_step: int | None = Field(None, ge=0, description="samples written to samples/ per step; "
                                         "null writes all")
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus /metrics port; 0 picks a free one")
    eval_every: int = Field(0, ge=0, description="evaluate on data.val_files every N steps (and after the "
                            "last); logs val/<data_source>/accuracy; 0 never")
    eval_before_train: bool = Field(True, description="with eval_every: also evaluate the initial policy "
                                    "(step 0)")
    eval_n: int = Field(1, ge=1, le=1024, description="samples per validation prompt: 1 is greedy, more "
                        "sample at rollout.temperature and log pass@k")
    resume: str | None = Field(None, description="continue a run: `latest` (its newest complete "
                               "checkpoint) or a checkpoints/step_N folder; the learner, data cursor, groups "
                               "in flight, step numbering and metrics.jsonl all continue from there")
    service_wait_s: float = Field(300.0, gt=0.0, description="how long the loop waits for a failed "
                                  "service to come back (retrying) before it gives up")
    max_stall_s: float = Field(150.0, gt=0.0, le=86400.0, description="stop the run, with one line naming "
                               "why (groups dropped and the reason, environment failures by cause, replicas, "
                               "time on weight pushes) and a checkpoint of the last step, when no step "
                               "trained for this long; once steps run the limit is at least 10x the median "
                               "step time. An outage is bounded by its own reward.max_outage_s / "
                               "env.max_outage_s instead, a replica down or an empty fleet by "
                               "service_wait_s")


class JobConfig(Section):
    run: RunConfig = Field(default_factory=RunConfig,
                           description="the run's name, output folder, seed and logging")
    model: ModelConfig = Field(default_factory=ModelConfig,
                               description="the policy model every service loads")
    data: DataConfig = Field(default_factory=DataConfig,
                             description="the training prompts (Parquet files, or the built-in task)")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig,
                                   description="the rollout service: generation backend and sampling")
    reward: RewardConfig = Field(default_factory=RewardConfig,
                                 description="the reward service: reward function, reward model or "
                                             "weighted sources")
    learner: LearnerConfig = Field(default_factory=LearnerConfig,
                                   description="the learner service: optimizer, checkpoints, weight sync")
    env: EnvConfig = Field(default_factory=EnvConfig, description="an environment server for multi-turn "
                           "episodes (tools, games); none by default")
    controller: ControllerConfig = Field(default_factory=ControllerConfig,
                                         description="the GRPO loop: batch sizes, staleness, steps, fault "
                                                     "tolerance")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig,
                                     description="where metrics go besides metrics.jsonl: TensorBoard, "
                                                 "Weights & Biases")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig,
                                       description="the RL algorithm: preset and knobs (docs/algorithms.md)")
    security: SecurityConfig = Field(default_factory=SecurityConfig, description="TLS, mutual TLS and a "
                                     "bearer token on every gRPC server and channel (docs/security.md)")
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="largest requests services accept")

    @model_validator(mode="before")
    @classmethod
    def _load_plugins(cls, data: Any) -> Any:
        """Before any section is checked: a plugin may register a rollout engine, and `rollout` is
        validated before `algorithm` (whose own validator would import the plugins too late for it)."""
        if isinstance(data, dict) and isinstance(data.get("algorithm"), dict):
            load_plugins(data["algorithm"].get("plugins"))
        return data

    @model_validator(mode="after")
    def _check_consistency(self) -> "JobConfig":
        if self.rollout.n < 2:
            raise ValueError("rollout.n must be at least 2: GRPO compares samples within a group")
        if self.rollout.backend == "vllm" and self.learner.verify_weights:
            raise ValueError("learner.verify_weights compares weight digests, which vLLM's fused "
                             "layers do not allow; watch rollout/logprob_diff_mean instead")
        if self.learner.world_size > 1 and self.learner.lora.rank > 0:
            raise ValueError("learner.world_size > 1 does not support learner.lora yet")
        if self.controller.prompts_per_request is None:  # resolved here, so config.yaml says what ran
            self.controller.prompts_per_request = default_prompts_per_request(self)
        n, per_request = max(self.rollout.n, self.controller.eval_n), self.controller.prompts_per_request
        lim = self.limits
        if per_request > lim.max_prompts_per_request or n > lim.max_samples_per_prompt \
                or per_request * n > lim.max_sequences_per_request:
            raise ValueError(f"controller.prompts_per_request ({per_request}) x rollout.n ({n}) "
                             "exceeds limits.max_prompts_per_request, max_samples_per_prompt or "
                             "max_sequences_per_request: the rollout service would refuse the controller's "
                             "requests")
        if self.learner.weight_sync_timeout_s > lim.max_weight_timeout_s:
            raise ValueError(f"learner.weight_sync_timeout_s ({self.learner.weight_sync_timeout_s:g}) "
                             f"exceeds limits.max_weight_timeout_s ({lim.max_weight_timeout_s:g}): the "
                             "services would refuse the controller's weight-group requests")
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def default_prompts_per_request(cfg: JobConfig) -> int:
    """One Generate call fills a replica's batch (many rows in flight is what makes decoding fast on a
    GPU), and a step's prompts are spread over every replica."""
    replicas = max(cfg.rollout.replicas, len(cfg.rollout.addresses) + (1 if cfg.rollout.address else 0))
    per_replica = -(-cfg.controller.prompts_per_step // replicas)
    return max(1, min(cfg.rollout.max_batch_sequences // cfg.rollout.n, per_replica))


def known_keys(model: type[BaseModel] | None = None, prefix: str = "") -> list[str]:
    """Every key of the job config, dotted (`learner.lr`), sections' keys included."""
    keys = []
    for name, field in (model or JobConfig).model_fields.items():
        keys.append(prefix + name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys.extend(known_keys(field.annotation, f"{prefix}{name}."))
    return keys


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<root>"
        if not err["loc"]:
            lines.append(err["msg"].removeprefix("Value error, "))
        elif err["type"] == "extra_forbidden":
            lines.append(describe_unknown_key(key, err.get("input"), known_keys()))
        else:
            lines.append(f"{key} = {err.get('input')!r}: {err['msg']}")
    return "; ".join(lines)


def validate_config(data: dict[str, Any]) -> JobConfig:
    try:
        return JobConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config: {_format_errors(exc)}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> JobConfig:
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {yaml_problem(exc)}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections, not "
                              f"{type(loaded).__name__}")
        data = {k: ({} if v is None else v) for k, v in (loaded or {}).items()}
    return validate_config(apply_overrides(data, list(overrides or [])))
