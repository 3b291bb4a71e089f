"""`InspectorApp`: a live, filterable request list over a journal, and a detail view per request.

The list is paged from SQLite (`RequestSource`): it loads one page at a time as the cursor or
the scroll position nears its end, and a timer asks, on a thread, only for rows newer than the
newest one shown. New rows go in above. At the top the list follows them, like `tail -f`: the
cursor stays on the newest. Moved or scrolled away, it stops following and the cursor stays on
the request it was on (by id), so what Enter opens is what the user looked at, however fast the
gateway writes; a burst larger than `FOLLOW_MAX` is then announced, never loaded under the user
(`g` jumps to the newest and follows again). `/` is acted on before the keys queued behind it
are routed, so a filter typed while the UI thread is busy goes to the filter box. A filter is
searched on a thread of its own (`Search`), with its progress in the status line and Esc to
cancel; the list shows the previous filter's rows until the new ones are in. Columns give way
by priority on a narrow terminal. `t` shows the selected request's conversation, `s` the
statistics of the filter per model, tenant, key or user. Everything the journal cannot answer
(a bad query, an unloadable tokenizer, a request that cannot be replayed) becomes a message on
screen, never a crash.
"""

from __future__ import annotations

import asyncio
import heapq
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from os import PathLike
from typing import Any, ClassVar, cast

from rich.console import Group, RenderableType
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events, on
from textual._two_way_dict import TwoWayDict
from textual.actions import SkipAction
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.cache import LRUCache
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widget import Widget
from textual.widgets import DataTable, Footer, Input, Static, TabbedContent, TabPane
from textual.widgets.data_table import CellKey, ColumnKey, RowKey

from journal import threads, waterfall
from journal.reader import JournalError
from journal.store import is_postgres, open_journal
from replay import answer
from replay.inspector import actions, render
from replay.inspector.data import (
    FOLLOW_MAX,
    QueryError,
    RequestDetail,
    RequestSource,
    Search,
    decode,
    load_detail,
    load_tokenizer,
)
from replay.inspector.render import Stamp

# Load the next page when the cursor comes this close to the last loaded row.
_PAGE_AHEAD = 10
# Rendered cells kept (a few screens of rows, in each of their highlight states).
_CELL_CACHE = 20_000
_PLAIN = Style()
# Rows in flight whose summary the timer re-reads (the newest ones).
_MAX_INFLIGHT_REFRESH = 200
# New rows go into the list at most this many per frame. Each frame that changes the list
# repaints its visible rows (DataTable caches rendered lines by row index, and every row moved):
# that repaint, not the insert, is the cost, so a poll's rows go in together when they can.
_ROWS_PER_FRAME = 500


@dataclass
class _Look:
    """What one live poll read off the UI thread: rows with their cells already made."""

    generation: int
    columns: list[str]
    fresh: list[tuple[dict[str, Any], list[Any]]] = field(default_factory=list)
    overflow: bool = False
    newest: tuple[list[tuple[dict[str, Any], list[Any]]], int, bool, float] | None = None
    """After an overflow, for a list that follows: the first page, count, has_more, when read."""
    refreshed: list[tuple[dict[str, Any], list[Any]]] = field(default_factory=list)


def _focus(widget: Widget) -> None:
    """Focus `widget` now: `Widget.focus` defers it behind the messages already queued, and
    the keys typed right after the one that asked would still go to the widget that had it."""
    widget.screen.set_focus(widget)


