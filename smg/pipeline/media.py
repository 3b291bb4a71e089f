"""The images of a Messages request, as bytes: the gateway's media pipeline (behaviors.md §F.14).

Only a user message's own image blocks count, in order: they are what the chat template renders
as image placeholders (an image inside a tool result is rendered as text, so it is not one). A
base64 source is decoded; a URL source is fetched by the gateway through `smg.fetch` (the
destination policy, `--fetch-allow`) within the request's media limits (`MediaConfig`): a count
of images checked before anything is fetched, one deadline and one byte budget for all of a
request's fetches, a size cap per image, a few fetches at a time. Only generation fetches:
count_tokens counts the placeholder and never reaches this module.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from smg.fetch import Budget, Fetcher, FetchError
from smg.fetch.policy import BadUrl
from smg.flags import option
from smg.protocol.content import Base64Source, ImageBlock, UrlSource
from smg.protocol.errors import ApiError

MAX_IMAGE_BYTES = 20 * 1024 * 1024  # one image, fetched or inline
FETCH_PARALLEL = 4  # a request's fetches in flight at once


@dataclass(frozen=True)
class MediaConfig:
    """A request's media limits (defaults: the Anthropic API's 100 images and 32 MB request)."""

    fetch_timeout_secs: float = field(
        default=10.0,
        metadata=option("--media-fetch-timeout-secs", "One deadline for all of a request's image URL fetches."),
    )
    fetch_max_bytes: int = field(
        default=32 * 1024 * 1024,
        metadata=option("--media-fetch-max-bytes", "Bytes a request's image URL fetches may bring in, together."),
    )
    max_items: int = field(
        default=100, metadata=option("--media-max-items", "Images one request may carry; more are refused.")
    )
    image_limit: int | None = field(
        default=None,
        metadata=option(
            "--mm-per-request-image-limit",
            "Images one request may carry for every model family, replacing each family's own limit "
            "(unset or 0: the family's).",
            envvar="SMG_IMAGE_MAX_COUNT",
            takes="str",
            parse=lambda value: _image_limit(value),
        ),
    )

    def check(self) -> None:
        """Raises `ValueError` for limits that cannot work."""
        if self.fetch_timeout_secs <= 0 or self.fetch_max_bytes <= 0 or self.max_items <= 0:
            raise ValueError("--media-fetch-timeout-secs, --media-fetch-max-bytes, --media-max-items: each above 0")


def _image_limit(value: str | None) -> int | None:
    """The reference gateway's rule for `SMG_IMAGE_MAX_COUNT`: unset, empty or zero leave each
    family's limit; anything but a count is refused at start."""
    if value is None or not str(value).strip():
        return None
    try:
        count = int(str(value).strip())
    except ValueError:
        raise ValueError(f"--mm-per-request-image-limit / SMG_IMAGE_MAX_COUNT takes a count, not {value!r}") from None
    if count < 0:
        raise ValueError(f"--mm-per-request-image-limit / SMG_IMAGE_MAX_COUNT takes a count, not {value!r}")
    return count or None


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


async def load_images(fetcher: Fetcher, blocks: Sequence[ImageBlock], limits: MediaConfig) -> list[MediaItem]:
    """Each image block's bytes, in order. Raises the request's 400 for the first image that
    fails; nothing is fetched when the request has more images than `limits` allow."""
    if len(blocks) > limits.max_items:
        raise processing_failed(f"The request has {len(blocks)} images; at most {limits.max_items} are accepted")
    out: list[MediaItem | None] = []
    urls: list[tuple[int, str]] = []
    for block in blocks:
        source = block.source
        if isinstance(source, Base64Source):
            out.append(decode_base64(source))
        elif isinstance(source, UrlSource):
            urls.append((len(out), source.url))
            out.append(None)
        else:
            raise ApiError(
                400,
                "Image sources of type 'file' are not supported by this gateway (it has no Files API)",
                code="invalid_multimodal_request",
            )
    if urls:
        budget = Budget(
            timeout_secs=limits.fetch_timeout_secs,
            max_bytes=limits.fetch_max_bytes,
            parallel=FETCH_PARALLEL,
            label="media",
        )
        fetched = await _fetch_all(fetcher, urls, budget, several=len(blocks) > 1)
        for index, item in fetched.items():
            out[index] = item
    return [item for item in out if item is not None]


async def _fetch_all(
    fetcher: Fetcher, urls: Sequence[tuple[int, str]], budget: Budget, *, several: bool
) -> dict[int, MediaItem]:
    """The URL images, fetched a few at a time; a failure cancels the rest (the earliest image that
    failed is the one reported)."""
    results: dict[int, MediaItem] = {}
    failures: dict[int, FetchError] = {}

    async def one(index: int, url: str) -> None:
        try:
            got = await fetcher.get(url, budget, max_bytes=MAX_IMAGE_BYTES)
        except FetchError as exc:
            failures[index] = exc
            raise
        results[index] = MediaItem(data=got.data, media_type=got.media_type, url=url)

    try:
        async with asyncio.TaskGroup() as group:
            for index, url in urls:
                group.create_task(one(index, url))
    except* FetchError:
        pass
    if failures:
        index = min(failures)
        error = failures[index]
        subject = f"image {index + 1}" if several else "image"
        code = "invalid_multimodal_request" if isinstance(error, BadUrl) else "multimodal_processing_failed"
        raise ApiError(400, error.describe(subject), code=code)
    return results
