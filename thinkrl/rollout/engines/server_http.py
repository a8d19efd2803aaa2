"""JSON over HTTP to a vLLM server (rollout.engine=vllm_server), with the failures a run can meet as one line.

Standard library only (urllib), so the trainer needs no HTTP package. A server that refuses the connection, times
out or answers 5xx is gone or stuck: `ServerGone`, a UserError that names the URL, how to restart it and how to
continue (`thinkrl train --resume RUN_DIR` once a checkpoint stands, else the same command again). A 4xx answer
is a request the server refused (a LoRA rank over its --max-lora-rank, an adapter it does not hold):
`ServerRefused`, with its message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from thinkrl.errors import UserError


class ServerGone(UserError):
    """The server did not answer (connection refused or reset, timeout, 5xx)."""


class ServerRefused(UserError):
    """The server answered and refused the request (4xx)."""


class ServerClient:
    """One server's base URL, the seconds to wait for an answer, and what to tell the user when it stops answering:
    `restart` is how to start it again, `then` how to continue the run, asked when it fails (a run with no checkpoint
    yet has nothing to resume)."""

    def __init__(self, url: str, timeout: float, restart: str = "thinkrl serve CONFIG", then: Callable[[], str] | None = None) -> None:
        self.url, self.timeout, self.restart, self.then = url.rstrip("/"), timeout, restart, then

    def get(self, path: str, doing: str, timeout: float | None = None) -> Any:
        return self._call(urllib.request.Request(self.url + path), doing, timeout)

    def post(self, path: str, body: dict, doing: str, timeout: float | None = None) -> Any:
        data = json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"}, method="POST")
        return self._call(request, doing, timeout)

    def health(self, timeout: float) -> None:
        """GET /health within `timeout` seconds, or one line saying the server is not there and how to start it."""
        self.get("/health", "the health check at start", timeout)

    def _call(self, request: urllib.request.Request, doing: str, timeout: float | None) -> Any:
        wait = self.timeout if timeout is None else timeout
        try:
            with urllib.request.urlopen(request, timeout=wait) as answer:
                text = answer.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:  # an answer with an error status: read what the server said
            said = _message(e.read().decode("utf-8", "replace"))
            if e.code >= 500:
                raise self.gone(doing, f"it answered {e.code}: {said}") from None
            raise ServerRefused(f"the vLLM server at {self.url} refused {doing} ({e.code}): {said}") from None
        except (urllib.error.URLError, OSError) as e:  # refused, reset, timed out (OSError covers TimeoutError)
            reason = getattr(e, "reason", e)
            if isinstance(reason, TimeoutError):
                raise self.gone(doing, f"no answer within {wait:g} s, rollout.server_timeout") from None
            raise self.gone(doing, f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason) from None
        try:
            return json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            return text  # /health and the adapter endpoints answer plain text

    def gone(self, doing: str, why: str) -> ServerGone:
        then = f"; {self.then()}" if self.then is not None else ""
        return ServerGone(f"the vLLM server at {self.url} stopped answering during {doing} ({why}); start it again ({self.restart}){then}")


def _message(body: str, limit: int = 300) -> str:
    """The error message of a vLLM / OpenAI-style error body ({"error": {"message": ...}}), else the body, cut."""
    try:
        said = json.loads(body)
    except json.JSONDecodeError:
        said = body.strip() or "no message"
    if isinstance(said, dict):
        inner = said.get("error", said)
        said = (inner.get("message") or inner) if isinstance(inner, dict) else inner
    text = " ".join(str(said).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
