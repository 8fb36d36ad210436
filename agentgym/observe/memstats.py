"""Peak memory of this process, for the learner's per-step metrics and the actors' heartbeats.

    from agentgym.observe.memstats import peak_memory
    metrics.update(peak_memory())   # {"peak_rss_mib": ..., ["cuda_max_allocated_mib": ...]}

RSS is the kernel's high-water mark (``getrusage``; Linux reports KiB). It counts this process
only: a vLLM engine core is a child process, so an actor adds its children's current RSS
(``engine_rss_mib``) when asked to. CUDA's figure is torch's ``max_memory_allocated`` when torch
is loaded and a GPU has been used; nothing is imported or initialised to measure it.
"""

from __future__ import annotations

import resource
import sys


def peak_memory(children: bool = False) -> dict[str, float]:
    out = {"peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if children:
        import psutil

        procs = psutil.Process().children(recursive=True)
        rss = 0
        for p in procs:
            try:
                rss += p.memory_info().rss
            except psutil.Error:  # a child that just exited has no memory to report
                continue
        out["children_rss_mib"] = round(rss / 2**20, 1)
    cuda = sys.modules.get("torch.cuda")
    try:
        if cuda is not None and cuda.is_available() and cuda.is_initialized():
            out["cuda_max_allocated_mib"] = round(cuda.max_memory_allocated() / 2**20, 1)
    except AttributeError:
        # torch is still being imported by another thread (an engine starting): no CUDA figure
        # this time; the next call has one.
        pass
    return out
