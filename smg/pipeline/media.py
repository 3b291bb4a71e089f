"""The images of a Messages request, as bytes: the gateway's media pipeline (behaviors.md §F.14).

Only a user message's own image blocks count, in order: they are what the chat template renders
as image placeholders (an image inside a tool result is rendered as text, so it is not one). A
base64 source is decoded; a URL source is fetched by the gateway, capped in size and time. Only
generation fetches: count_tokens counts the placeholder and never reaches this module.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from smg.protocol.content import Base64Source, ImageBlock, UrlSource
from smg.protocol.errors import ApiError

MAX_IMAGE_BYTES = 20 * 1024 * 1024
FETCH_TIMEOUT_SECS = 10.0


def processing_failed(message: str) -> ApiError:
    return ApiError(400, message, code="multimodal_processing_failed")


@dataclass(frozen=True)
class MediaItem:
    """One image's bytes and where they came from (`url` for a fetched one)."""

    data: bytes
    media_type: str
    url: str | None = None

    @property
    def content_hash(self) -> bytes:
        return hashlib.sha256(self.data).digest()


def user_images(request: Any) -> list[ImageBlock]:
    """The image blocks of the user messages, in conversation order."""
    out: list[ImageBlock] = []
    for message in request.messages:
        if message.role != "user" or isinstance(message.content, str):
            continue
        out.extend(block for block in message.content if isinstance(block, ImageBlock))
    return out


def decode_base64(source: Base64Source) -> MediaItem:
    try:
        data = base64.b64decode(source.data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise processing_failed(f"Failed to decode base64 image data: {exc}") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise processing_failed(f"Image data exceeds {MAX_IMAGE_BYTES} bytes")
    return MediaItem(data=data, media_type=source.media_type)


async def fetch_url(client: httpx.AsyncClient, url: str) -> MediaItem:
    """An image URL's bytes; any failure (status, size, transport) is the request's 400."""
    if not url.startswith(("http://", "https://")):
        raise ApiError(400, f"Unsupported image URL scheme: {url}", code="invalid_multimodal_request")
    data = bytearray()
    try:
        async with client.stream("GET", url, timeout=FETCH_TIMEOUT_SECS, follow_redirects=True) as response:
            if response.status_code != 200:
                raise processing_failed(f"Failed to fetch image from {url}: HTTP {response.status_code}")
            async for chunk in response.aiter_bytes():
                data.extend(chunk)
                if len(data) > MAX_IMAGE_BYTES:
                    raise processing_failed(f"Image at {url} exceeds {MAX_IMAGE_BYTES} bytes")
            media_type = response.headers.get("content-type", "").split(";")[0].strip()
    except httpx.HTTPError as exc:
        raise processing_failed(f"Failed to fetch image from {url}: {exc or type(exc).__name__}") from None
    return MediaItem(data=bytes(data), media_type=media_type, url=url)


async def load_images(client: httpx.AsyncClient, blocks: Sequence[ImageBlock]) -> list[MediaItem]:
    """Each image block's bytes, in order."""
    out: list[MediaItem] = []
    for block in blocks:
        source = block.source
        if isinstance(source, Base64Source):
            out.append(decode_base64(source))
        elif isinstance(source, UrlSource):
            out.append(await fetch_url(client, source.url))
        else:
            raise ApiError(
                400,
                "Image sources of type 'file' are not supported by this gateway (it has no Files API)",
                code="invalid_multimodal_request",
            )
    return out
