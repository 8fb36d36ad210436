"""An inference server that already runs, as an engine: OpenAI-compatible completions over HTTP.

    engine = RemoteEngine("http://gpu-node-3:8000", weights_dir=Path("/shared/agentgym-weights"))
    await engine.start()                       # waits for /health, reads the served model
    gen = await engine.generate("g/0/0", prompt_ids, SamplingSpec(max_tokens=32))
    await engine.update_weights(tensors, version=1)
    await engine.close()                       # closes the connections; the server keeps running

Generation: ``POST /v1/completions`` with the prompt as token ids, streamed (``stream: true``),
``logprobs: 0`` (the sampled token's logprob only) and vLLM's ``return_token_ids: true`` (each
chunk carries its token ids, so nothing is re-tokenized); ``return_tokens_as_token_ids`` is a
fallback for servers that only name tokens as ``token_id:N`` in the logprobs. Streaming makes
an abort exact: closing the stream stops the request on the server (vLLM aborts a request whose
client went away) and the tokens received so far are the result.

Weight updates: the tensors are written as ``model.safetensors`` into a fresh directory under
``weights_dir``, which the server must be able to read at the same path (same host: the
default, a directory on ``/dev/shm``; other hosts: a shared filesystem). Then:
- vLLM (started with ``VLLM_SERVER_DEV_MODE=1``, which enables its RL endpoints):
  ``POST /pause?mode=wait``, ``POST /collective_rpc {"method": "reload_weights", "kwargs":
  {"weights_path": DIR}}`` (the worker's in-place layer-wise reload), ``POST
  /reset_prefix_cache``, ``POST /resume``.
- SGLang: ``POST /update_weights_from_disk {"model_path": DIR}`` (pauses, loads, flushes the
  cache). Written from SGLang's documented API and not exercised here.
The server must sample-and-report what the learner recomputes: for vLLM, start it with
``--logprobs-mode processed_logprobs`` (``start()`` checks it with a one-token request).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import structlog

from agentgym.actors.engines.engine import (
    EngineLoad,
    GatedEngine,
    Generation,
    SamplingSpec,
    UpdateMode,
    safetensors_files,
)

if TYPE_CHECKING:
    import torch

log = structlog.get_logger(__name__)

ServerKind = Literal["vllm", "sglang"]
_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


class RemoteError(RuntimeError):
    """The server answered with an error or with something this engine cannot use."""


class RemoteEngine(GatedEngine):
    """``InferenceEngine`` over an OpenAI-compatible server (vLLM's or SGLang's)."""

    def __init__(
        self,
        url: str,
        *,
        server: ServerKind = "vllm",
        model: str | None = None,
        weights_dir: Path | None = None,
        api_key: str | None = None,
        start_timeout_s: float = 300.0,
        request_timeout_s: float = 600.0,
        metrics_interval_s: float = 1.0,
        update_mode: UpdateMode = "resume",
    ) -> None:
        super().__init__(update_mode)
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"RemoteEngine: url must start with http:// or https://, got {url!r}")
        if server not in ("vllm", "sglang"):
            raise ValueError(f"RemoteEngine: server must be 'vllm' or 'sglang', got {server!r}")
        self.url = url.rstrip("/")
        self.server: ServerKind = server
        self.model = model
        self.weights_dir = Path(weights_dir) if weights_dir is not None else None
        self.api_key = api_key
        self.start_timeout_s = start_timeout_s
        self.request_timeout_s = request_timeout_s
        self.metrics_interval_s = metrics_interval_s
        self.max_model_len: int | None = None
        self._client: Any = None
        self._streams: dict[str, asyncio.Task[None]] = {}
        self._kv_usage = 0.0
        self._poller: asyncio.Task[None] | None = None
        self._own_weights_dir = False
        self._last_weights: Path | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        import httpx

        if self._client is not None:
            raise RuntimeError("RemoteEngine.start: already started")
        t0 = time.monotonic()
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._client = httpx.AsyncClient(
            base_url=self.url, headers=headers, limits=limits, timeout=httpx.Timeout(self.request_timeout_s, connect=10)
        )
        try:
            await self._wait_healthy(t0)
            models = (await self._call("GET", "/v1/models"))["data"]
            served = {m["id"]: m for m in models}
            if self.model is None:
                if not served:
                    raise RemoteError(f"RemoteEngine: {self.url}/v1/models lists no model")
                self.model = next(iter(served))
            elif self.model not in served:
                raise RemoteError(f"RemoteEngine: {self.url} serves {sorted(served)}, not {self.model!r}")
            self.max_model_len = served[self.model].get("max_model_len")
            await self._check_logprobs_mode()
        except BaseException:
            await self._client.aclose()
            self._client = None
            raise
        if self.weights_dir is None:
            shm = Path("/dev/shm")
            self.weights_dir = Path(tempfile.mkdtemp(prefix="agentgym-remote-", dir=shm if shm.is_dir() else None))
            self._own_weights_dir = True
        self._poller = asyncio.create_task(self._poll_metrics())
        log.info(
            "engine_started",
            engine="remote",
            url=self.url,
            server=self.server,
            model=self.model,
            max_model_len=self.max_model_len,
            seconds=round(time.monotonic() - t0, 1),
        )

    async def _wait_healthy(self, t0: float) -> None:
        import httpx

        last: object = None
        while time.monotonic() - t0 < self.start_timeout_s:
            try:
                r = await self._client.get("/health", timeout=5)
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}"
            except httpx.TransportError as exc:
                last = exc
            await asyncio.sleep(0.5)
        raise TimeoutError(f"RemoteEngine: {self.url}/health not OK within {self.start_timeout_s} s (last: {last!r})")

    async def _check_logprobs_mode(self) -> None:
        """The learner needs the logprobs of the distribution sampled from (after temperature
        and top-p); vLLM reports raw ones unless started with ``--logprobs-mode
        processed_logprobs``. A nucleus of one token tells the two apart: its processed
        logprob is exactly 0, a raw one is below 0."""
        body = {
            "model": self.model,
            "prompt": [0],
            "max_tokens": 1,
            "temperature": 1.0,
            "top_p": 1e-9,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        out = await self._call("POST", "/v1/completions", json=body)
        _, lps = _chunk_tokens("logprobs-mode-check", out["choices"][0])
        if not lps or lps[0] < -1e-6:
            raise RemoteError(
                f"RemoteEngine: {self.url} reports raw logprobs (before temperature and top-p): start vLLM "
                "with --logprobs-mode processed_logprobs so behaviour logprobs match what the learner recomputes"
            )

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        for req in self._requests.values():
            req.aborted = True
        self._gate.wake()
        for task in list(self._streams.values()):
            task.cancel()
        while self._requests:
            await asyncio.sleep(0.005)
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        await client.aclose()
        if self._own_weights_dir and self.weights_dir is not None:
            shutil.rmtree(self.weights_dir, ignore_errors=True)
        log.info("engine_closed", engine="remote", url=self.url)

    def _require(self) -> Any:
        if self._client is None:
            raise RuntimeError("RemoteEngine: not started (call `await engine.start()` first) or already closed")
        return self._client

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        r = await self._require().request(method, path, **kwargs)
        if r.status_code != 200:
            raise RemoteError(f"RemoteEngine: {method} {self.url}{path} -> HTTP {r.status_code}: {r.text[:500]}")
        return r.json() if r.content else None

    # ------------------------------------------------------------------ backend half (GatedEngine)
    def _check_prompt(self, request_id: str, prompt_ids: list[int]) -> None:
        super()._check_prompt(request_id, prompt_ids)
        self._require()
        if self.max_model_len is not None and len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"RemoteEngine.generate({request_id!r}): prompt of {len(prompt_ids)} tokens does not "
                f"fit the server's max_model_len={self.max_model_len}"
            )

    async def _generate(self, segment_id: str, prompt_ids: list[int], spec: SamplingSpec) -> Generation:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt_ids),
            "max_tokens": spec.max_tokens,
            "temperature": spec.temperature,
            "top_p": spec.top_p,
            "stop_token_ids": list(spec.stop_token_ids),
            "logprobs": 0,
            "stream": True,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "request_id": segment_id,
        }
        if spec.seed is not None:
            body["seed"] = spec.seed
        if spec.banned_token_ids:  # protocol/vocab.py; the server applies it before its logprobs
            body["logit_bias"] = {str(i): -100 for i in spec.banned_token_ids}
        acc: dict[str, Any] = {"ids": [], "logprobs": [], "finish": None}
        task = asyncio.create_task(self._stream(segment_id, body, acc))
        self._streams[segment_id] = task
        try:
            await task
        except asyncio.CancelledError:
            if not task.cancelled() or asyncio.current_task().cancelling():  # type: ignore[union-attr]  # run in a task: current_task() is one
                raise  # the caller was cancelled, not the stream
            acc["finish"] = "abort"
        finally:
            self._streams.pop(segment_id, None)
        if acc["finish"] is None:
            raise RemoteError(f"RemoteEngine.generate({segment_id!r}): the stream ended without a finish reason")
        return Generation(acc["ids"], acc["logprobs"], self.version, acc["finish"])

    async def _stream(self, segment_id: str, body: dict[str, Any], acc: dict[str, Any]) -> None:
        async with self._require().stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                raise RemoteError(f"RemoteEngine.generate({segment_id!r}): HTTP {r.status_code}: {text[:500]}")
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise RemoteError(f"RemoteEngine.generate({segment_id!r}): server error {chunk['error']}")
                for choice in chunk.get("choices", []):
                    ids, lps = _chunk_tokens(segment_id, choice)
                    acc["ids"] += ids
                    acc["logprobs"] += lps
                    if choice.get("finish_reason") is not None:
                        reason = _FINISH.get(choice["finish_reason"])
                        if reason is None:
                            raise RemoteError(
                                f"RemoteEngine.generate({segment_id!r}): unexpected finish reason "
                                f"{choice['finish_reason']!r}"
                            )
                        acc["finish"] = reason

    async def _abort(self, segment_id: str) -> None:
        # Closing the stream ends the request on the server; what arrived so far is the result.
        task = self._streams.get(segment_id)
        if task is not None:
            task.cancel()

    def load(self) -> EngineLoad:
        running, waiting = self._in_flight()
        return EngineLoad(running, waiting, self._kv_usage if running else 0.0)

    async def _poll_metrics(self) -> None:
        """KV-cache use from the server's Prometheus metrics (shared with its other clients)."""
        names = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
        warned = False
        while True:
            try:
                r = await self._require().get("/metrics", timeout=5)
                for line in r.text.splitlines():
                    if line.startswith(names):
                        self._kv_usage = float(line.rsplit(" ", 1)[-1])
                        break
            except Exception as exc:  # noqa: BLE001 - metrics are best effort, never fatal
                if not warned:
                    log.warning("remote_metrics_unavailable", url=self.url, error=repr(exc))
                    warned = True
            await asyncio.sleep(self.metrics_interval_s)

    # ------------------------------------------------------------------ weights
    async def _prepare_weights(self, tensors: Mapping[str, torch.Tensor] | Path) -> Path:
        """The server reads a directory of safetensors: the given one, or the tensors written to
        a fresh one under ``weights_dir`` (outside the gate: generation goes on meanwhile)."""
        self._require()
        if isinstance(tensors, (str, Path)):
            files = safetensors_files(Path(tensors), "RemoteEngine.update_weights")
            return files[0].parent
        from agentgym.actors.engines.weight_files import save_safetensors

        assert self.weights_dir is not None
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        out = Path(tempfile.mkdtemp(prefix="v", dir=self.weights_dir))
        await asyncio.to_thread(save_safetensors, tensors, out / "model.safetensors")
        return out

    async def _load_weights(self, prepared: object) -> int:
        path = str(Path(prepared).resolve())  # type: ignore[arg-type]  # what _prepare_weights returned: a path
        if self.server == "vllm":
            await self._call("POST", "/pause", params={"mode": "wait"})
            try:
                await self._call(
                    "POST", "/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": path}}
                )
                await self._call("POST", "/reset_prefix_cache")
            finally:
                await self._call("POST", "/resume")
        else:
            out = await self._call("POST", "/update_weights_from_disk", json={"model_path": path})
            if isinstance(out, dict) and out.get("success") is False:
                raise RemoteError(f"RemoteEngine: SGLang refused the weights at {path}: {out.get('message')}")
        # The server now names this directory as its model: keep it until the next update.
        previous, self._last_weights = self._last_weights, Path(path)
        if previous is not None and previous != self._last_weights and self.weights_dir in previous.parents:
            shutil.rmtree(previous, ignore_errors=True)
        return -1  # the servers do not say how many tensors they loaded


def _chunk_tokens(segment_id: str, choice: dict[str, Any]) -> tuple[list[int], list[float]]:
    """Token ids and sampled-token logprobs of one streamed choice."""
    lp = choice.get("logprobs") or {}
    lps = [float(x) for x in lp.get("token_logprobs") or []]
    ids = choice.get("token_ids")
    if ids is None:  # servers without return_token_ids: tokens named "token_id:N"
        names = lp.get("tokens") or []
        if not all(isinstance(t, str) and t.startswith("token_id:") for t in names):
            raise RemoteError(
                f"RemoteEngine.generate({segment_id!r}): the server returns neither token ids "
                "(return_token_ids) nor token_id:N names; it cannot serve token-exact episodes"
            )
        ids = [int(t.split(":", 1)[1]) for t in names]
    if len(ids) != len(lps):
        raise RemoteError(
            f"RemoteEngine.generate({segment_id!r}): {len(ids)} tokens but {len(lps)} logprobs in a chunk"
        )
    return [int(t) for t in ids], lps
