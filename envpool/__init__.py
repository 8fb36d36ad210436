"""agentgym.envpool: environments and the subprocess pool that runs them for an actor.

    from agentgym.envpool.pool import EnvPool, EnvFailure      # asyncio side (actors)
    from agentgym.envpool.base import Env, StepResult          # writing an env
    from agentgym.envpool.registry import register_env         # naming it

Kept empty of imports on purpose: env worker subprocesses import this package and should start
with as little as possible.
"""
