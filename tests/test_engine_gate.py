"""The engine-agnostic parts of actors/engines/engine.py: the version gate and the data types."""

from __future__ import annotations

import asyncio

import pytest

from agentgym.actors.engines.engine import GateAbandoned, Generation, SamplingSpec, VersionGate


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_update_waits_for_requests_in_flight_and_holds_back_new_ones() -> None:
    async def scenario() -> list[str]:
        gate, events = VersionGate(), []
        release = asyncio.Event()

        async def request(name: str) -> None:
            async with gate.read():
                events.append(f"{name}+")
                await release.wait()
                events.append(f"{name}-")

        async def update() -> None:
            async with gate.write():
                events.append("update")

        first = [asyncio.create_task(request(n)) for n in ("a", "b")]
        await asyncio.sleep(0)
        writer = asyncio.create_task(update())
        await asyncio.sleep(0)
        late = asyncio.create_task(request("c"))  # arrives while the update waits
        await asyncio.sleep(0.01)
        assert events == ["a+", "b+"] and gate.writers_waiting == 1 and gate.readers_waiting == 1
        release.set()
        await asyncio.gather(*first, writer, late)
        assert (gate.readers, gate.writing, gate.writers_waiting, gate.readers_waiting) == (0, False, 0, 0)
        return events

    events = run(scenario())
    assert sorted(events[:4]) == ["a+", "a-", "b+", "b-"]
    assert events[4:] == ["update", "c+", "c-"]


def test_a_cancelled_update_lets_waiting_requests_through() -> None:
    async def scenario() -> None:
        gate = VersionGate()
        inside = asyncio.Event()
        done = asyncio.Event()

        async def long_request() -> None:
            async with gate.read():
                inside.set()
                await done.wait()

        async def update() -> None:
            async with gate.write():
                pass

        holder = asyncio.create_task(long_request())
        await inside.wait()
        writer = asyncio.create_task(update())
        await asyncio.sleep(0)
        reader = gate.read()
        blocked = asyncio.create_task(reader.__aenter__())
        await asyncio.sleep(0.01)
        assert not blocked.done()
        writer.cancel()
        await asyncio.wait_for(blocked, 1)  # the writer gave up: the reader gets in
        assert gate.writers_waiting == 0 and gate.readers == 2
        await reader.__aexit__(None, None, None)
        done.set()
        await holder
        assert gate.readers == 0

    run(scenario())


def test_a_waiting_request_can_give_up() -> None:
    async def scenario() -> None:
        gate = VersionGate()
        stop = False
        async with gate.write():

            async def request() -> None:
                async with gate.read(give_up=lambda: stop):
                    raise AssertionError("must not get in")

            task = asyncio.create_task(request())
            await asyncio.sleep(0.01)
            assert gate.readers_waiting == 1
            stop = True
            gate.wake()
            with pytest.raises(GateAbandoned):
                await task
        assert (gate.readers, gate.readers_waiting, gate.writing) == (0, 0, False)

    run(scenario())


def test_sampling_spec_and_generation_validate() -> None:
    with pytest.raises(ValueError, match="max_tokens must be >= 1, got 0"):
        SamplingSpec(max_tokens=0)
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingSpec(max_tokens=1, top_p=0.0)
    with pytest.raises(ValueError, match="temperature must be >= 0, got -1"):
        SamplingSpec(max_tokens=1, temperature=-1)
    with pytest.raises(ValueError, match="2 token ids but 1 logprobs"):
        Generation([1, 2], [-0.1], 0, "stop")
