"""The actor process, once its config is resolved: ``run_actor_process`` starts what the process
needs (the guardian, the allocator setting, logging) and plays for the learner until it is told
to stop.

    code = run_actor_process(cfg, run_dir, actor_id=None, log_level="info")

The command (``agentgym-actor``, agentgym/cli/actor.py) parses the command line and calls it.
uvloop, vLLM and torch are imported only when it runs, so ``--help`` answers at once.
Exit codes: 0 shut down by the learner or a signal, 2 rejected or misconfigured, 3 no learner.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentgym.config import Config


def run_actor_process(cfg: Config, run_dir: Path, *, actor_id: str | None, log_level: str) -> int:
    """Play for the learner of ``cfg`` until it stops this actor; returns the exit code.
    ``actor_id``: a stable id to resume as after a restart (None: a random one)."""
    import structlog
    import uvloop

    from agentgym.actors.runtime import run_actor
    from agentgym.actors.transport import ActorRejected, LearnerUnreachable
    from agentgym.auth.keys import KeyFileError
    from agentgym.host import early_signals
    from agentgym.host.allocator import keep_freed_memory
    from agentgym.host.guardian import start_guardian
    from agentgym.observe.logs import quiet_libraries, setup_logging

    start_guardian()  # vLLM's engine processes must not outlive a killed actor
    keep_freed_memory()  # each rollout's buffers are reused, not returned to the OS and faulted back in

    quiet_libraries(log_level)
    # The JSON log is named by actor id, as the console log of a local actor is (actor-local-0.*):
    # the id is what the learner's log names, and a restarted actor that reuses it appends.
    actor_id = actor_id or uuid.uuid4().hex[:12]
    safe_id = re.sub(r"[^\w.-]", "_", actor_id)  # a file name, whatever the id holds
    setup_logging("actor", run_dir / "logs" / f"actor-{safe_id}.jsonl", log_level)
    log = structlog.get_logger("agentgym.actor")
    try:
        return uvloop.run(run_actor(cfg, run_dir, actor_id))
    except LearnerUnreachable as exc:
        log.error("learner_unreachable", error=str(exc))
        return 3
    except (ActorRejected, FileNotFoundError, KeyFileError) as exc:
        log.error("actor_refused", error=str(exc))
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        early_signals.ignore_from_now()  # the loop's handlers are gone: a late SIGTERM must not end a clean stop