class RequestTable(DataTable[Any]):
    """The request list: home and end go to the first and last row (the next page loads there).

    Rows are put in order and removed many at a time (`order_rows`, `remove_rows`): DataTable's
    own `remove_row` re-indexes every row per call and `sort` calls a key per row, which at a
    few thousand rows held the UI thread for seconds under live traffic. Rendered cells are
    kept by row key (`_render_cell`): DataTable drops every one whenever anything changes, and
    re-rendering a screen of cells took a tenth of a second or more each time new rows arrived.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("home", "scroll_top", "Top", show=False),
        Binding("end", "scroll_bottom", "Bottom", show=False),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._versions: dict[RowKey, int] = {}  # bumped when a row's cells change
        self._cells: LRUCache[tuple[Any, ...], list[list[Segment]]] = LRUCache(_CELL_CACHE)

    def update_cell(self, row_key: RowKey | str, column_key: ColumnKey | str, value: Any, *,
                    update_width: bool = False) -> None:  # fmt: skip
        key = RowKey(row_key) if isinstance(row_key, str) else row_key
        self._versions[key] = self._versions.get(key, 0) + 1
        super().update_cell(row_key, column_key, value, update_width=update_width)

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> list[list[Segment]]:
        if row_index < 0 or column_index < 0:  # the header and row labels: as DataTable does
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        row_key = self._row_locations.get_key(row_index)
        column_key = self._column_locations.get_key(column_index)
        if row_key is None or column_key is None:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        key = (row_key, column_key, self._versions.get(row_key, 0), base_style, width, cursor, hover,
               self._show_hover_cursor, self._pseudo_class_state, self.rows[row_key].height)  # fmt: skip
        cached = self._cells.get(key)
        if cached is None:
            cell = self._data[row_key].get(column_key)
            fast = self._one_line(cell, base_style, width, cursor, hover) if self.rows[row_key].height == 1 else None
            if fast is None:
                lines = super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
                self._cells[key] = [list(line) for line in lines]
                return lines
            self._cells[key] = cached = fast
        # The click target (`row`, `column` meta) is the row's current place, not where it was.
        meta = Style.from_meta({"row": row_index, "column": column_index})
        return [[Segment(seg.text, (seg.style or _PLAIN) + meta, seg.control) for seg in line] for line in cached]

    def _one_line(
        self, cell: Any, base_style: Style, width: int, cursor: bool, hover: bool
    ) -> list[list[Segment]] | None:
        """A one-line text cell as DataTable renders it (padded, aligned, cropped, styled), made
        directly: rich's general path (padding, wrapping, cropping lines) costs ten times more."""
        if isinstance(cell, Stamp):
            cell = cell.__rich__()
        if not isinstance(cell, Text) or "\n" in cell.plain:
            return None
        component_style, post_style = self._get_styles_to_render_cell(
            False, False, False, hover, cursor, self.show_cursor, self._show_hover_cursor,
            self.cursor_foreground_priority == "css", self.cursor_background_priority == "css",
        )  # fmt: skip
        pad = self.cell_padding
        inner = max(0, width - 2 * pad)
        text = cell.copy()
        justify = cell.justify if cell.justify in ("center", "right") else "left"
        # As rich pads a line: a left-justified text's room after it is not in its style.
        if justify == "left":
            text.truncate(inner)
        else:
            text.align(cast(Any, justify), inner)
        console = self.app.console
        # `Text.render` leaves the text's own style out (its `__rich_console__` adds it).
        own = list(
            Segment.apply_style(text.render(console), console.get_style(text.style))
            if text.style
            else text.render(console)
        )
        gap = [Segment(" " * pad)] if pad else []
        room = [Segment(" " * (inner - text.cell_len))] if text.cell_len < inner else []
        segments = [*gap, *own, *room, *gap]
        return [list(Segment.apply_style(segments, base_style + component_style, post_style))]

    def row_ids(self) -> list[str]:
        """The rows' keys, top to bottom."""
        locations = self._row_locations
        return [str(key.value) for i in range(self.row_count) if (key := locations.get_key(i)) is not None]

    def order_rows(self, ids: list[str]) -> None:
        """Show the rows in this order (every row's key, once)."""
        self._row_locations = TwoWayDict({RowKey(rid): i for i, rid in enumerate(ids)})
        self._update_count += 1
        self.refresh()

    def remove_rows(self, ids: Iterable[str]) -> None:
        """Remove these rows, re-indexing the rest once."""
        doomed = {RowKey(rid) for rid in ids} & self.rows.keys()
        if not doomed:
            return
        kept = [rid for rid in self.row_ids() if rid not in doomed]
        for key in doomed:
            for column_key in self._data[key]:
                self._updated_cells.discard(CellKey(key, column_key))
            del self.rows[key]
            del self._data[key]
        self.order_rows(kept)
        self._require_update_dimensions = True
        self.cursor_coordinate = self.cursor_coordinate
        self.hover_coordinate = self.hover_coordinate
        self.refresh(layout=True)
        self.check_idle()


