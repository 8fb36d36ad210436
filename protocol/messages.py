"""Every message that crosses between the learner and an actor, as typed msgspec structs.

The learner binds two ROUTER sockets; actors connect a DEALER to each (docs/adr/0002-topology.md):

control socket (actor DEALER <-> learner ROUTER)
    actor -> learner: Hello, Heartbeat, Rollout, Leave
    learner -> actor: Welcome, Reject, Heartbeat, Grant, Ack, WeightsReady, Shutdown
weights socket (actor DEALER <-> learner ROUTER, pull-based chunk server)
    actor -> learner: WeightRequest
    learner -> actor: WeightChunk (+ one raw data frame), WeightGone

Rules: new fields are appended with defaults; arrays are packed bytes (``protocol.arrays``);
``__post_init__`` checks what types alone cannot (matching array lengths), and msgspec reports
its errors with the path of the bad field.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import msgspec
from msgspec import Meta

from agentgym.protocol.arrays import F32, I32, U8, count
from agentgym.protocol.envworker import Option

NonNeg = Annotated[int, Meta(ge=0)]
Positive = Annotated[int, Meta(ge=1)]
EpisodeFinish = Literal["done", "turn_limit", "token_limit", "env_failure", "aborted"]
"""How an episode ended (``Episode.finish``)."""
Version = Annotated[int, Meta(ge=-1)]  # -1: no weights yet / not an agent token
ShortStr = Annotated[str, Meta(max_length=256)]
Text = Annotated[str, Meta(max_length=64 * 1024)]
ScalarMap = dict[ShortStr, float | int | bool | str]
OptionMap = dict[ShortStr, Option]
"""An env's options (protocol/envworker.py, ``Option``)."""


class Message(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Base of every message; ``KIND`` is the one-byte type id in the frame header."""

    KIND: ClassVar[int]


# ---------------------------------------------------------------- handshake and liveness


class Hello(Message):
    """First message of an actor (and again after a reconnect): who it is and what it runs."""

    KIND: ClassVar[int] = 1
    actor_id: ShortStr
    hostname: ShortStr
    pid: NonNeg
    model_fingerprint: ShortStr
    engine: ShortStr
    max_groups: Positive
    """How many groups (tickets) the actor can play at once."""
    session: ShortStr = ""
    """A nonce drawn once per actor process: a Hello under the id of a live actor with another
    session is refused by a learner without keys (a second process must not take over the id)."""


class CriticSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Critique in the loop (``[critic]`` in the config; docs/adr/0016-critique-in-the-loop.md)."""

    kind: Literal["oracle", "lm"] = "oracle"
    """"oracle": scripted from the env's privileged ``expert_action``; "lm": a language model."""
    when: Literal["every_turn", "after_failure", "episode_end"] = "after_failure"
    """"every_turn": reviews each proposed action before it is executed and the agent revises;
    "after_failure": speaks after an invalid or unrewarded step; "episode_end": after a failed
    episode the agent retries the task from the start with the critique in context."""
    max_revisions: Annotated[int, Meta(ge=1, le=16)] = 1
    """Critiques per turn ("every_turn"), or retries per episode ("episode_end")."""
    engine: Literal["hf", "vllm", "remote", "policy"] = "policy"
    """LM critic: "policy" critiques with the actor's own engine; hf/vllm load ``model``;
    remote asks the OpenAI-compatible server at ``url``."""
    model: Text = ""
    url: Text = ""
    max_tokens: Annotated[int, Meta(ge=1, le=4096)] = 48
    temperature: Annotated[float, Meta(gt=0.0)] = 0.7
    at_eval: bool = False
    """Also critique evaluation ("dev"/"test") tickets; off: evaluation measures the agent alone."""


class RolloutSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How actors play episodes; owned by the learner's config, sent in Welcome."""

    group_size: Positive
    max_tokens_per_turn: Positive
    max_episode_tokens: Positive
    temperature: Annotated[float, Meta(gt=0.0)]
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)]
    env_kwargs: dict[ShortStr, OptionMap] = {}
    """Options per environment name."""
    system_prompt: Text | None = None
    critic: CriticSpec | None = None
    """Critique in the loop; None: off."""
    allow_special_tokens: bool = False
    """False: actions never contain the tokenizer's special tokens other than EOS; the engine
    samples without them and the learner scores without them (protocol/vocab.py)."""


class LoraSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The learner trains LoRA adapters of this shape; every weight version is one adapter
    (peft names, ``...lora_A.weight`` / ``...lora_B.weight``) on the base model."""

    rank: Positive
    alpha: Annotated[float, Meta(gt=0.0)]
    target_modules: list[ShortStr]


class Welcome(Message):
    """The learner accepts an actor: its index, where to fetch weights, how to play."""

    KIND: ClassVar[int] = 2
    run_id: ShortStr
    actor_index: NonNeg
    weights_port: Annotated[int, Meta(ge=1, le=65535)]
    model_path: Text
    model_fingerprint: ShortStr
    mode: Literal["async", "sync"]
    heartbeat_interval_s: Annotated[float, Meta(gt=0)]
    actor_timeout_s: Annotated[float, Meta(gt=0)]
    rollout: RolloutSpec
    lora: LoraSpec | None = None
    """Set when the learner trains LoRA adapters: the engine must serve them (docs/adr/0012)."""


class Reject(Message):
    """The learner refuses an actor; ``field`` names the mismatching setting."""

    KIND: ClassVar[int] = 3
    field: ShortStr
    reason: Text


class Heartbeat(Message):
    """Liveness, both ways. From an actor it carries its state; from the learner its version."""

    KIND: ClassVar[int] = 4
    actor_id: ShortStr = ""
    weight_version: Version = -1
    running_groups: NonNeg = 0
    stats: ScalarMap = {}
    weights_digest: Annotated[int, Meta(ge=-1, lt=2**32)] = -1
    """Flight recorder: the digest of the weights the actor's engine serves (``weights_version``'s;
    protocol.weights.weights_digest), -1: not computed. The learner compares it with its export."""
    weights_version: Version = -1
    """The version ``weights_digest`` is of."""


class Leave(Message):
    """An actor goes away on purpose; its unfinished tickets go back to the pool."""

    KIND: ClassVar[int] = 9
    actor_id: ShortStr
    reason: Text
    handovers: list[Handover] = []
    """Groups it stopped mid-play, with what another actor needs to finish them (the learner
    puts each on its ticket when it goes back to the pool)."""


class Shutdown(Message):
    """The learner ends the run; actors finish cleanly and exit."""

    KIND: ClassVar[int] = 10
    reason: Text
    leave: bool = False
    """Only this actor is asked to go (``agentgym actors leave``): it leaves as on SIGTERM, handing
    its live episodes over in its ``Leave``, while the run goes on."""


# ---------------------------------------------------------------- work and trajectories


class Ticket(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One group to play: ``group_size`` episodes of one task."""

    group_id: ShortStr
    env: ShortStr
    task_id: NonNeg
    min_version: Version = -1
    """Sync mode: play only with weights of at least this version (-1: any)."""
    split: Literal["train", "dev", "test"] = "train"
    """Task split. "train": ``task_id`` is the task id itself. "dev"/"test" (evaluation, never
    trained on): ``task_id`` is an index into the env's ``tasks(split)``, resolved by the actor."""
    handover: Handover | None = None
    """Set on a ticket whose first actor left mid-play: continue its episodes (actors/play/handover.py)."""


class Grant(Message):
    """Credits: tickets the actor may play. Nothing is played without one (flow control)."""

    KIND: ClassVar[int] = 5
    tickets: list[Ticket]


