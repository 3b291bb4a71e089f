"""tool_use / tool_result pairing per turn (behaviors.md B.8)."""

from __future__ import annotations

from ._bodies import (
    accepted,
    assistant,
    body,
    count_refused,
    refused,
    system,
    tool_result,
    tool_use,
    user,
)


def unanswered(at: int, ids: str) -> str:
    return (
        f"messages.{at}: `tool_use` ids were found without `tool_result` blocks immediately after: {ids}. "
        "Each `tool_use` block must have a corresponding `tool_result` block in the next message."
    )


def unexpected(at: str, id: str) -> str:
    return (
        f"messages.{at}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. "
        "Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
    )


def test_results_in_any_order() -> None:
    accepted(
        body(
            messages=[
                user("weather?"),
                assistant([tool_use("toolu_a"), tool_use("toolu_b")]),
                user([tool_result("toolu_b"), tool_result("toolu_a")]),
            ]
        )
    )


def test_results_next_to_user_text() -> None:
    accepted(
        body(
            messages=[
                user("weather?"),
                assistant([{"type": "text", "text": "Checking."}, tool_use("toolu_a")]),
                user([tool_result("toolu_a"), {"type": "text", "text": "thanks"}]),
                assistant("Sunny."),
            ]
        )
    )


def test_missing_result() -> None:
    error = refused(
        body(
            messages=[
                user("weather?"),
                assistant([tool_use("toolu_a"), tool_use("toolu_b")]),
                user([tool_result("toolu_a")]),
            ]
        )
    )
    assert error.message == unanswered(1, "toolu_b")
    assert error.code == "tool_use_without_tool_result"


def test_several_missing_results_are_listed_in_call_order() -> None:
    error = refused(
        body(
            messages=[
                user("weather?"),
                assistant([tool_use("toolu_a"), tool_use("toolu_b"), tool_use("toolu_c")]),
                user("never mind"),
            ]
        )
    )
    assert error.message == unanswered(1, "toolu_a, toolu_b, toolu_c")


def test_unexpected_id() -> None:
    error = refused(
        body(
            messages=[
                user("weather?"),
                assistant([tool_use("toolu_a")]),
                user([tool_result("toolu_wrong")]),
            ]
        )
    )
    assert error.message == unexpected("2.content.0", "toolu_wrong")
    assert error.code == "unexpected_tool_use_id"


def test_leading_orphan_tool_result() -> None:
    error = refused(body(messages=[user([tool_result("toolu_probe")])]))
    assert error.message == unexpected("0.content.0", "toolu_probe")


def test_result_answering_an_older_turn_is_unexpected() -> None:
    error = refused(
        body(
            messages=[
                user("weather?"),
                assistant([tool_use("toolu_a")]),
                user([tool_result("toolu_a")]),
                assistant("Sunny."),
                user([{"type": "text", "text": "again"}, tool_result("toolu_a")]),
            ]
        )
    )
    assert error.message == unexpected("4.content.1", "toolu_a")


def test_trailing_tool_use() -> None:
    error = refused(body(messages=[user("weather?"), assistant([tool_use("toolu_a")])]))
    assert error.message == unanswered(1, "toolu_a")


def test_answered_twice() -> None:
    error = refused(
        body(
            messages=[
                user("weather?"),
                assistant([tool_use("toolu_a")]),
                user([tool_result("toolu_a"), tool_result("toolu_a")]),
            ]
        )
    )
    assert error.message == (
        "messages.2.content.1: `tool_result` blocks must each answer a different `tool_use_id`: "
        "toolu_a is answered twice."
    )
    assert error.code == "duplicate_tool_result"


def test_answered_twice_across_split_user_messages() -> None:
    error = refused(
        body(
            messages=[
                user("weather?"),
                assistant([tool_use("toolu_a")]),
                user([tool_result("toolu_a")]),
                user([{"type": "text", "text": "and"}, tool_result("toolu_a")]),
            ]
        )
    )
    assert error.message.startswith("messages.3.content.1: `tool_result` blocks must each answer")


def test_results_split_across_consecutive_user_messages() -> None:
    accepted(
        body(
            messages=[
                user("weather?"),
                assistant([tool_use("toolu_a"), tool_use("toolu_b")]),
                user([tool_result("toolu_a")]),
                user([tool_result("toolu_b")]),
            ]
        )
    )


def test_tool_use_followed_by_more_assistant_text_and_a_system_message() -> None:
    accepted(
        body(
            messages=[
                user("weather?"),
                assistant([tool_use("toolu_a")]),
                assistant("Let me check that."),
                system("stay brief"),
                user([tool_result("toolu_a")]),
            ]
        )
    )


def test_system_message_between_call_and_result() -> None:
    accepted(
        body(
            messages=[
                user("weather?"),
                assistant([tool_use("toolu_a")]),
                system("reminder"),
                user([tool_result("toolu_a")]),
            ]
        )
    )


def test_split_assistant_turn_reports_its_first_message() -> None:
    error = refused(
        body(
            messages=[
                user("weather?"),
                assistant("Thinking about it."),
                assistant([tool_use("toolu_a")]),
                user("and?"),
            ]
        )
    )
    assert error.message == unanswered(1, "toolu_a")


def test_still_missing_after_split_user_messages() -> None:
    error = refused(
        body(
            messages=[
                user("weather?"),
                assistant([tool_use("toolu_a"), tool_use("toolu_b")]),
                user([tool_result("toolu_a")]),
                user("and tomorrow?"),
            ]
        )
    )
    assert error.message == unanswered(1, "toolu_b")


def test_server_tool_use_needs_no_tool_result() -> None:
    accepted(
        body(
            messages=[
                user("search"),
                assistant(
                    [
                        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"q": "x"}},
                        {
                            "type": "web_search_tool_result",
                            "tool_use_id": "srvtoolu_1",
                            "content": [
                                {
                                    "type": "web_search_result",
                                    "title": "t",
                                    "url": "https://e.x",
                                    "encrypted_content": "e",
                                    "page_age": None,
                                }
                            ],
                        },
                        {"type": "text", "text": "Found it."},
                    ]
                ),
                user("thanks"),
            ]
        )
    )


def test_count_tokens_applies_the_pairing_rules() -> None:
    error = count_refused({"model": "m", "messages": [user([tool_result("toolu_x")])]})
    assert error.code == "unexpected_tool_use_id"