class DetailScreen(Screen[None]):
    """One request: a header and tabs for its timeline, request, response, tokens and errors."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self, detail: RequestDetail) -> None:
        super().__init__()
        self.detail = detail
        self.tokenizer_note = ""

    def compose(self) -> ComposeResult:
        d = self.detail
        tokens = d.tokens()
        errors = d.errors()
        yield Static(render.header(d.row), id="detail-header")
        with TabbedContent(initial="timeline", id="tabs"):
            with TabPane(f"Timeline ({len(d.raw)})", id="timeline"):
                yield DataTable(id="timeline-table", cursor_type="row", zebra_stripes=True)
            with TabPane("Request", id="request"):
                with VerticalScroll():
                    yield Static(render.request_view(d.received), id="request-view")
            with TabPane("Response", id="response"):
                with VerticalScroll():
                    yield Static(render.response_view(d.response, d.response_error), id="response-view")
            with TabPane("Answer", id="answer"):
                with VerticalScroll():
                    yield Static(self._answer(), id="answer-view")
            with TabPane("Waterfall", id="waterfall"):
                with VerticalScroll():
                    yield Static(answer.waterfall_view(waterfall.stages(d.raw)), id="waterfall-view")
            with TabPane(f"Tokens ({len(tokens)})", id="tokens"):
                yield Static(id="tokens-note")
                yield DataTable(id="tokens-table", cursor_type="row", zebra_stripes=True)
            with TabPane(f"Errors ({len(errors)})", id="errors"):
                with VerticalScroll():
                    yield Static(render.errors_view(errors, d.events), id="errors-view")
        yield Footer()

    def _answer(self) -> RenderableType:
        try:
            return answer.answer_view(answer.assemble(self.detail.events))
        except Exception as exc:  # a projection bug must not hide the rest of the request
            return Text(f"answer unavailable: {type(exc).__name__}: {exc}", style="yellow")

    def on_mount(self) -> None:
        timeline = self.query_one("#timeline-table", DataTable)
        timeline.add_column("seq", key="seq")
        timeline.add_column("t (ms)", key="t")
        timeline.add_column("Δ (ms)", key="dt")
        timeline.add_column("kind", key="kind")
        timeline.add_column("event", key="event")
        timeline.add_rows(render.timeline_rows(self.detail.raw))
        table = self.query_one("#tokens-table", DataTable)
        for key, label in (("seq", "seq"), ("t", "t (ms)"), ("ids", "ids"), ("text", "text"), ("note", "")):
            table.add_column(label, key=key)
        note = self.query_one("#tokens-note", Static)
        if not self.detail.tokens():
            note.update(Text("no tokens events: this request was not generated from engine token ids", "dim"))
            return
        rendered = self.detail.rendered
        source = rendered.tokenizer if rendered is not None else None
        if self.detail.bodies != "full":
            # Redacted journals keep -1 for every id, `none` keeps no ids: nothing to decode.
            self.run_worker(self._fill_tokens(None, f"bodies journaled {self.detail.bodies}"), group="tokens")
            return
        note.update(Text(f"loading tokenizer {source}…", "dim"))
        self.run_worker(self._fill_tokens(source), group="tokens", exclusive=True)

    async def _fill_tokens(self, source: str | None, skip: str | None = None) -> None:
        if skip is None:
            tokenizer, why = await asyncio.to_thread(load_tokenizer, source)
        else:
            tokenizer, why = None, skip
        pairs = self.detail.tokens()
        if tokenizer is not None:
            texts: list[str | None] = await asyncio.to_thread(lambda: [decode(tokenizer, e.ids) for _, e in pairs])
            self.tokenizer_note = f"decoded with {source}"
        else:
            texts = [None] * len(pairs)
            self.tokenizer_note = f"ids only: {why}"
        if not self.is_attached:  # closed while the tokenizer loaded
            return
        total = sum(len(e.ids) for _, e in pairs)
        self.query_one("#tokens-note", Static).update(
            Text(f"{len(pairs)} chunks, {total} ids; {self.tokenizer_note}", "dim")
        )
        table = self.query_one("#tokens-table", DataTable)
        table.add_rows(render.token_row(seq, e, text) for (seq, e), text in zip(pairs, texts, strict=True))


class TextModal(ModalScreen[None]):
    """A titled renderable over the current screen; escape (or q) closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close"),
        Binding("q", "dismiss", "Close", show=False),
    ]
    DEFAULT_CSS = """
    TextModal { align: center middle; }
    TextModal > Vertical { width: 90%; height: 80%; border: round $accent; background: $surface; padding: 0 1; }
    TextModal #modal-title { text-style: bold; height: auto; }
    """

    def __init__(self, title: str, body: RenderableType, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.title_text = title
        self.body = body

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.title_text), id="modal-title")
            with VerticalScroll():
                yield Static(self.body, id="modal-body")

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)


