"""`InspectorApp`: a live, filterable request list over a journal, and a detail view per request.

The list is paged from SQLite (`RequestSource`): it loads one page at a time as the cursor or
the scroll position nears its end, and a timer asks only for rows newer than the newest one
shown. Everything the journal cannot answer (a bad query, an unloadable tokenizer, a request
that cannot be replayed) becomes a message on screen, never a crash.
"""

from __future__ import annotations

import asyncio
import sqlite3
from os import PathLike
from typing import Any, ClassVar

from rich.console import RenderableType
from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Input, Static, TabbedContent, TabPane

from journal.reader import JournalError, JournalReader
from replay.inspector import actions, render
from replay.inspector.data import QueryError, RequestDetail, RequestSource, decode, load_detail, load_tokenizer

# Load the next page when the cursor comes this close to the last loaded row.
_PAGE_AHEAD = 10
# Rows in flight whose summary the timer re-reads (the newest ones).
_MAX_INFLIGHT_REFRESH = 200


class RequestTable(DataTable[Any]):
    """The request list: home and end go to the first and last row (the next page loads there)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("home", "scroll_top", "Top", show=False),
        Binding("end", "scroll_bottom", "Bottom", show=False),
    ]


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
            with TabPane(f"Tokens ({len(tokens)})", id="tokens"):
                yield Static(id="tokens-note")
                yield DataTable(id="tokens-table", cursor_type="row", zebra_stripes=True)
            with TabPane(f"Errors ({len(errors)})", id="errors"):
                with VerticalScroll():
                    yield Static(render.errors_view(errors, d.events), id="errors-view")
        yield Footer()

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
    #detail-header { height: auto; padding: 0 1; background: $panel; }
    #tokens-note { height: auto; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("/", "focus_filter", "Filter"),
        Binding("r", "replay", "Replay"),
        Binding("d", "diff", "Diff"),
        Binding("c", "curl", "Curl"),
        Binding("y", "copy_id", "Copy id"),
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
    ) -> None:
        super().__init__()
        self.journal_path = journal_path
        self.reader = JournalReader(journal_path)
        self.source = RequestSource(self.reader, page_size)
        self.refresh_s = refresh_s
        self.base_url = base_url
        # Following a busy gateway must not grow the list forever: past this many rows the
        # oldest are dropped (they come back as the next page when scrolled to).
        self.max_rows = max_rows if max_rows is not None else page_size * 20
        self._ahead = max(1, min(_PAGE_AHEAD, page_size // 4))
        self.rows: dict[str, dict[str, Any]] = {}
        self.total: int | None = None

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
        for key, label in render.LIST_COLUMNS:
            table.add_column(label, key=key)
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

    def reload(self) -> None:
        """Start the list over from its first page (the filter changed, or too much arrived)."""
        keep = self._cursor_id()
        self.source.reset()
        self.rows.clear()
        self.table.clear()
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
            self.table.add_row(*render.list_cells(row), key=row["id"])

    def poll(self) -> None:
        """Pick up what the gateway wrote since the last look: new rows and finished ones."""
        if not self.screen_stack or not self._main.query("#requests"):  # shutting down
            return
        try:
            fresh, overflow = self.source.newer()
            if overflow:
                self.reload()
                return
            if fresh:
                if self.total is not None:
                    self.total += len(fresh)
                self._insert_newest(fresh)
            self._refresh_inflight()
        except (QueryError, sqlite3.Error, JournalError) as exc:
            self._status(Text(f"journal read failed: {exc}", style="red"))
            return
        self._trim()
        self._update_status()

    def _insert_newest(self, rows: list[dict[str, Any]]) -> None:
        table = self.table
        keep = self._cursor_id()
        at_top = table.cursor_row <= 0
        self._append(rows)
        table.sort("time", key=lambda stamp: stamp.ts, reverse=True)
        if keep is not None and not at_top:
            table.move_cursor(row=table.get_row_index(keep), animate=False)
        else:
            table.move_cursor(row=0, animate=False)

    def _refresh_inflight(self) -> None:
        pending = [rid for rid, row in self.rows.items() if not row.get("completed")]
        if not pending:
            return
        pending.sort(key=lambda rid: self.rows[rid].get("ts") or 0.0, reverse=True)
        table = self.table
        for row in self.source.refreshed(pending[:_MAX_INFLIGHT_REFRESH]):
            if row == self.rows.get(row["id"]):
                continue
            self.rows[row["id"]] = row
            for (key, _), cell in zip(render.LIST_COLUMNS, render.list_cells(row), strict=True):
                table.update_cell(row["id"], key, cell)

    def _trim(self) -> None:
        table = self.table
        extra = len(self.rows) - self.max_rows
        if extra <= 0 or table.row_count - extra <= table.cursor_row + self.source.page_size:
            return
        ordered = sorted(self.rows, key=lambda rid: self.rows[rid].get("ts") or 0.0)
        dropped = ordered[:extra]
        for rid in dropped:
            table.remove_row(rid)
            del self.rows[rid]
        self.source.forget(dropped)

    def _scrolled(self, _: float) -> None:
        table = self.table
        if self.source.has_more and table.scroll_y >= table.max_scroll_y - self._ahead:
            self.load_more()

    @on(DataTable.RowHighlighted, "#requests")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        if self.source.has_more and event.cursor_row >= self.table.row_count - self._ahead:
            self.load_more()

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
        self._status(Text(f"{shown} of {total} shown{more} · {where} · {self.journal_path}"))

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
        """Filter the list with a query; a bad one is reported in the bar and changes nothing."""
        try:
            self.source.set_query(text)
        except QueryError as exc:
            self._filter_message(f"bad query: {exc}", bad=True)
            return False
        self._filter_message(f"filter: {self.source.query}" if self.source.query else "", bad=False)
        self.reload()
        self.table.focus()
        return True

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
        while len(self.screen_stack) > 1:
            self.pop_screen()
        self._main.query_one("#filter", Input).focus()

    def action_escape(self) -> None:
        if len(self.screen_stack) > 1:
            self.pop_screen()
        elif isinstance(self.focused, Input):
            self.table.focus()

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
