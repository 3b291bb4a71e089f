"""The inspector driven headless with Textual's Pilot: list, filter, detail tabs, keys, paging."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any, cast

from rich.console import RenderableType
from textual.coordinate import Coordinate
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Static, TabbedContent

from journal.events import Received
from journal.reader import JournalReader
from journal.writer import JournalWriter
from replay.inspector import InspectorApp, render
from replay.inspector.app import DetailScreen, TextModal
from replay.inspector.data import Search
from tests.inspector.conftest import SECRET, T0, relay_ok, sample_requests, text, write_journal

SIZE = (200, 50)


def ids_in(app: InspectorApp) -> list[str]:
    table = app.table
    return [str(table.coordinate_to_cell_key(Coordinate(row, 0)).row_key.value) for row in range(table.row_count)]


def static_text(app: InspectorApp, selector: str) -> str:
    # The inspector only ever puts rich renderables in its Statics.
    return text(cast(RenderableType, app.screen.query_one(selector, Static).content))


def table_text(app: InspectorApp, selector: str) -> str:
    table = app.screen.query_one(selector, DataTable)
    return "\n".join(" | ".join(text(cell).strip() for cell in table.get_row_at(i)) for i in range(table.row_count))


async def open_request(app: InspectorApp, pilot: Pilot[None], request_id: str) -> DetailScreen:
    app.table.move_cursor(row=ids_in(app).index(request_id))
    await pilot.press("enter")
    await pilot.pause()
    assert isinstance(app.screen, DetailScreen)
    return app.screen


async def settle(app: InspectorApp, pilot: Pilot[None]) -> None:
    await app.workers.wait_for_complete()
    await pilot.pause()


async def test_list_shows_the_requests_newest_first(sample_journal: Path) -> None:
    app = InspectorApp(sample_journal, refresh_s=0)
    async with app.run_test(size=SIZE):
        assert ids_in(app) == ["req_replay", "req_grpc", "req_failed", "req_rejected", "req_relay"]
        cells = {key.value: i for i, key in enumerate(app.table.columns)}
        row = app.table.get_row("req_failed")
        assert text(row[cells["status"]]).strip() == "502"
        assert text(row[cells["code"]]).strip() == "upstream_unreachable"
        assert text(row[cells["backend"]]).strip() == "http"
        relay = app.table.get_row("req_relay")
        assert text(relay[cells["tokens"]]).strip() == "5/3"
        assert text(relay[cells["stop"]]).strip() == "end_turn"
        assert text(relay[cells["duration"]]).strip() == "12ms"
        assert "5 of 5 shown" in static_text(app, "#list-status")


async def test_filter_bar_filters_the_rows(sample_journal: Path) -> None:
    app = InspectorApp(sample_journal, refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("/")
        assert isinstance(app.focused, Input)
        await pilot.press(*"backend:grpc", "enter")
        await pilot.pause()
        assert app.focused is app.table  # type: ignore[comparison-overlap]
        await pilot.pause()
        assert ids_in(app) == ["req_grpc"]
        assert "1 of 1 shown" in static_text(app, "#list-status")

        await pilot.press("/")
        app.screen.query_one("#filter", Input).value = ""
        await pilot.press(*"model:claude-relay", "enter")
        await pilot.pause()
        assert ids_in(app) == ["req_replay", "req_failed", "req_relay"]

        # Free text searches the stored payloads (here: the replay's response body).
        app.screen.query_one("#filter", Input).value = '"from the replay"'
        await pilot.press("/", "enter")
        await pilot.pause()
        assert ids_in(app) == ["req_replay"]

        await pilot.press("/")
        app.screen.query_one("#filter", Input).value = ""
        await pilot.press("enter")
        await pilot.pause()
        assert len(ids_in(app)) == 5
        await pilot.press("/", "escape")
        assert app.focused is app.table  # type: ignore[comparison-overlap]


async def test_a_bad_query_shows_its_error_in_the_bar(sample_journal: Path) -> None:
    app = InspectorApp(sample_journal, refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("/", *"backend:grpc", "enter")
        await pilot.pause()
        await pilot.press("/")
        app.screen.query_one("#filter", Input).value = ""
        await pilot.press(*"status:>>", "enter")
        await pilot.pause()
        message = static_text(app, "#filter-status")
        assert message.startswith("bad query:")
        assert app.screen.query_one("#filter", Input).has_class("bad")
        assert ids_in(app) == ["req_grpc"]  # the previous filter still applies
        app.screen.query_one("#filter", Input).value = ""
        await pilot.press("enter")
        await pilot.pause()
        assert not app.screen.query_one("#filter", Input).has_class("bad")
        assert len(ids_in(app)) == 5


async def test_opening_a_relayed_request_shows_each_tab(sample_journal: Path) -> None:
    app = InspectorApp(sample_journal, refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        detail = await open_request(app, pilot, "req_relay")
        assert "req_relay" in static_text(app, "#detail-header")
        timeline = table_text(app, "#timeline-table")
        for kind in ("received", "validated", "routed", "upstream", "completed"):
            assert kind in timeline
        assert "backend=http worker=http://127.0.0.1:9001" in timeline

        tabs = detail.query_one(TabbedContent)
        tabs.active = "request"
        await pilot.pause()
        request = static_text(app, "#request-view")
        assert "POST /v1/messages" in request
        assert SECRET not in request  # headers as journaled: redacted
        assert '"max_tokens": 32' in request  # the body, pretty-printed

        response = static_text(app, "#response-view")
        assert "HTTP 200" in response
        assert '"text": "Hi from the relay"' in response

        assert "no tokens events" in static_text(app, "#tokens-note")
        assert static_text(app, "#errors-view").strip() == "no errors"

        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, DetailScreen)


async def test_errors_tab_shows_rejections_and_failures(sample_journal: Path) -> None:
    app = InspectorApp(sample_journal, refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await open_request(app, pilot, "req_failed")
        errors = static_text(app, "#errors-view")
        assert "upstream" in errors and "502" in errors and "upstream_unreachable" in errors
        assert "worker unreachable: connection refused" in errors
        response = static_text(app, "#response-view")
        assert "HTTP 502" in response and "api_error" in response
        await pilot.press("escape")

        await open_request(app, pilot, "req_rejected")
        errors = static_text(app, "#errors-view")
        assert "rejected" in errors and "max_tokens: field required" in errors


async def test_tokens_tab_decodes_ids_side_by_side(sample_journal: Path) -> None:
    app = InspectorApp(sample_journal, refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await open_request(app, pilot, "req_grpc")
        await settle(app, pilot)
        assert "decoded with" in static_text(app, "#tokens-note")
        rows = table_text(app, "#tokens-table").splitlines()
        assert len(rows) == 4
        assert rows[0].split(" | ")[2:4] == ["868", "Hello"]
        assert rows[1].split(" | ")[2:4] == ["263 261", "there"]  # " there": a leading space
        assert "finish='stop'" in rows[3] or "finish=stop" in rows[3]
        # The response is the SSE stream the client received.
        response = static_text(app, "#response-view")
        assert "event: content_block_delta" in response and "SSE stream" in response


async def test_tokens_tab_shows_ids_only_without_a_tokenizer(tmp_path: Path) -> None:
    requests = sample_requests()
    for event in requests["req_grpc"]:
        if event.kind == "rendered":
            event.tokenizer = str(tmp_path / "gone")  # type: ignore[attr-defined]
    journal = await write_journal(tmp_path / "j.db", requests)
    app = InspectorApp(journal, refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await open_request(app, pilot, "req_grpc")
        await settle(app, pilot)
        assert "ids only" in static_text(app, "#tokens-note")
        rows = table_text(app, "#tokens-table").splitlines()
        assert rows[1].split(" | ")[2:4] == ["263 261", "—"]


async def test_redacted_bodies_show_ids_only_and_do_not_replay(tmp_path: Path) -> None:
    journal = await write_journal(tmp_path / "redacted.db", sample_requests())
    with sqlite3.connect(journal) as conn:  # as `--journal-bodies redacted` marks its rows
        conn.execute("UPDATE requests SET bodies = 'redacted' WHERE id = 'req_grpc'")
    app = InspectorApp(journal, refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await open_request(app, pilot, "req_grpc")
        await settle(app, pilot)
        assert "bodies redacted" in static_text(app, "#detail-header")
        assert "ids only: bodies journaled redacted" in static_text(app, "#tokens-note")
        await pilot.press("r")
        await settle(app, pilot)
        assert isinstance(app.screen, DetailScreen)
        assert any("replay needs full ones" in n.message for n in app._notifications)


async def test_y_copies_the_id(sample_journal: Path) -> None:
    app = InspectorApp(sample_journal, refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "y")
        assert app.clipboard == "req_grpc"
        await open_request(app, pilot, "req_failed")
        await pilot.press("y")
        assert app.clipboard == "req_failed"


async def test_c_exports_curl_in_a_modal_and_copies_it(sample_journal: Path) -> None:
    app = InspectorApp(sample_journal, refresh_s=0, base_url="http://gateway:8080")
    async with app.run_test(size=SIZE) as pilot:
        await open_request(app, pilot, "req_relay")
        await pilot.press("c")
        await pilot.pause()
        assert isinstance(app.screen, TextModal)
        shown = static_text(app, "#modal-body")
        assert shown.startswith("curl -sS")
        assert "http://gateway:8080/v1/messages" in shown
        assert "${ANTHROPIC_API_KEY}" in shown and SECRET not in shown
        assert app.clipboard.startswith("curl -sS") and "--data-binary" in app.clipboard
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, DetailScreen)


async def test_r_on_a_relayed_request_is_a_notice(sample_journal: Path) -> None:
    app = InspectorApp(sample_journal, refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await open_request(app, pilot, "req_relay")
        await pilot.press("r")
        await settle(app, pilot)
        assert isinstance(app.screen, DetailScreen)
        assert any("gRPC" in n.message for n in app._notifications)


async def test_d_diffs_a_replay_against_its_original(sample_journal: Path) -> None:
    app = InspectorApp(sample_journal, refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await open_request(app, pilot, "req_replay")
        assert "replay of req_relay" in static_text(app, "#detail-header")
        await pilot.press("d")
        await settle(app, pilot)
        assert isinstance(app.screen, TextModal)
        title = static_text(app, "#modal-title")
        assert "req_replay vs its original req_relay" in title
        # Not greedy decoding: the text differs but is not compared, so the two agree.
        assert "same" in title
        assert "text not compared" in static_text(app, "#modal-body")


async def test_paging_loads_one_page_at_a_time(tmp_path: Path) -> None:
    journal = await write_journal(tmp_path / "many.db", sample_requests(fillers=45))
    calls: list[dict[str, Any]] = []
    app = InspectorApp(journal, page_size=20, refresh_s=0)
    original = app.source.reader.list_requests

    def spy(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        rows = original(*args, **kwargs)
        calls.append({"args": args, "kwargs": kwargs, "rows": len(rows)})
        return rows

    app.source.reader.list_requests = spy  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        assert app.table.row_count == 20
        assert "20 of 50 shown (more below)" in static_text(app, "#list-status")
        await pilot.press("end")
        await pilot.pause()
        assert app.table.row_count == 40
        await pilot.press("end")
        await pilot.pause()
        assert app.table.row_count == 50
        assert "50 of 50 shown ·" in static_text(app, "#list-status")
        await pilot.press("end")
        await pilot.pause()
        ids = ids_in(app)
        assert len(ids) == len(set(ids)) == 50
        assert ids[0] == "req_replay" and ids[-1] == "req_fill_000"
    assert calls and all(call["rows"] <= 20 for call in calls)
    assert len(calls) == 3  # three pages, nothing else read


async def test_new_requests_appear_live(tmp_path: Path) -> None:
    journal = await write_journal(tmp_path / "live.db", sample_requests(fillers=30))
    app = InspectorApp(journal, page_size=10, refresh_s=0.05)
    async with app.run_test(size=SIZE) as pilot:
        assert app.table.row_count == 10
        await write_journal(journal, {"req_new_1": relay_ok(T0 + 100), "req_new_2": relay_ok(T0 + 101)})
        for _ in range(100):
            await pilot.pause(0.05)
            if app.table.row_count == 12:
                break
        assert ids_in(app)[:3] == ["req_new_2", "req_new_1", "req_replay"]
        assert app.table.row_count == 12  # the new ones only, not another page
        assert app.source.loaded == 12


async def test_a_burst_goes_in_above_and_the_cursor_stays_on_its_request(tmp_path: Path) -> None:
    journal = await write_journal(tmp_path / "burst.db", sample_requests(fillers=10))
    app = InspectorApp(journal, page_size=5, refresh_s=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "down")
        assert app.table.row_count == 5 and app.selected_id() == "req_failed"
        burst = {f"req_burst_{i}": relay_ok(T0 + 100 + i) for i in range(8)}
        await write_journal(journal, burst)
        for _ in range(100):
            await pilot.pause(0.05)
            if ids_in(app)[0] == "req_burst_7":
                break
        assert ids_in(app)[:9] == [*(f"req_burst_{i}" for i in range(7, -1, -1)), "req_replay"]
        assert app.selected_id() == "req_failed"  # more than a page arrived: nothing reloaded under the cursor
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, DetailScreen) and app.screen.detail.id == "req_failed"


async def test_a_burst_too_large_to_follow_is_announced_not_loaded(tmp_path: Path) -> None:
    journal = await write_journal(tmp_path / "flood.db", sample_requests(fillers=10))
    app = InspectorApp(journal, page_size=5, refresh_s=0.05, follow_max=6)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down")
        before = ids_in(app)
        await write_journal(journal, {f"req_flood_{i}": relay_ok(T0 + 100 + i) for i in range(8)})
        for _ in range(100):
            await pilot.pause(0.05)
            if app.behind:
                break
        assert app.behind and ids_in(app) == before and app.selected_id() == "req_grpc"
        assert "g for the newest" in static_text(app, "#list-status")
        await pilot.press("g")
        await pilot.pause()
        assert ids_in(app)[0] == "req_flood_7" and not app.behind


async def test_following_drops_the_oldest_rows_past_max_rows(tmp_path: Path) -> None:
    journal = await write_journal(tmp_path / "trim.db", sample_requests(fillers=10))
    app = InspectorApp(journal, page_size=5, refresh_s=0.05, max_rows=8)
    async with app.run_test(size=SIZE) as pilot:
        await open_request(app, pilot, "req_replay")  # the list keeps following under a detail view
        await write_journal(journal, {f"req_new_{i}": relay_ok(T0 + 100 + i) for i in range(4)})
        for _ in range(100):
            await pilot.pause(0.05)
            if "req_new_3" in app.rows:
                break
        await pilot.press("escape")
        assert ids_in(app) == [*(f"req_new_{i}" for i in (3, 2, 1, 0)), "req_replay", "req_grpc", "req_failed",
                               "req_rejected"]  # fmt: skip
        assert app.source.loaded == 8 and app.source.has_more
        await pilot.press("end")
        await pilot.pause()
        # The dropped row comes back as the first row of the next page: nothing lost, nothing twice.
        assert ids_in(app)[8:] == ["req_relay", "req_fill_009", "req_fill_008", "req_fill_007", "req_fill_006"]


async def test_an_in_flight_request_is_updated_when_it_completes(tmp_path: Path) -> None:
    events = relay_ok(T0 + 1)
    journal = await write_journal(tmp_path / "inflight.db", {"req_slow": events[:3]})
    app = InspectorApp(journal, refresh_s=0.05)
    async with app.run_test(size=SIZE) as pilot:
        cells = {key.value: i for i, key in enumerate(app.table.columns)}
        assert text(app.table.get_row("req_slow")[cells["status"]]).strip() == "…"
        from journal.writer import JournalWriter

        writer = JournalWriter(journal)
        await writer.start()
        for seq, event in enumerate(events[3:], start=4):
            await writer.append("req_slow", seq, event)
        await writer.close()
        for _ in range(100):
            await pilot.pause(0.05)
            if text(app.table.get_row("req_slow")[cells["status"]]).strip() == "200":
                break
        assert text(app.table.get_row("req_slow")[cells["status"]]).strip() == "200"


async def test_q_quits(sample_journal: Path) -> None:
    app = InspectorApp(sample_journal, refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


# --- real traffic -----------------------------------------------------------------------


async def test_real_traffic(real_journal: dict[str, Any]) -> None:
    path = real_journal["path"]
    with JournalReader(path) as reader:
        assert reader.count() == 5
        reused = {r["id"] for r in reader.list_requests(query="client_id:inspector-reused")}
    assert len(reused) == 2  # one row per request, each under the gateway's id
    app = InspectorApp(path, refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        ids = ids_in(app)
        assert set(ids) == {real_journal["relay"], real_journal["rejected"], real_journal["grpc"], *reused}

        await pilot.press("/", *"id:inspector-reused", "enter")  # the client's id finds its requests
        await pilot.pause()
        assert set(ids_in(app)) == reused
        await open_request(app, pilot, sorted(reused)[0])
        await settle(app, pilot)
        assert "client id inspector-reused" in static_text(app, "#detail-header")
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("/")
        app.screen.query_one("#filter", Input).value = ""
        await pilot.press("enter")
        await pilot.pause()

        await pilot.press("/", *"backend:grpc", "enter")
        await pilot.pause()
        assert ids_in(app) == [real_journal["grpc"]]

        await open_request(app, pilot, real_journal["grpc"])
        await settle(app, pilot)
        timeline = table_text(app, "#timeline-table")
        for kind in ("received", "validated", "routed", "rendered", "tokens", "block", "completed"):
            assert kind in timeline
        # The reconstructed response is byte for byte what the client received.
        response = static_text(app, "#response-view")
        first_delta = next(line for line in real_journal["grpc_body"].splitlines() if "text_delta" in line)
        assert json.loads(first_delta[6:])["delta"]["text"] in response
        tokens = table_text(app, "#tokens-table")
        assert "decoded with" in static_text(app, "#tokens-note")
        decoded = "".join(row.split(" | ")[3] for row in tokens.splitlines())
        assert "Hello" in decoded and "friend" in decoded

        await pilot.press("r")
        await settle(app, pilot)
        assert isinstance(app.screen, TextModal)
        assert "identical" in static_text(app, "#modal-title")
        assert "no differences" in static_text(app, "#modal-body")
        await pilot.press("escape", "y")
        assert app.clipboard == real_journal["grpc"]


async def test_the_cursor_stays_on_its_request_while_a_writer_adds_100_a_second(tmp_path: Path) -> None:
    journal = await write_journal(tmp_path / "load.db", sample_requests(fillers=30))
    app = InspectorApp(journal, page_size=20, refresh_s=0.1)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "down", "down")
        anchored = app.selected_id()
        assert anchored == "req_rejected"
        await pilot.press("end")  # a second page, loaded by the user: it must stay
        await pilot.pause()
        await pilot.press("home", "down", "down", "down")
        loaded = ids_in(app)
        assert len(loaded) == 35 and app.selected_id() == anchored
        writer = JournalWriter(journal)
        await writer.start()

        async def produce() -> None:
            n = 0
            for _ in range(20):  # two seconds at 100 requests a second
                for _ in range(10):
                    for seq, event in enumerate(relay_ok(T0 + 1000 + n * 0.01), start=1):
                        await writer.append(f"req_load_{n:04d}", seq, event)
                    n += 1
                await writer.flush()
                await asyncio.sleep(0.1)

        task = asyncio.create_task(produce())
        seen: set[str | None] = set()
        try:
            while not task.done():
                await pilot.pause(0.05)
                seen.add(app.selected_id())
            await task
        finally:
            await writer.close()
        for _ in range(100):
            await pilot.pause(0.05)
            if "req_load_0199" in app.rows:
                break
        await pilot.pause(0.2)
        assert seen == {anchored}  # at every look the cursor held the same request
        table = app.table
        assert table.scroll_y <= table.cursor_row < table.scroll_y + table.scrollable_content_region.height
        ids = ids_in(app)
        assert ids[0] == "req_load_0199" and len(ids) == 235
        assert ids[200:] == loaded  # nothing reloaded, the user's second page kept
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, DetailScreen) and app.screen.detail.id == anchored


async def test_columns_give_way_by_priority_on_a_narrow_terminal(sample_journal: Path) -> None:
    app = InspectorApp(sample_journal, refresh_s=0)
    async with app.run_test(size=(80, 24)) as pilot:
        shown = [key.value for key in app.table.columns]
        assert shown[:0] == [] and {"status", "id", "flags", "model"} <= set(shown)
        assert "backend" not in shown and "tenant" not in shown
        assert sum(render.COLUMN_WIDTHS[k] + 2 for k in shown) <= 80
        await pilot.resize_terminal(200, 50)
        await pilot.pause()
        # Every column but the fleet journal's replica: a file names none.
        assert [key.value for key in app.table.columns] == [k for k, _ in render.LIST_COLUMNS if k != "replica"]
        assert ids_in(app) == ["req_replay", "req_grpc", "req_failed", "req_rejected", "req_relay"]


async def test_the_detail_header_stays_pinned(sample_journal: Path) -> None:
    app = InspectorApp(sample_journal, refresh_s=0)
    async with app.run_test(size=(100, 16)) as pilot:
        screen = await open_request(app, pilot, "req_grpc")
        header = screen.query_one("#detail-header", Static)
        top = header.region.y
        timeline = screen.query_one("#timeline-table", DataTable)
        timeline.move_cursor(row=timeline.row_count - 1)  # the end of a timeline longer than the screen
        await pilot.pause()
        assert timeline.scroll_y > 0
        assert header.region.y == top and screen.scroll_y == 0
        assert "req_grpc" in static_text(app, "#detail-header")


async def test_t_shows_the_conversation_and_s_the_stats(tmp_path: Path) -> None:
    turns: dict[str, list[Any]] = {}
    history: list[dict[str, Any]] = []
    for n, said in enumerate(("first question", "second question")):
        history.append({"role": "user", "content": said})
        events = relay_ok(T0 + n)
        received = events[0]
        assert isinstance(received, Received)
        received.headers = {**received.headers, "x-claude-code-session-id": "cc-9"}
        received.body = json.dumps({"model": "claude-relay", "max_tokens": 8, "messages": list(history)})
        turns[f"req_turn_{n}"] = events
        history.append({"role": "assistant", "content": "ok"})
    journal = await write_journal(tmp_path / "thread.db", turns)
    app = InspectorApp(journal, refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("t")
        await settle(app, pilot)
        assert isinstance(app.screen, TextModal) and app.screen.id == "thread"
        shown = static_text(app, "#modal-body")
        assert "req_turn_0" in shown and "req_turn_1" in shown and "second question" in shown
        await pilot.press("escape", "s")
        await settle(app, pilot)
        assert isinstance(app.screen, TextModal) and app.screen.id == "stats"
        assert "by model" in static_text(app, "#modal-body") and "claude-relay" in static_text(app, "#modal-body")
        assert "scanned 2 requests" in static_text(app, "#modal-body")  # too few for the rollups: exact


async def test_a_search_can_be_cancelled(tmp_path: Path) -> None:
    journal = await write_journal(tmp_path / "big.db", sample_requests(fillers=300))
    # Free text beside a pattern: counted row by row (free text alone is counted in the text
    # index, too quickly to be watched at this size).
    query = '!"from the replay" path:*/v1/*'
    search = Search(journal, query, 10)
    rows, total, more, _ = search.run()
    assert len(rows) == 10 and total == 304 and more and search.steps > 0
    cancelled = Search(journal, query, 10)
    cancelled.cancel()
    try:
        cancelled.run()
    except sqlite3.OperationalError as exc:
        assert "interrupt" in str(exc)
    else:
        raise AssertionError("a cancelled search ran to its end")
