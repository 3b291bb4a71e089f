"""The inspector next to a gateway writing: keys typed while the UI thread is busy, follow mode.

The writer is a real `JournalWriter` on a thread of its own (`LiveWriter`), 100 requests a
second. Keys are sent the way a terminal driver sends them, from its own thread, while the
UI thread is held: they queue behind whatever it is doing, as they do when a poll stalls it.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.keys import _character_to_key
from textual.widgets import DataTable, Input

from replay.inspector import InspectorApp
from replay.inspector.app import TextModal
from tests.inspector.conftest import T0, LiveWriter, relay_ok, sample_requests, write_journal
from tests.inspector.test_app import SIZE, ids_in, static_text


def _key(char: str) -> events.Key:
    return events.Key(_character_to_key(char) if not char.isalnum() else char, char)


def shown(lines: list[list[Segment]]) -> list[list[tuple[str, Style | None]]]:
    """Each character of rendered lines with its style: what the terminal gets."""
    return [[(char, seg.style) for seg in line for char in seg.text] for line in lines]


def newest(app: InspectorApp) -> str:
    return max(rid for rid in app.rows if rid.startswith("req_live_"))


def _type_during_a_stall(app: InspectorApp, keys: str) -> None:
    """Hold the UI thread (a synchronous handler queued first) while another thread types
    `keys` through the app's driver, as a terminal's input thread does; then let it go."""
    typed = threading.Event()

    def stall() -> None:
        typed.wait(30)

    def typist() -> None:
        driver = app._driver
        assert driver is not None
        for char in keys:
            driver.process_message(_key(char))
        typed.set()

    app.call_later(stall)
    threading.Thread(target=typist, name="typist").start()


async def test_a_filter_typed_during_a_stall_goes_to_the_filter_box(tmp_path: Path) -> None:
    journal = await write_journal(tmp_path / "live.db", sample_requests(fillers=30))
    app = InspectorApp(journal, page_size=20, refresh_s=0.05)
    with LiveWriter(journal) as writer:
        async with app.run_test(size=SIZE) as pilot:
            writer.wait_for(30)
            # `s` would open the statistics, `q` quit, `t` the conversation, `d`/`r` a diff.
            _type_during_a_stall(app, "/status:500 quota path:*/v1/*")
            for _ in range(200):
                await pilot.pause(0.02)
                if app.screen.query_one("#filter", Input).value.endswith("*"):
                    break
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.is_running and app.return_code is None
            assert not any(isinstance(screen, TextModal) for screen in app.screen_stack)
            assert app.screen.query_one("#filter", Input).value == "status:500 quota path:*/v1/*"
            assert isinstance(app.focused, Input)


async def test_the_list_reads_the_journal_off_the_ui_thread(tmp_path: Path) -> None:
    """Every statement the live poll runs, runs on a thread other than the UI's."""
    journal = await write_journal(tmp_path / "live.db", sample_requests(fillers=30))
    app = InspectorApp(journal, page_size=20, refresh_s=0.05)
    threads: set[int] = set()
    ui = threading.get_ident()
    with LiveWriter(journal) as writer:
        async with app.run_test(size=SIZE) as pilot:
            conn: sqlite3.Connection = app.source.reader.connection
            conn.set_trace_callback(lambda _: threads.add(threading.get_ident()))
            seen = writer.written
            writer.wait_for(seen + 50)
            for _ in range(200):
                await pilot.pause(0.05)
                if f"req_live_{seen + 40:05d}" in app.rows:
                    break
            conn.set_trace_callback(None)
            assert f"req_live_{seen + 40:05d}" in app.rows
    assert threads and ui not in threads


