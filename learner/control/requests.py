"""Operator requests to a running learner: files in its run directory, read once a heartbeat.

    agentgym actors leave ACTOR_ID --run RUN_DIR     # writes RUN_DIR/requests/leave/ACTOR_ID
    for actor_id, answer in leave_requests(run_dir):  # the learner's reaper, every heartbeat
        ...; answer({"status": "sent"})               # -> RUN_DIR/requests/leave/ACTOR_ID.done

Why files: whoever may write the run directory may steer the run (the same trust as its
checkpoints), it needs no port, no key and no client of the learner's control socket (which
admits actors only), and it works where the operator is: the learner's host, or any node of a
cluster that mounts the run directory. A request is answered by a ``.done`` file next to it
(JSON: ``status`` and what the learner knew); the command waits for it, then for the actor's
``actor_left`` in the learner's log.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

LEAVE_DIR = Path("requests") / "leave"


def check_actor_id(actor_id: str) -> str:
    """An actor id usable as a file name here; raises ValueError naming what is wrong."""
    if not actor_id or "/" in actor_id or "\0" in actor_id or actor_id.startswith(".") or actor_id.endswith(".done"):
        raise ValueError(f"actor id {actor_id!r}: expected a non-empty id without '/', not starting with '.'")
    return actor_id


def ask_leave(run_dir: Path, actor_id: str) -> Path:
    """Write the request (atomically: the learner never reads half of it); returns the answer's path."""
    d = run_dir / LEAVE_DIR
    d.mkdir(parents=True, exist_ok=True)
    done = d / f"{check_actor_id(actor_id)}.done"
    done.unlink(missing_ok=True)  # an answer to an earlier request is not this one's
    tmp = d / f".{actor_id}.{os.getpid()}"
    tmp.write_text("")
    tmp.rename(d / actor_id)
    return done


def leave_requests(run_dir: Path) -> Iterator[tuple[str, Callable[[dict[str, object]], None]]]:
    """Pending leave requests: (actor id, answer). ``answer`` writes the ``.done`` file and removes
    the request, so each is served once."""
    d = run_dir / LEAVE_DIR
    if not d.is_dir():
        return
    for req in sorted(d.iterdir()):
        if req.name.startswith(".") or req.name.endswith(".done") or not req.is_file():
            continue

        def answer(body: dict[str, object], req: Path = req) -> None:
            tmp = req.with_name(f".{req.name}.done")
            tmp.write_text(json.dumps(body))
            tmp.rename(req.with_name(f"{req.name}.done"))
            req.unlink(missing_ok=True)

        yield req.name, answer
