"""The learner's sockets at the default configuration: frame caps derived from the rollout limits
(control) and from what arrives (weights), a receive queue bounded in bytes. Real sockets: a
frame one byte over a cap never reaches the learner, the largest legitimate rollout does."""

from __future__ import annotations

import threading

import msgspec
import numpy as np
import trio
import zmq

from agentgym.config import load_config
from agentgym.host.netutil import free_port_pair
from agentgym.learner.control.bounds import MiB, SocketBounds
from agentgym.learner.transport import open_hub
from agentgym.protocol import Episode, Heartbeat, Rollout, WeightGone, WeightRequest, decode, encode
from agentgym.protocol.arrays import F32, I32, U8, pack


def largest_rollout(group_size: int, tokens: int) -> Rollout:
    """A group at the limits: every token its own turn, critique and segment; the longest failure text."""
    mask = np.ones(tokens, np.uint8)
    ep = Episode(
        token_ids=pack(np.full(tokens, 7), I32),
        logprobs=pack(np.full(tokens, -0.5), F32),
        loss_mask=pack(mask, U8),
        versions=pack(np.zeros(tokens), I32),
        turn_ends=pack(np.arange(1, tokens + 1), I32),
        turn_rewards=pack(np.zeros(tokens), F32),
        reward=0.0,
        success=False,
        finish="token_limit",
        turn_limit=tokens,
        failure="\U0001f600" * 65536,
        critiques=pack(np.arange(2 * tokens) // 2, I32),
    )
    return Rollout(group_id="r:0", actor_id="a", env="e", task_id=0, episodes=[ep] * group_size)


def test_default_frame_caps_follow_the_rollout_limits_and_refuse_one_byte_more() -> None:
    cfg = load_config(None, [])
    b = SocketBounds.from_config(cfg)
    big = encode(largest_rollout(cfg.rollout.group_size, cfg.rollout.max_episode_tokens))
    assert len(big[1]) <= b.group_bytes  # the largest legitimate group fits, with room
    assert b.group_bytes < b.control_frame < 256 * MiB and b.weights_frame == 4096
    assert b.inbox_messages * b.group_bytes <= cfg.learner.inbox_mib * MiB  # the queue, in bytes
    assert len(encode(WeightRequest(version=2**40, chunk=2**40))[1]) < b.weights_frame
    addr = f"tcp://127.0.0.1:{free_port_pair()}"
    got: list[object] = []
    ready, done, release = threading.Event(), threading.Event(), threading.Event()
    hwm: list[int] = []

    async def learner() -> None:
        async with open_hub(
            addr, max_msg_bytes=b.control_frame, weights_max_bytes=b.weights_frame, inbox_size=b.inbox_messages
        ) as hub:
            hwm.append(hub._control.getsockopt(zmq.RCVHWM))  # type: ignore[union-attr]  # the hub is open
            ready.set()
            with trio.move_on_after(120):
                async for _, msg in hub.inbox:
                    got.append(msg)
                    if isinstance(msg, Heartbeat):
                        break
            hwm.append(hub.bad_messages)  # the refused frames never reached the decoder
            done.set()
            # The weights port closes with the hub: keep it open until its requests are answered.
            await trio.to_thread.run_sync(release.wait, 120)

    t = threading.Thread(target=trio.run, args=(learner,), daemon=True)
    t.start()
    assert ready.wait(30) and hwm == [b.inbox_messages]
    ctx = zmq.Context()
    try:
        over = ctx.socket(zmq.DEALER)
        over.connect(addr)
        over.send_multipart([big[0], b"\0" * (b.control_frame + 1)])  # one byte over: dropped unread
        honest = ctx.socket(zmq.DEALER)
        honest.connect(addr)
        honest.send_multipart(big)
        honest.send_multipart(encode(Heartbeat(actor_id="a")))
        w = ctx.socket(zmq.DEALER)
        w.connect(f"{addr.rsplit(':', 1)[0]}:{int(addr.rsplit(':', 1)[1]) + 1}")
        w.send(b"\0" * (b.weights_frame + 1))  # over the weights port's cap: dropped, no answer
        w2 = ctx.socket(zmq.DEALER)
        w2.connect(f"{addr.rsplit(':', 1)[0]}:{int(addr.rsplit(':', 1)[1]) + 1}")
        w2.send_multipart(encode(WeightRequest(version=1, chunk=0)))
        assert w2.poll(30_000) and isinstance(decode(w2.recv_multipart())[0], WeightGone)  # a request is served
        assert not w.poll(500)
        release.set()
        assert done.wait(120)
        assert [type(m).__name__ for m in got] == ["Rollout", "Heartbeat"] and hwm[1] == 0
        assert msgspec.structs.asdict(got[0])["group_id"] == "r:0"
    finally:
        release.set()
        ctx.destroy(linger=0)
        t.join(10)