async def test_the_list_follows_new_traffic_at_the_top_and_stops_when_moved(tmp_path: Path) -> None:
    journal = await write_journal(tmp_path / "follow.db", sample_requests(fillers=30))
    app = InspectorApp(journal, page_size=20, refresh_s=0.05)
    with LiveWriter(journal) as writer:
        async with app.run_test(size=SIZE) as pilot:
            assert app.following
            assert "following" in static_text(app, "#list-status")
            writer.wait_for(writer.written + 30)
            target = f"req_live_{writer.written - 1:05d}"
            for _ in range(200):
                await pilot.pause(0.05)
                if target in app.rows:
                    break
            # Following: the newest request is on the first row, under the cursor.
            assert app.selected_id() == ids_in(app)[0] == newest(app)
            assert app.table.cursor_row == 0 and app.table.scroll_y == 0

            await pilot.press("down", "down")
            held = app.selected_id()
            assert not app.following
            assert "paused" in static_text(app, "#list-status")
            writer.wait_for(writer.written + 30)
            target = f"req_live_{writer.written - 1:05d}"
            for _ in range(200):
                await pilot.pause(0.05)
                if target in app.rows:
                    break
            assert ids_in(app)[0] == newest(app)
            assert app.selected_id() == held and app.table.cursor_row > 2  # new rows went in above

            await pilot.press("g")  # back to the newest, following again
            await pilot.pause()
            assert app.following and app.table.cursor_row == 0
            writer.wait_for(writer.written + 20)
            target = f"req_live_{writer.written - 1:05d}"
            for _ in range(200):
                await pilot.pause(0.05)
                if target in app.rows:
                    break
            assert app.selected_id() == ids_in(app)[0] == newest(app)
            assert "following" in static_text(app, "#list-status")

            await pilot.press("down", "home")  # returning to the top follows again
            await pilot.pause()
            assert app.following


async def test_the_lists_cells_render_as_datatable_renders_them(tmp_path: Path) -> None:
    """The list renders its one-line cells itself and keeps them by row: the same segments as
    DataTable's own rendering, in every highlight state, and the click target of the row's
    current place after rows went in above."""
    journal = await write_journal(tmp_path / "cells.db", sample_requests(fillers=3))
    app = InspectorApp(journal, refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        table = app.table
        await pilot.pause()
        own = DataTable._render_cell
        for row in range(table.row_count):
            for column in range(len(table.columns)):
                for cursor, hover in ((False, False), (True, False), (False, True)):
                    style = table._get_row_style(row, table.rich_style)
                    width = table.ordered_columns[column].get_render_width(table)
                    for _ in range(2):  # made, then from the cache
                        mine = table._render_cell(row, column, style, width, cursor, hover)
                        assert shown(mine) == shown(own(table, row, column, style, width, cursor, hover))
        first = table.row_ids()[0]
        table.order_rows([*table.row_ids()[1:], first])  # the first row moves to the end
        last = table.row_count - 1
        style = table._get_row_style(last, table.rich_style)
        lines = table._render_cell(last, 0, style, table.ordered_columns[0].get_render_width(table))
        assert {seg.style.meta["row"] for seg in lines[0] if seg.style} == {last}


async def test_a_burst_too_large_to_insert_while_following_shows_the_newest_page(tmp_path: Path) -> None:
    journal = await write_journal(tmp_path / "flood.db", sample_requests(fillers=10))
    app = InspectorApp(journal, page_size=5, refresh_s=0.05, follow_max=6)
    async with app.run_test(size=SIZE) as pilot:
        assert app.following
        await write_journal(journal, {f"req_flood_{i}": relay_ok(T0 + 100 + i) for i in range(8)})
        for _ in range(100):
            await pilot.pause(0.05)
            if ids_in(app)[0] == "req_flood_7":
                break
        assert ids_in(app) == [f"req_flood_{i}" for i in (7, 6, 5, 4, 3)]
        assert not app.behind and app.following and app.selected_id() == "req_flood_7"
        assert "5 of 23 shown (more below)" in static_text(app, "#list-status")
        await pilot.press("end")  # the next page follows on from the one read
        await pilot.pause()
        assert ids_in(app)[5:7] == ["req_flood_2", "req_flood_1"]
