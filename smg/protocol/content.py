"""Input content blocks of the Messages API: the twelve block types a request may carry in
`messages[].content` and the text blocks of `system`.

Blocks are tolerant of keys they do not model (kept in `model_extra` and re-serialized), and
every block takes a `cache_control` of any shape; an unknown block `type` is refused. Required
fields are the public API's (behaviors.md B.3).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictStr,
    Tag,
)

# Tags of the string-or-structure unions below. They only route validation, so the error
# formatter strips them from error locations (`messages.0.content.0...`, not `...content.<list>.0`).
STR_TAG = "<str>"
LIST_TAG = "<list>"
OBJECT_TAG = "<object>"
HIDDEN_TAGS: frozenset[str] = frozenset({STR_TAG, LIST_TAG, OBJECT_TAG})

CacheControl = dict[str, Any]


def _shape(value: Any) -> str | None:
    if isinstance(value, str):
        return STR_TAG
    if isinstance(value, list):
        return LIST_TAG
    # Model instances come in when serializing.
    if isinstance(value, dict | BaseModel):
        return OBJECT_TAG
    return None


def str_or_list() -> Discriminator:
    """Route a string-or-array union (see `HIDDEN_TAGS`)."""
    return Discriminator(
        _shape,
        custom_error_type="str_or_list_type",
        custom_error_message="Input should be a valid string or array",
    )


def list_or_object() -> Discriminator:
    """Route an array-or-object union (see `HIDDEN_TAGS`)."""
    return Discriminator(
        _shape,
        custom_error_type="list_or_dict_type",
        custom_error_message="Input should be a valid array or object",
    )


def str_or_object() -> Discriminator:
    """Route a string-or-object union (see `HIDDEN_TAGS`)."""
    return Discriminator(
        _shape,
        custom_error_type="str_or_dict_type",
        custom_error_message="Input should be a valid string or object",
    )


class TypedModel(BaseModel):
    """A model whose literal `type` discriminator always counts as set.

    Round trips use `exclude_unset`; a block built in code with the default `type` must still
    serialize it, or the re-serialized block loses its discriminator.
    """

    model_config = ConfigDict(extra="allow")

    def model_post_init(self, context: Any, /) -> None:
        if "type" in type(self).model_fields:
            self.__pydantic_fields_set__.add("type")


class _Block(TypedModel):
    cache_control: CacheControl | None = None


# --- sources -------------------------------------------------------------------------------


class Base64Source(TypedModel):
    type: Literal["base64"] = "base64"
    media_type: StrictStr
    data: StrictStr


class UrlSource(TypedModel):
    type: Literal["url"] = "url"
    url: StrictStr


class FileSource(TypedModel):
    type: Literal["file"] = "file"
    file_id: StrictStr


class PlainTextSource(TypedModel):
    type: Literal["text"] = "text"
    data: StrictStr
    media_type: StrictStr | None = None


class ContentSource(TypedModel):
    type: Literal["content"] = "content"
    content: Annotated[
        Annotated[StrictStr, Tag(STR_TAG)] | Annotated[list[InputBlock], Tag(LIST_TAG)],
        str_or_list(),
    ]


ImageSource = Annotated[Base64Source | UrlSource | FileSource, Field(discriminator="type")]
DocumentSource = Annotated[
    Base64Source | PlainTextSource | UrlSource | ContentSource | FileSource,
    Field(discriminator="type"),
]


# --- blocks --------------------------------------------------------------------------------


class TextBlock(_Block):
    type: Literal["text"] = "text"
    text: StrictStr
    citations: list[dict[str, Any]] | None = None


class ImageBlock(_Block):
    type: Literal["image"] = "image"
    source: ImageSource


class CitationsConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    enabled: StrictBool | None = None


class DocumentBlock(_Block):
    type: Literal["document"] = "document"
    source: DocumentSource
    title: StrictStr | None = None
    context: StrictStr | None = None
    citations: CitationsConfig | None = None

    def source_text(self) -> str | None:
        """The document's text when its source carries any (`text` or `content` sources)."""
        source = self.source
        if isinstance(source, PlainTextSource):
            return source.data
        if isinstance(source, ContentSource):
            if isinstance(source.content, str):
                return source.content
            parts = [b.text for b in source.content if isinstance(b, TextBlock)]
            return "\n".join(parts) if parts else None
        return None


class ToolUseBlock(_Block):
    type: Literal["tool_use"] = "tool_use"
    id: StrictStr
    name: StrictStr
    input: Any
    caller: dict[str, Any] | None = None


class SearchResultBlock(_Block):
    type: Literal["search_result"] = "search_result"
    source: StrictStr
    title: StrictStr
    content: list[TextBlock]
    citations: CitationsConfig | None = None


class ToolReferenceBlock(_Block):
    type: Literal["tool_reference"] = "tool_reference"
    tool_name: StrictStr
    description: StrictStr | None = None


ToolResultContentBlock = Annotated[
    TextBlock | ImageBlock | DocumentBlock | SearchResultBlock | ToolReferenceBlock,
    Field(discriminator="type"),
]


class ToolResultBlock(_Block):
    type: Literal["tool_result"] = "tool_result"
    tool_use_id: StrictStr
    content: (
        Annotated[
            Annotated[StrictStr, Tag(STR_TAG)] | Annotated[list[ToolResultContentBlock], Tag(LIST_TAG)],
            str_or_list(),
        ]
        | None
    ) = None
    is_error: StrictBool | None = None


class ThinkingBlock(_Block):
    type: Literal["thinking"] = "thinking"
    thinking: StrictStr
    signature: StrictStr


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: StrictStr


class ServerToolUseBlock(_Block):
    type: Literal["server_tool_use"] = "server_tool_use"
    id: StrictStr
    name: StrictStr
    input: Any


class WebSearchResult(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: StrictStr | None = None
    title: StrictStr
    url: StrictStr
    encrypted_content: StrictStr
    page_age: StrictStr | None = None


class WebSearchToolResultError(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: StrictStr
    error_code: StrictStr


class WebSearchToolResultBlock(_Block):
    type: Literal["web_search_tool_result"] = "web_search_tool_result"
    tool_use_id: StrictStr
    content: Annotated[
        Annotated[list[WebSearchResult], Tag(LIST_TAG)] | Annotated[WebSearchToolResultError, Tag(OBJECT_TAG)],
        list_or_object(),
    ]


class ToolSearchResultContent(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: StrictStr
    tool_references: list[ToolReferenceBlock] | None = None
    error_code: StrictStr | None = None


class ToolSearchToolResultBlock(_Block):
    type: Literal["tool_search_tool_result"] = "tool_search_tool_result"
    tool_use_id: StrictStr
    content: ToolSearchResultContent


InputBlock = Annotated[
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ServerToolUseBlock
    | SearchResultBlock
    | WebSearchToolResultBlock
    | ToolSearchToolResultBlock
    | ToolReferenceBlock,
    Field(discriminator="type"),
]

InputContent = Annotated[
    Annotated[StrictStr, Tag(STR_TAG)] | Annotated[list[InputBlock], Tag(LIST_TAG)],
    str_or_list(),
]

SystemContent = Annotated[
    Annotated[StrictStr, Tag(STR_TAG)] | Annotated[list[TextBlock], Tag(LIST_TAG)],
    str_or_list(),
]

ContentSource.model_rebuild()
