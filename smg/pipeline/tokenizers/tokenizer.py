"""One model's tokenizer: text ↔ token ids, its special and EOS ids, and its chat template.

Wraps a transformers fast tokenizer loaded offline from a directory (or the local hub cache) and
owns what the pipeline needs to know about the model's chat template: which kwarg toggles
thinking and what the template does without it, whether it takes message content as a string or
as a list of parts, and rendering a conversation into the prompt text.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import jinja2
from jinja2 import meta, nodes

from smg.pipeline.tokenizers.cache import EncodeCache, safe_boundaries

# The gateway only tokenizes: transformers' advice that PyTorch is missing is noise here.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

_IMPORT_LOCK = threading.Lock()


def _transformers() -> Any:
    """transformers, imported on first use (it takes seconds, and most commands never need it).
    Under a lock: its lazy module is not safe to import from several loader threads at once."""
    with _IMPORT_LOCK:
        import transformers

        transformers.AutoTokenizer  # noqa: B018 - resolve the lazy attribute while holding the lock
        return transformers


def warm_import() -> None:
    """Import transformers ahead of the first load (a gateway about to fetch tokenizers from its
    workers): the import, seconds of a cold start, is most of what loading one costs."""
    _transformers()


def _chat_template_utils() -> Any:
    with _IMPORT_LOCK:
        from transformers.utils import chat_template_utils

        return chat_template_utils


ContentFormat = Literal["string", "openai"]

_PROBE: list[dict[str, Any]] = [{"role": "user", "content": "ping"}]


_ENCODE_WITH_GIL_CHARS = 16_384
LONG_TEXT_CHARS = 1 << 20
"""A text this long or longer is tokenized by at most `LONG_ENCODES_AT_ONCE` threads at a time."""
LONG_ENCODES_AT_ONCE = 1
# Tokenizing megabytes takes seconds of one core per request (a count_tokens of 20 MiB counts
# whatever its length): one at a time, a burst of them keeps to one core and the other requests
# keep theirs. The waiting is done by the worker thread that asked, never by the event loop.
_LONG_ENCODES = threading.BoundedSemaphore(LONG_ENCODES_AT_ONCE)


class ChatTemplateError(Exception):
    """The chat template is missing, or failed to render a conversation."""


class Tokenizer:
    """A model's tokenizer and chat template. Build with `Tokenizer.load`, or wrap an already
    constructed transformers tokenizer (tests build small ones in memory)."""

    def __init__(
        self,
        hf: Any,
        *,
        source: str,
        name: str | None = None,
        chat_template: str | None = None,
        eos_token_ids: Sequence[int] | None = None,
    ) -> None:
        self._hf = hf
        # The Rust tokenizer behind a fast tokenizer, called directly on the per-token path.
        self._backend: Any = getattr(hf, "backend_tokenizer", None)
        self.source = source
        self.name = name if name is not None else source
        self.chat_template: str | None = chat_template if chat_template is not None else _own_template(hf)
        if eos_token_ids is not None:
            self.eos_token_ids: list[int] = list(eos_token_ids)
        else:
            eos = hf.eos_token_id
            self.eos_token_ids = [eos] if isinstance(eos, int) else []
        self.special_ids: frozenset[int] = frozenset(
            {*hf.all_special_ids, *(i for i, t in hf.added_tokens_decoder.items() if t.special)}
        )
        # The reference reports the base vocabulary, added tokens left out (`get_vocab_size(false)`).
        self.vocab_size: int = (
            int(self._backend.get_vocab_size(with_added_tokens=False)) if self._backend is not None else len(hf)
        )
        self.encode_cache: EncodeCache | None = None
        self._ast = _parse(self.chat_template)
        self.thinking_toggle: str | None = _thinking_toggle(self.chat_template, self._ast)
        self.thinking_default: bool | None = self._probe_thinking_default()
        self.content_format: ContentFormat = _content_format(self._ast)

    @classmethod
    def load(
        cls,
        path: str | Path,
        chat_template: str | Path | None = None,
        *,
        name: str | None = None,
    ) -> Tokenizer:
        """Load from a local directory (never touching the network) or a hub id already in the
        local cache. `chat_template` overrides the model's own: a file path or the template text."""
        AutoTokenizer = _transformers().AutoTokenizer  # noqa: N806 - the library's class

        local = Path(path)
        if local.is_dir():
            hf = AutoTokenizer.from_pretrained(str(local), local_files_only=True)
        else:
            hf = AutoTokenizer.from_pretrained(str(path))
        template = _read_template(chat_template) if chat_template is not None else None
        eos = _generation_config_eos(local / "generation_config.json") if local.is_dir() else None
        if name is None:
            name = local.resolve().name if local.is_dir() else str(path)
        return cls(hf, source=str(path), name=name, chat_template=template, eos_token_ids=eos)

    @functools.cached_property
    def longest_token_bytes(self) -> int:
        """The UTF-8 length of the longest vocabulary entry: no token stands for more bytes."""
        return max((len(token.encode("utf-8", "surrogatepass")) for token in self._hf.get_vocab()), default=1) or 1

    # --- text ↔ ids ---------------------------------------------------------------------------

    def enable_cache(self, l0_max_entries: int | None, l1_max_bytes: int | None) -> EncodeCache | None:
        """Serve `encode` from an L0 and/or L1 cache (`smg.pipeline.tokenizers.cache`; None or
        0 leaves that level off); the cache, or None when both are off."""
        if not (l0_max_entries and l0_max_entries > 0) and not (l1_max_bytes and l1_max_bytes > 0):
            self.encode_cache = None
            return None
        added = [(token.content, int(i)) for i, token in self._hf.added_tokens_decoder.items()]
        special = [(token.content, int(i)) for i, token in self._hf.added_tokens_decoder.items() if token.special]
        boundaries = safe_boundaries(self._encode, special) if l1_max_bytes and l1_max_bytes > 0 else {}
        self.encode_cache = EncodeCache(
            self._encode, l0_max_entries=l0_max_entries, l1_max_bytes=l1_max_bytes, added=added, boundaries=boundaries
        )
        return self.encode_cache

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` with no special tokens added: the chat template writes BOS etc."""
        cache = self.encode_cache
        if cache is not None:
            return cache.encode(text)
        return self._encode(text)

    def _encode(self, text: str) -> list[int]:
        if self._backend is None:
            return list(self._hf.encode(text, add_special_tokens=False))
        if len(text) >= LONG_TEXT_CHARS:
            with _LONG_ENCODES:
                return self._encode_released(text)
        if len(text) > _ENCODE_WITH_GIL_CHARS:
            return self._encode_released(text)
        ids: list[int] = self._backend.encode(text, add_special_tokens=False).ids
        return ids

    def _encode_released(self, text: str) -> list[int]:
        # `encode_batch_fast` releases the GIL while it works (`encode` does not): a long prompt
        # tokenized in a worker thread then leaves the event loop free. It computes no character
        # offsets (the gateway uses none), a quarter of the CPU of `encode_batch`, same ids.
        backend = self._backend
        encode_batch = getattr(backend, "encode_batch_fast", None) or backend.encode_batch
        ids: list[int] = encode_batch([text], add_special_tokens=False)[0].ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of `ids`. No clean-up of tokenization spaces: it rewrites text across token
        boundaries, so incremental decoding could never reproduce it."""
        if self._backend is None:
            return str(
                self._hf.decode(list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)
            )
        text: str = self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return text

    def token_id(self, text: str) -> int | None:
        """The one id `text` encodes to (single-token stop sequences), else None."""
        ids = self.encode(text)
        return ids[0] if len(ids) == 1 else None

    # --- chat template ------------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **kwargs: Any,
    ) -> str:
        """The prompt text of a conversation of chat-template messages. Raises
        `ChatTemplateError` when there is no template or it fails on this conversation."""
        if self.chat_template is None:
            raise ChatTemplateError(f"tokenizer '{self.name}' has no chat template")
        try:
            # transformers' `apply_chat_template` drops keys whose value is None; templates such
            # as DeepSeek's test `content is none` on tool-call turns, so render directly.
            render_jinja_template = _chat_template_utils().render_jinja_template

            rendered: Any = render_jinja_template(
                conversations=[[dict(m) for m in messages]],
                tools=[dict(t) for t in tools] if tools is not None else None,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt and not continue_final_message,
                continue_final_message=continue_final_message,
                **{**self._hf.special_tokens_map, **kwargs},
            )
        except Exception as exc:
            raise ChatTemplateError(str(exc) or type(exc).__name__) from exc
        text: str = rendered[0][0]
        return text

    def _probe_thinking_default(self) -> bool | None:
        """Whether the template thinks when the toggle is left out: render a one-line chat
        without it and compare with the toggle on and off; the text rules decide a tie."""
        if self.thinking_toggle is None:
            return None
        try:
            on_kwargs: dict[str, Any] = {self.thinking_toggle: True}
            off_kwargs: dict[str, Any] = {self.thinking_toggle: False}
            absent = self.render(_PROBE)
            on = self.render(_PROBE, None, **on_kwargs)
            off = self.render(_PROBE, None, **off_kwargs)
        except ChatTemplateError:
            return _default_from_text(self.chat_template or "", self.thinking_toggle)
        if absent == on != off:
            return True
        if absent == off != on:
            return False
        return _default_from_text(self.chat_template or "", self.thinking_toggle)

    def __repr__(self) -> str:
        return f"Tokenizer(name={self.name!r}, source={self.source!r}, vocab_size={self.vocab_size})"


# --- loading -----------------------------------------------------------------------------------


def _own_template(hf: Any) -> str | None:
    template = getattr(hf, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default") or next(iter(template.values()), None)
    return template if isinstance(template, str) else None


def _read_template(value: str | Path) -> str:
    """A template override: a file (`.jinja` text, or a `chat_template.json`) or the text itself."""
    path = Path(value)
    try:
        # Not only regular files: `--chat-template <(…)` hands over a pipe.
        is_file = path.exists() and not path.is_dir()
    except OSError:  # template text too long to be a path
        is_file = False
    if not is_file:
        if isinstance(value, Path):
            raise FileNotFoundError(f"chat template file not found: {value}")
        return value
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        data = json.loads(text)
        template = data.get("chat_template") if isinstance(data, dict) else None
        if not isinstance(template, str):
            raise ValueError(f"{path} has no chat_template string")
        return template
    return text


def _generation_config_eos(path: Path) -> list[int] | None:
    if not path.is_file():
        return None
    eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    if isinstance(eos, int):
        return [eos]
    if isinstance(eos, list) and eos and all(isinstance(i, int) for i in eos):
        return list(eos)
    return None


# --- template introspection --------------------------------------------------------------------


def _parse(template: str | None) -> nodes.Template | None:
    if template is None:
        return None
    try:
        # transformers' own environment, so its extension tags (`{% generation %}`) parse.
        env: jinja2.Environment = _chat_template_utils()._compile_jinja_template(template).environment
        return env.parse(template)
    except Exception:
        return None


def _thinking_toggle(template: str | None, ast: nodes.Template | None) -> str | None:
    if template is None:
        return None
    if "enable_thinking" in template:
        return "enable_thinking"
    if ast is not None:
        return "thinking" if "thinking" in meta.find_undeclared_variables(ast) else None
    bare = ("if thinking ", "thinking is ", "thinking ==", "set thinking ")
    return "thinking" if any(p in template for p in bare) else None


def _default_from_text(template: str, toggle: str) -> bool:
    compact = template.replace(" ", "")
    return f"set{toggle}=false" not in compact


def _content_format(ast: nodes.Template | None) -> ContentFormat:
    """The "openai" format when the template loops over a message's content (directly, through
    a macro parameter fed with it, or over a top-level variable named `content`), as the
    serving engines decide it; any other template, or one that does not parse, is "string"."""
    if ast is None:
        return "string"
    try:
        return "openai" if _iterates_message_content(ast) else "string"
    except _NotAName:
        return "string"


class _NotAName(Exception):
    pass


def _is_var(node: nodes.Node, name: str) -> bool:
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name


def _is_access(node: nodes.Node, name: str, key: str | None = None) -> bool:
    """`name` (key None) or `name.key` / `name['key']`, possibly under filters, tests, slices."""
    if isinstance(node, nodes.Filter | nodes.Test):
        return node.node is not None and _is_access(node.node, name, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _is_access(node.node, name, key)
    if key is None:
        return _is_var(node, name)
    if isinstance(node, nodes.Getitem):
        return _is_var(node.node, name) and isinstance(node.arg, nodes.Const) and node.arg.value == key
    if isinstance(node, nodes.Getattr):
        return _is_var(node.node, name) and node.attr == key
    return False


_Loop = tuple[nodes.For, tuple[nodes.Macro, ...]]


def _loops(node: nodes.Node, macros: tuple[nodes.Macro, ...] = ()) -> Iterator[_Loop]:
    """Every `for` loop in document order, with the macros enclosing it (outermost first)."""
    for child in node.iter_child_nodes():
        if isinstance(child, nodes.For):
            yield child, macros
        inner = (*macros, child) if isinstance(child, nodes.Macro) else macros
        yield from _loops(child, inner)


def _names_from(ast: nodes.Template, root: str) -> list[str]:
    names, queue = [root], deque([root])
    assigns = list(ast.find_all(nodes.Assign))
    while queue:
        related = queue.popleft()
        for assign in assigns:
            if not _is_access(assign.node, related):
                continue
            if not isinstance(assign.target, nodes.Name):
                raise _NotAName
            if assign.target.name not in names:
                names.append(assign.target.name)
                queue.append(assign.target.name)
    return names


def _iterates_message_content(ast: nodes.Template) -> bool:
    loops = list(_loops(ast))
    messages = _names_from(ast, "messages")
    message_vars: list[str] = []
    for loop, _ in loops:
        if any(_is_access(loop.iter, name) for name in messages):
            if not isinstance(loop.target, nodes.Name):
                raise _NotAName
            message_vars.append(loop.target.name)

    def is_content(expr: nodes.Node) -> bool:
        return any(_is_access(expr, var, "content") for var in message_vars)

    fed: dict[int, set[str]] = {}
    calls = list(ast.find_all(nodes.Call))
    for macro in ast.find_all(nodes.Macro):
        params = [a.name for a in macro.args]
        got: set[str] = set()
        for call in calls:
            if not (isinstance(call.node, nodes.Name) and call.node.name == macro.name):
                continue
            for position, value in enumerate(call.args):
                if position < len(params) and is_content(value):
                    got.add(params[position])
            for kw in call.kwargs:
                if kw.key in params and is_content(kw.value):
                    got.add(kw.key)
        fed[id(macro)] = got

    for loop, enclosing in loops:
        if is_content(loop.iter):
            matched = True
        elif isinstance(loop.iter, nodes.Name):
            # Inside a macro, the innermost macro fed a message's content decides; outside any
            # macro, a variable named `content` counts.
            fed_here = next((fed[id(m)] for m in reversed(enclosing) if fed.get(id(m))), None)
            if fed_here is not None:
                matched = loop.iter.name in fed_here
            else:
                matched = not enclosing and loop.iter.name == "content"
        else:
            matched = False
        if matched:
            if not isinstance(loop.target, nodes.Name):
                raise _NotAName
            return True
    return False