class Episode(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One multi-turn episode as the learner trains on it, token by token.

    Arrays have one item per token: ``token_ids`` (int32), ``logprobs`` (float32 behaviour
    logprob, 0 on non-agent tokens), ``loss_mask`` (uint8, 1 on agent tokens), ``versions``
    (int32 weight version that generated the token, -1 on non-agent tokens).
    ``turn_ends`` (int32) is the exclusive end index of each agent turn, ``turn_rewards``
    (float32) the environment's reward after each turn.
    """

    token_ids: bytes
    logprobs: bytes
    loss_mask: bytes
    versions: bytes
    turn_ends: bytes
    turn_rewards: bytes
    reward: float
    success: bool
    finish: EpisodeFinish
    turn_limit: Positive
    failure: Text = ""
    critiques: bytes = b""
    """int32 ``(start, end)`` token spans of the messages that carry a critique (loss mask 0)."""
    segment_ends: bytes = b""
    """int32 exclusive ends of the episode's segments (empty: one segment, the whole episode).
    An agent conversation whose prompt stopped extending the previous call's tokens (a prefix
    break, actors/play/agent_trace.py) is laid out as segments end to end; each is trained as a
    sequence of its own, never attending to the one before."""
    prefix_breaks: NonNeg = 0
    """Calls of an agent conversation that did not extend the previous call's tokens."""
    resumed_at: NonNeg = 0
    """Tokens played by an actor that left before this one continued the episode from them
    (a hand-over, actors/play/handover.py); 0: one actor played it all."""

    def __post_init__(self) -> None:
        # Fast path: every rule below as one expression of lengths (the learner decodes every
        # rollout, so this runs per episode); only a failing episode walks the rules one by one
        # for the message naming what is wrong.
        nb = len(self.token_ids)
        if (
            not nb % 4
            and len(self.logprobs) == nb
            and len(self.versions) == nb
            and len(self.loss_mask) * 4 == nb
            and not len(self.turn_ends) % 4
            and len(self.turn_rewards) == len(self.turn_ends)
            and not len(self.critiques) % 8
            and not len(self.segment_ends) % 4
        ):
            return
        n = count(self.token_ids, I32)
        if len(self.critiques) % (2 * I32.itemsize):
            raise ValueError(
                f"critiques has {len(self.critiques)} bytes, not a whole number of int32 (start, end) pairs"
            )
        if len(self.segment_ends) % I32.itemsize:
            raise ValueError(f"segment_ends has {len(self.segment_ends)} bytes, not a multiple of 4")
        for name, data, dtype in (
            ("token_ids", self.token_ids, I32),
            ("logprobs", self.logprobs, F32),
            ("loss_mask", self.loss_mask, U8),
            ("versions", self.versions, I32),
            ("turn_ends", self.turn_ends, I32),
            ("turn_rewards", self.turn_rewards, F32),
        ):
            if len(data) % dtype.itemsize:
                raise ValueError(f"{name} has {len(data)} bytes, not a multiple of {dtype.itemsize}")
            if name in ("logprobs", "loss_mask", "versions") and count(data, dtype) != n:
                raise ValueError(f"{name} has {count(data, dtype)} items but token_ids has {n}")
        if count(self.turn_ends, I32) != count(self.turn_rewards, F32):
            raise ValueError("turn_ends and turn_rewards differ in length")

    @property
    def num_tokens(self) -> int:
        return count(self.token_ids, I32)

    @property
    def num_turns(self) -> int:
        return count(self.turn_ends, I32)

    @property
    def truncated(self) -> bool:
        """Cut by a limit (turns or tokens) rather than ended by the environment."""
        return self.finish in ("turn_limit", "token_limit")


