"""``web_search``: a pluggable search backend over HTTP (httpx2).

Backends are small classes with ``async search(query, limit) -> list[WebResult]``; the one
shipped speaks the SearXNG JSON API (``GET {url}?q=...&format=json`` -> ``{"results":
[{"title", "url", "content"}]}``), which self-hosted meta-search servers expose. The
client is created on first use and closed by ``aclose``. The response is untrusted: a
non-JSON body, a wrong shape, an answer over MAX_RESPONSE_BYTES (read as a stream and cut off
there) or an HTTP error becomes a ToolError the model sees.
"""

from __future__ import annotations

from typing import Any

import msgspec

from protocol.tools import WebSearchConfig
from sidecar.tools.base import Tool, ToolContext, ToolError, ToolOutput, obj

__all__ = ["WebSearch", "SearxngBackend", "WebResult"]

MAX_RESPONSE_BYTES = 2 * 1024 * 1024


class WebResult(msgspec.Struct, kw_only=True):
    title: str = ""
    url: str = ""
    content: str = ""


class _SearxngResponse(msgspec.Struct):
    results: list[WebResult] = []


class SearxngBackend:
    def __init__(self, config: WebSearchConfig, transport: Any = None) -> None:
        self._config = config
        self._transport = transport
        self._client: Any = None

    async def search(self, query: str, limit: int) -> list[WebResult]:
        import httpx2

        if self._client is None:
            self._client = httpx2.AsyncClient(
                timeout=self._config.timeout_s, transport=self._transport, follow_redirects=True
            )
        body = bytearray()
        try:
            async with self._client.stream("GET", self._config.url, params={"q": query, "format": "json"}) as response:
                if response.status_code != 200:
                    raise ToolError(f"the search service answered HTTP {response.status_code}")
                # streamed with a budget: an endless or huge answer is cut off, never buffered whole
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_RESPONSE_BYTES:
                        raise ToolError("the search service sent an oversized answer")
        except httpx2.HTTPError as exc:
            raise ToolError(f"the search service could not be reached: {type(exc).__name__}") from None
        try:
            parsed = msgspec.json.decode(body, type=_SearxngResponse)
        except msgspec.DecodeError as exc:
            raise ToolError(f"the search service sent an answer that is not search results: {exc}") from None
        return parsed.results[:limit]

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class WebSearch(Tool):
    name = "web_search"
    description = "Search the web. Returns titles, URLs and short extracts of the top results."
    parameters = obj({"query": {"type": "string", "minLength": 1, "maxLength": 500}}, ["query"])
    source = "web"

    def __init__(self, backend: SearxngBackend, max_results: int) -> None:
        self._backend = backend
        self._max = max(1, min(max_results, 20))

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        results = await self._backend.search(args["query"], self._max)
        if not results:
            return ToolOutput(text=f"no web results for {args['query']!r}")
        return ToolOutput(
            text="\n\n".join(f"{i}. {r.title}\n{r.url}\n{r.content}" for i, r in enumerate(results, 1))
        )