class InspectorApp(App[None]):
    """`smg inspect`: browse a journal while the gateway writes it."""

    TITLE = "smg inspect"
    CSS = """
    #filter { border: tall $panel; }
    #filter.bad { border: tall $error; }
    #filter-status { height: 1; padding: 0 1; color: $text-muted; }
    #filter-status.bad { color: $error; }
    #requests { height: 1fr; }
    #list-status { height: 1; padding: 0 1; background: $panel; }
    #detail-header { dock: top; height: auto; padding: 0 1; background: $panel; }
    #tabs { height: 1fr; }
    #tokens-note { height: auto; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        # A priority binding: the app acts on it as it takes the key from its queue, before
        # routing the keys queued behind it, so they go to the filter box (a plain binding
        # runs only once the list has the key, after the app routed the rest to the list too).
        Binding("/", "focus_filter", "Filter", priority=True),
        Binding("r", "replay", "Replay"),
        Binding("d", "diff", "Diff"),
        Binding("c", "curl", "Curl"),
        Binding("y", "copy_id", "Copy id"),
        Binding("t", "thread", "Conversation"),
        Binding("s", "stats", "Stats"),
        Binding("g", "newest", "Follow"),
        Binding("escape", "escape", "Back", show=False),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        journal_path: str | PathLike[str],
        *,
        page_size: int = 100,
        refresh_s: float = 1.0,
        base_url: str | None = None,
        max_rows: int | None = None,
        follow_max: int = FOLLOW_MAX,
    ) -> None:
        super().__init__()
        self.journal_path = journal_path
        self.reader = open_journal(journal_path)
        self.fleet = is_postgres(journal_path)
        """The fleet journal (PostgreSQL): its rows name their replica, a column of the list."""
        # The list's own connection: the live poll reads it on a thread, under `_source_lock`.
        self.source = RequestSource(open_journal(journal_path), page_size, follow_max)
        self.refresh_s = refresh_s
        self.base_url = base_url
        # Following a busy gateway must not grow the list forever: past this many rows the
        # oldest are dropped (they come back as the next page when scrolled to).
        self.max_rows = max_rows if max_rows is not None else page_size * 20
        self._ahead = max(1, min(_PAGE_AHEAD, page_size // 4))
        self.rows: dict[str, dict[str, Any]] = {}
        self.total: int | None = None
        self.columns: list[str] = [key for key, _ in render.LIST_COLUMNS if key != "replica" or self.fleet]
        self.search: Search | None = None
        """The filter being searched, if one is."""
        self.behind = 0
        """Rows that arrived in a burst too large to follow (0: the list is following)."""
        self._offset: int | None = None
        self._columns_ready = False  # the list's columns are in place (a resize may come before mount)
        # The live poll reads on a thread; the source (and its connection) is used by one
        # thread at a time, and a look read before the list started over is dropped.
        self._source_lock = threading.Lock()
        self._generation = 0
        self._polling = False

    # -- layout ---------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Input(
            placeholder='/ filter, Enter applies: model:claude-* status:>=500 has:error "some text"', id="filter"
        )
        yield Static(id="filter-status")
        yield RequestTable(id="requests", cursor_type="row", zebra_stripes=True)
        yield Static(id="list-status")
        yield Footer()

    def on_mount(self) -> None:
        table = self.table
        self.columns = render.fitting_columns(self.size.width, replicas=self.fleet)
        labels = dict(render.LIST_COLUMNS)
        for key in self.columns:
            table.add_column(labels[key], key=key)
        self._columns_ready = True
        self.reload()
        table.focus()
        self.watch(table, "scroll_y", self._scrolled, init=False)
        if self.refresh_s > 0:
            self.set_interval(self.refresh_s, self.poll, name="journal-poll")

    @property
    def table(self) -> RequestTable:
        return self._main.query_one("#requests", RequestTable)

    @property
    def _main(self) -> Screen[Any]:
        # The list lives on the default screen, under any detail view or modal.
        return self.screen_stack[0]

    # -- the list -------------------------------------------------------------------------

    def on_resize(self, event: events.Resize) -> None:
        if not self._columns_ready or not self.screen_stack or not self._main.query("#requests"):
            return
        wanted = render.fitting_columns(event.size.width, replicas=self.fleet)
        if wanted == self.columns:
            return
        # Rebuilt rather than edited in place: DataTable keeps cells per column order.
        table = self.table
        keep = self._cursor_id()
        self.columns = wanted
        table.clear(columns=True)
        labels = dict(render.LIST_COLUMNS)
        for key in wanted:
            table.add_column(labels[key], key=key)
        rows = sorted(self.rows.values(), key=lambda r: r.get("ts") or 0.0, reverse=True)
        for row in rows:
            table.add_row(*render.list_cells(row, self.columns), key=row["id"])
        if keep is not None and keep in self.rows:
            table.move_cursor(row=table.get_row_index(keep), animate=False)

    def reload(self) -> None:
        """Start the list over from its first page (on start, and `g`: jump to the newest)."""
        keep = self._cursor_id()
        self.behind = 0
        self.rows.clear()
        self.table.clear()
        with self._source_lock:
            self._generation += 1
            self.source.reset()
            try:
                self.total = self.source.count()
            except (QueryError, sqlite3.Error, JournalError) as exc:
                self.total = None
                self._filter_message(str(exc), bad=True)
        self.load_more()
        if keep is not None and keep in self.rows:
            self.table.move_cursor(row=self.table.get_row_index(keep))

    def load_more(self) -> int:
        """Load the next page, if there is one; returns how many rows it added."""
        try:
            with self._source_lock:
                rows = self.source.next_page()
        except (QueryError, sqlite3.Error, JournalError) as exc:
            self._filter_message(str(exc), bad=True)
            return 0
        self._append(rows)
        self._update_status()
        return len(rows)

    def _append(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self.rows[row["id"]] = row
            self.table.add_row(*render.list_cells(row, self.columns), key=row["id"])

    @property
    def following(self) -> bool:
        """The list follows new traffic: its cursor is on the first (newest) row, scrolled to
        the top. Moving or scrolling away stops it; `g`, or going back to the top, resumes it."""
        if not self.screen_stack or not self._main.query("#requests"):
            return False
        table = self.table
        return table.cursor_row <= 0 and table.scroll_y <= 0 and self._offset is None

    def poll(self) -> None:
        """Pick up what the gateway wrote since the last look: new rows and finished ones.

        The journal is read, and the cells made, on a thread (`_look`); the UI thread only puts
        the rows in, `_ROWS_PER_FRAME` at a time. A look still under way skips this tick."""
        if self._polling or not self.screen_stack or not self._main.query("#requests"):  # or shutting down
            return
        self._polling = True
        self.run_worker(self._poll(), group="poll", exit_on_error=False)

    async def _poll(self) -> None:
        try:
            pending = [rid for rid, row in self.rows.items() if not row.get("completed")]
            pending.sort(key=lambda rid: self.rows[rid].get("ts") or 0.0, reverse=True)
            follow = not self.behind and self.search is None
            pending = pending[:_MAX_INFLIGHT_REFRESH]
            try:
                look = await asyncio.to_thread(self._look, follow, self.following, pending, list(self.columns))
            except (QueryError, sqlite3.Error, JournalError) as exc:
                if self.screen_stack:
                    self._status(Text(f"journal read failed: {exc}", style="red"))
                return
            await self._apply(look)
        finally:
            self._polling = False

    def _look(self, follow: bool, following: bool, pending: list[str], columns: list[str]) -> _Look:
        """The poll's reads (on a worker thread)."""
        with self._source_lock:
            look = _Look(self._generation, columns)
            fresh: list[dict[str, Any]] = []
            if follow:
                fresh, look.overflow = self.source.newer()
            if look.overflow and following:  # the newest page instead, as `g` would read it
                when = time.time()
                rows, total = self.source.reader.page(self.source.page_size, query=self.source.query, descending=True)
                cells = [(row, render.list_cells(row, columns)) for row in rows]
                look.newest = (cells, total, len(rows) == self.source.page_size, when)
            refreshed = self.source.refreshed(pending) if pending and look.newest is None else []
        look.fresh = [(row, render.list_cells(row, columns)) for row in fresh]
        look.refreshed = [(row, render.list_cells(row, columns)) for row in refreshed]
        return look

    def _current(self, look: _Look) -> bool:
        """Whether the list is still the one `look` was read for (not started over, not closing)."""
        return look.generation == self._generation and bool(self.screen_stack) and bool(self._main.query("#requests"))

    async def _apply(self, look: _Look) -> None:
        if not self._current(look):
            return
        if look.overflow:
            if look.newest is not None and self.following:  # like `tail -f`: the newest, not the gap
                self._start_over(look.newest, look.columns)
                return
            # Too many to insert above the user: say so, keep the list, stop following.
            self.behind = 1
        fresh = look.fresh
        for start in range(0, len(fresh), _ROWS_PER_FRAME):
            if start:  # let a frame (and the keys queued meanwhile) through between batches
                await self._next_frame()
                if not self._current(look):
                    return
            batch = fresh[start : start + _ROWS_PER_FRAME]
            if look.columns != self.columns:  # resized meanwhile
                batch = [(row, render.list_cells(row, self.columns)) for row, _ in batch]
            if self.total is not None:
                self.total += len(batch)
            self._insert_newest(batch)
            self._update_status()
        self._refresh_inflight(look)
        self._trim()
        self._update_status()

    def _start_over(self, newest: tuple[list[tuple[dict[str, Any], list[Any]]], int, bool, float],
                    columns: list[str]) -> None:  # fmt: skip
        """Show the newest page a look read (the list follows, and a burst overflowed it)."""
        cells, total, has_more, when = newest
        with self._source_lock:
            self._generation += 1
            self.source.adopt(self.source.query, [row for row, _ in cells], has_more, when)
        self.rows.clear()
        self.table.clear()
        self.total = total
        for row, made in cells:
            self.rows[row["id"]] = row
            self.table.add_row(
                *(made if columns == self.columns else render.list_cells(row, self.columns)), key=row["id"]
            )
        self._offset = None
        self.table.move_cursor(row=0, animate=False)
        self._update_status()

    async def _next_frame(self) -> None:
        drawn = asyncio.Event()
        self.call_after_refresh(drawn.set)
        await drawn.wait()

    def _insert_newest(self, rows: list[tuple[dict[str, Any], list[Any]]]) -> None:
        """New rows go above. Following, the cursor is on the newest; else it stays on its
        request and that row where it was on screen."""
        table = self.table
        follow = self.following
        keep = None if follow else self._cursor_id()
        # The cursor's line on screen; while a scroll from the last insert is pending, that one's.
        offset = self._offset if self._offset is not None else table.cursor_row - int(table.scroll_y)
        shown = table.row_ids()
        for row, cells in rows:
            if row["id"] in self.rows:
                continue
            self.rows[row["id"]] = row
            table.add_row(*cells, key=row["id"])
        # Newest first by arrival: the new rows (oldest first) merged into the list's order,
        # which already is (a late commit can be older than a row shown).
        ts_of = {rid: float(row.get("ts") or 0.0) for rid, row in self.rows.items()}

        def ts(rid: str) -> float:
            return ts_of[rid]

        added = sorted({r["id"] for r, _ in rows} - set(shown), key=ts, reverse=True)
        table.order_rows(list(heapq.merge(added, shown, key=ts, reverse=True)) if shown else added)
        if keep is None:
            table.move_cursor(row=0, animate=False)
            return
        new_row = table.get_row_index(keep)
        table.move_cursor(row=new_row, animate=False, scroll=False)
        # After the refresh: the table's height (and so how far it may scroll) grows with it.
        self._offset = offset

        def scroll() -> None:
            self._offset = None
            table.scroll_to(y=max(0, new_row - offset), animate=False, immediate=True)

        self.call_after_refresh(scroll)

    def _refresh_inflight(self, look: _Look) -> None:
        table = self.table
        for row, cells in look.refreshed:
            if row["id"] not in self.rows or row == self.rows[row["id"]]:
                continue
            self.rows[row["id"]] = row
            if look.columns != self.columns:
                cells = render.list_cells(row, self.columns)
            for key, cell in zip(self.columns, cells, strict=True):
                table.update_cell(row["id"], key, cell)

    def _trim(self) -> None:
        table = self.table
        extra = len(self.rows) - self.max_rows
        # Never the rows at or just below the cursor: what the user paged to stays.
        if extra <= 0 or table.row_count - extra <= table.cursor_row + self._ahead:
            return
        dropped = table.row_ids()[-extra:]  # the oldest: the list is newest first
        table.remove_rows(dropped)
        for rid in dropped:
            del self.rows[rid]
        with self._source_lock:
            self.source.forget(dropped)

    def _scrolled(self, _: float) -> None:
        if not self.screen_stack:
            return
        table = self.table
        if self.source.has_more and table.scroll_y >= table.max_scroll_y - self._ahead:
            self.load_more()
        self._update_status()

    @on(DataTable.RowHighlighted, "#requests")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        if not self.screen_stack:  # a move queued just before shutdown
            return
        if self.source.has_more and event.cursor_row >= self.table.row_count - self._ahead:
            self.load_more()
        self._update_status()

    @on(DataTable.RowSelected, "#requests")
    def _selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.open_request(event.row_key.value)

    def selected_id(self) -> str | None:
        """The request the keys act on: the one open in the detail view, else the list's cursor row."""
        for screen in reversed(self.screen_stack):
            if isinstance(screen, DetailScreen):
                return screen.detail.id
        return self._cursor_id()

    def _cursor_id(self) -> str | None:
        table = self.table
        if table.row_count == 0:
            return None
        try:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        except Exception:  # no cursor row yet
            return None
        return key.value

    def _update_status(self) -> None:
        shown = len(self.rows)
        total = "?" if self.total is None else str(self.total)
        more = " (more below)" if self.source.has_more else ""
        where = f"filter {self.source.query!r}" if self.source.query else "all requests"
        text = Text(f"{shown} of {total} shown{more} · {where} · {self.journal_path}")
        if self.behind:
            text.append(" · a burst of new requests is not shown: g for the newest", style="bold yellow")
        elif self.following:
            text.append(" · following", style="bold green")
        else:
            text.append(" · paused: g (or the top) follows the newest", style="yellow")
        self._status(text)

    def _status(self, text: Text) -> None:
        self._main.query_one("#list-status", Static).update(text)

    def _filter_message(self, message: str, *, bad: bool) -> None:
        screen = self._main
        screen.query_one("#filter-status", Static).update(Text(message))
        screen.query_one("#filter-status", Static).set_class(bad, "bad")
        screen.query_one("#filter", Input).set_class(bad, "bad")

    # -- the filter -----------------------------------------------------------------------

    @on(Input.Submitted, "#filter")
    def _apply_filter(self, event: Input.Submitted) -> None:
        self.apply_filter(event.value)

    def apply_filter(self, text: str) -> bool:
        """Filter the list with a query, searched off the UI thread (see `Search`); a bad one
        is reported in the bar and changes nothing. Returns whether the search started."""
        try:
            search = Search(self.journal_path, text.strip(), self.source.page_size)
        except QueryError as exc:
            self._filter_message(f"bad query: {exc}", bad=True)
            return False
        if self.search is not None:
            self.search.cancel()
        self.search = search
        self._filter_message(f"searching {search.query!r}… (Esc cancels)" if search.query else "", bad=False)
        _focus(self.table)
        self.run_worker(self._run_search(search), group="search", exclusive=True)
        return True

    async def _run_search(self, search: Search) -> None:
        timer = self.set_interval(0.1, lambda: self._search_progress(search), name="search-progress")
        try:
            rows, total, has_more, looked = await asyncio.to_thread(search.run)
        except (sqlite3.Error, JournalError) as exc:
            if self.search is search and self.screen_stack:
                self.search = None
                if search.cancelled:
                    self._filter_message(f"search for {search.query!r} cancelled; the list is unchanged", bad=False)
                else:
                    self._filter_message(f"search failed: {exc}", bad=True)
            return
        finally:
            timer.stop()
        if self.search is not search or not self.screen_stack:  # replaced meanwhile, or shutting down
            return
        self.search = None
        keep = self._cursor_id()
        self.behind = 0
        with self._source_lock:
            self._generation += 1
            self.source.adopt(search.query, rows, has_more, looked)
        self.rows.clear()
        self.table.clear()
        self.total = total
        self._append(rows)
        if keep is not None and keep in self.rows:
            self.table.move_cursor(row=self.table.get_row_index(keep))
        self._filter_message(f"filter: {search.query}" if search.query else "", bad=False)
        self._update_status()

    def _search_progress(self, search: Search) -> None:
        if self.search is search and self.screen_stack and self._main.query("#filter-status"):
            self._filter_message(f"searching {search.query!r}… {search.steps}k steps (Esc cancels)", bad=False)

    # -- the detail view ------------------------------------------------------------------

    def open_request(self, request_id: str) -> None:
        try:
            detail = load_detail(self.reader, request_id)
        except (sqlite3.Error, JournalError) as exc:
            self.notify(f"cannot read {request_id}: {exc}", severity="error")
            return
        if detail is None:
            self.notify(f"no request {request_id} in the journal", severity="warning")
            return
        self.push_screen(DetailScreen(detail))

    # -- keys -----------------------------------------------------------------------------

    def action_focus_filter(self) -> None:
        box = self._main.query_one("#filter", Input)
        if self.focused is box:
            raise SkipAction()  # a `/` typed in the filter (`path:*/v1/*`) is the filter's
        while len(self.screen_stack) > 1:
            self.pop_screen()
        _focus(box)

    def action_escape(self) -> None:
        if self.search is not None and len(self.screen_stack) == 1:
            self.search.cancel()
        elif len(self.screen_stack) > 1:
            self.pop_screen()
        elif isinstance(self.focused, Input):
            _focus(self.table)

    def action_newest(self) -> None:
        """Start over from the newest page of the filter, following new traffic."""
        while len(self.screen_stack) > 1:
            self.pop_screen()
        self.reload()
        self._offset = None
        self.table.move_cursor(row=0, animate=False)
        self.table.scroll_to(y=0, animate=False, immediate=True)
        self._update_status()

    def action_thread(self) -> None:
        request_id = self.selected_id()
        if request_id is None or isinstance(self.screen, ModalScreen):
            return
        self.run_worker(self._show_thread(request_id), group="thread", exclusive=True)

    async def _show_thread(self, request_id: str) -> None:
        def load() -> list[threads.Turn] | None:
            with open_journal(self.journal_path) as reader:
                return threads.thread(reader, request_id)

        try:
            turns = await asyncio.to_thread(load)
        except (sqlite3.Error, JournalError) as exc:
            self.notify(f"cannot read the conversation: {exc}", severity="error")
            return
        title = f"conversation of {request_id}: {len(turns or [])} turns (t: close)"
        await self.push_screen(TextModal(title, render.thread_view(turns or [], request_id), id="thread"))

    def action_stats(self) -> None:
        if isinstance(self.screen, ModalScreen):
            return
        self.run_worker(self._show_stats(self.source.query), group="stats", exclusive=True)

    async def _show_stats(self, query: str) -> None:
        # The breakdowns the rollups keep (`journal.rollups`): read from them, not from every request.
        def load() -> tuple[list[tuple[str, list[dict[str, Any]]]], str]:
            with open_journal(self.journal_path) as reader:
                tables = [(by, reader.group_stats(query, by=by)[:20]) for by in ("model", "tenant", "key", "worker")]
                return tables, reader.stats_source

        try:
            tables, source = await asyncio.to_thread(load)
        except (sqlite3.Error, JournalError, QueryError) as exc:
            self.notify(f"cannot compute statistics: {exc}", severity="error")
            return
        parts: list[RenderableType] = []
        for by, rows in tables:
            parts += [Text(f"by {by}", style="bold"), render.stats_view(rows, by)]
        parts.append(Text(source, style="dim"))
        body = Group(*parts)
        where = f" matching {query!r}" if query else ""
        await self.push_screen(TextModal(f"statistics of the requests{where}", body, id="stats"))

    def action_copy_id(self) -> None:
        request_id = self.selected_id()
        if request_id is None:
            self.notify("no request selected", severity="warning")
            return
        self.copy_to_clipboard(request_id)
        self.notify(f"copied {request_id}")

    def action_curl(self) -> None:
        detail = self._current_detail()
        if detail is None:
            return
        try:
            command = actions.curl(detail, self.base_url)
        except actions.Unavailable as exc:
            self.notify(str(exc), severity="warning")
            return
        self.copy_to_clipboard(command)
        self.push_screen(TextModal(f"{detail.id} as curl (copied to the clipboard)", Text(command), id="curl"))

    def action_replay(self) -> None:
        detail = self._current_detail()
        if detail is None:
            return
        if not detail.is_grpc:
            self.notify(actions.NOT_REPLAYABLE, severity="warning")
            return
        self.run_worker(self._show_diff(detail, original=False), group="replay", exclusive=True)

    def action_diff(self) -> None:
        detail = self._current_detail()
        if detail is None:
            return
        if detail.row.get("replay_of"):
            self.run_worker(self._show_diff(detail, original=True), group="replay", exclusive=True)
        elif detail.is_grpc:
            self.run_worker(self._show_diff(detail, original=False), group="replay", exclusive=True)
        else:
            self.notify(actions.NOT_REPLAYABLE + " and it is not a replay of another request", severity="warning")

    async def _show_diff(self, detail: RequestDetail, *, original: bool) -> None:
        self.notify("comparing…", timeout=2)
        try:
            if original:
                result = await asyncio.to_thread(actions.against_original, self.reader, detail)
            else:
                result = await asyncio.to_thread(actions.offline, detail)
        except actions.Unavailable as exc:
            self.notify(str(exc), severity="warning")
            return
        except Exception as exc:  # a replay bug is shown, never fatal to the inspector
            self.notify(f"replay failed: {type(exc).__name__}: {exc}", severity="error")
            return
        await self.push_screen(TextModal(result.title, result.view(), id="diff"))

    def _current_detail(self) -> RequestDetail | None:
        if isinstance(self.screen, ModalScreen):  # one dialog at a time
            return None
        for screen in reversed(self.screen_stack):
            if isinstance(screen, DetailScreen):
                return screen.detail
        request_id = self.selected_id()
        if request_id is None:
            self.notify("no request selected", severity="warning")
            return None
        try:
            detail = load_detail(self.reader, request_id)
        except (sqlite3.Error, JournalError) as exc:
            self.notify(f"cannot read {request_id}: {exc}", severity="error")
            return None
        if detail is None:
            self.notify(f"no request {request_id} in the journal", severity="warning")
        return detail

    def on_unmount(self) -> None:
        self.reader.close()
        with self._source_lock:  # not under a poll's read
            self.source.reader.close()