class PartialEpisode(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """An episode stopped at a turn boundary by an actor that left: its arrays so far (as in
    ``Episode``; the tokens end with the next turn's generation prompt) and the env actions
    taken, which another actor replays on the same task to rebuild the env's state."""

    token_ids: bytes
    logprobs: bytes
    loss_mask: bytes
    versions: bytes
    turn_ends: bytes
    turn_rewards: bytes
    actions: list[Text]
    """One per turn so far, in order."""
    observation_sha256: ShortStr
    """sha256 (hex) of the last observation's text: a replay must reach it, else the episode
    is played again from the start."""
    turn_limit: Positive

    def __post_init__(self) -> None:
        n = count(self.token_ids, I32)
        for name, data, dtype in (
            ("logprobs", self.logprobs, F32),
            ("loss_mask", self.loss_mask, U8),
            ("versions", self.versions, I32),
        ):
            if count(data, dtype) != n:
                raise ValueError(f"{name} has {count(data, dtype)} items but token_ids has {n}")
        turns = count(self.turn_ends, I32)
        if count(self.turn_rewards, F32) != turns or len(self.actions) != turns:
            raise ValueError(
                f"turn_ends has {turns} items, turn_rewards {count(self.turn_rewards, F32)}, actions {len(self.actions)}"
            )


class Handover(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A group its actor stopped mid-play: the episodes it finished and where the others stand.
    The group's remaining episodes (group size less both lists) are played from the start."""

    group_id: ShortStr
    actor_id: ShortStr
    """The actor that played so far."""
    finished: list[Episode] = []
    partial: list[PartialEpisode] = []


class Rollout(Message):
    """A played ticket: the group's episodes. Kept by the actor until acknowledged."""

    KIND: ClassVar[int] = 6
    group_id: ShortStr
    actor_id: ShortStr
    env: ShortStr
    task_id: NonNeg
    episodes: list[Episode]
    elapsed_s: Annotated[float, Meta(ge=0)] = 0.0


AckStatus = Literal["accepted", "stale", "duplicate", "invalid", "failed", "eval", "filtered"]


class Ack(Message):
    """The learner took these rollouts (each with a status); the actor may forget them."""

    KIND: ClassVar[int] = 7
    group_ids: list[ShortStr]
    statuses: list[AckStatus]

    def __post_init__(self) -> None:
        if len(self.group_ids) != len(self.statuses):
            raise ValueError(f"group_ids has {len(self.group_ids)} items but statuses has {len(self.statuses)}")


# ---------------------------------------------------------------- weights


class WeightsReady(Message):
    """A new weight version (and the turn limits that go with it) can be fetched."""

    KIND: ClassVar[int] = 8
    version: NonNeg
    step: NonNeg
    turn_limit: Positive
    num_chunks: Positive
    total_bytes: NonNeg
    chunk_versions: list[NonNeg] = []
    """Per chunk, the newest version in which any of its tensors changed (empty: unknown, all
    changed). An actor that holds version v may skip chunks at <= v (protocol/weights.py)."""
    adapter: bool = False
    """The version is a LoRA adapter (Welcome.lora), not the model's weights."""
    turn_limits: dict[ShortStr, Positive] = {}
    """Per-env turn limits when the envs of a mix have different ones (``[schedule.envs]``, or
    success-driven stages); an env not listed plays ``turn_limit``. Empty: every env plays
    ``turn_limit`` (docs/adr/0017-curriculum.md)."""
    digest: Annotated[int, Meta(ge=-1, lt=2**32)] = -1
    """Flight recorder: ``protocol.weights.weights_digest`` of the version's tensors (-1: none)."""
    tensors: NonNeg = 0
    """How many tensors the version has (an update that loads them all can report a digest)."""


class WeightRequest(Message):
    """An actor asks for one chunk of a weight version."""

    KIND: ClassVar[int] = 11
    version: NonNeg
    chunk: NonNeg


class TensorMeta(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """Where one named tensor (or a slice of it) lies in a chunk's data frame."""

    name: ShortStr
    dtype: Literal["float32", "bfloat16", "float16"]
    shape: list[NonNeg]
    offset: NonNeg
    nbytes: NonNeg
    part_offset: NonNeg = 0
    """Where this slice begins in the whole tensor's bytes (a large tensor spans chunks)."""


class WeightChunk(Message):
    """Named tensors of one version; the bytes follow in the next frame, checked by crc32."""

    KIND: ClassVar[int] = 12
    version: NonNeg
    chunk: NonNeg
    num_chunks: Positive
    tensors: list[TensorMeta]
    crc32: Annotated[int, Meta(ge=0, lt=2**32)]
    nbytes: NonNeg

    def __post_init__(self) -> None:
        if self.chunk >= self.num_chunks:
            raise ValueError(f"chunk {self.chunk} out of range for num_chunks {self.num_chunks}")
        for t in self.tensors:
            if t.offset + t.nbytes > self.nbytes:
                raise ValueError(f"tensor {t.name!r} ends past the chunk's {self.nbytes} bytes")


class WeightGone(Message):
    """The requested version was superseded; fetch ``latest`` instead."""

    KIND: ClassVar[int] = 13
    version: NonNeg
    latest: NonNeg


MESSAGE_TYPES: tuple[type[Message], ...] = (
    Hello,
    Welcome,
    Reject,
    Heartbeat,
    Grant,
    Rollout,
    Ack,
    WeightsReady,
    Leave,
    Shutdown,
    WeightRequest,
    WeightChunk,
    WeightGone,
)
