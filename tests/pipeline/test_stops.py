"""Stop sequences over streamed text: held prefixes, matches split across chunks, and a result
that does not depend on the chunking."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from smg.pipeline.stops import StopMatcher


def feed(stops: Sequence[str], chunks: Sequence[str]) -> tuple[str, str | None, list[str]]:
    matcher = StopMatcher(stops)
    out = [matcher.push(c) for c in chunks]
    out.append(matcher.flush())
    return "".join(out), matcher.matched, out


def split(text: str, cuts: Sequence[int]) -> list[str]:
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def test_no_stops_passes_text_through() -> None:
    matcher = StopMatcher([])
    assert matcher.push("abc") == "abc"
    assert matcher.flush() == ""
    assert matcher.matched is None


def test_a_possible_prefix_is_held_then_released() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.push("Hello ST") == "Hello "
    assert matcher.push("AR") == "STAR"
    assert matcher.push("S") == ""
    assert matcher.flush() == "S"
    assert matcher.matched is None


def test_a_stop_split_across_many_pushes_matches() -> None:
    matcher = StopMatcher(["<|end|>"])
    emitted = [matcher.push(c) for c in ["Done.", "<", "|", "en", "d", "|>", " after"]]
    assert "".join(emitted) == "Done."
    assert matcher.matched == "<|end|>"
    assert matcher.push("more") == ""
    assert matcher.flush() == ""


def test_text_before_the_match_in_the_same_chunk_is_emitted() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.push("abc END def") == "abc "
    assert matcher.matched == "END"


def test_the_earliest_ending_stop_wins_and_the_longer_on_a_tie() -> None:
    assert feed(["abc", "b"], ["xabc"])[:2] == ("xa", "b")
    assert feed(["abc", "b"], ["xa", "bc"])[:2] == ("xa", "b")
    assert feed(["\n\nUser:", "User:"], ["Hi\n\nUser: x"])[:2] == ("Hi", "\n\nUser:")
    assert feed(["cd", "abcde"], ["abcdef"])[:2] == ("ab", "cd")


def test_empty_and_duplicate_stops_are_ignored() -> None:
    matcher = StopMatcher(["", "x", "x"])
    assert matcher.stops == ["x"]
    assert matcher.push("abc") == "abc"


alphabet = st.text(alphabet="abcST😀é\n", max_size=40)
stops = st.lists(st.text(alphabet="abcST😀é\n", min_size=1, max_size=4), min_size=1, max_size=3)


@settings(max_examples=500, deadline=None)
@given(text=alphabet, stop=st.text(alphabet="abcST😀é\n", min_size=1, max_size=4), data=st.data())
def test_single_stop_matches_the_first_occurrence_whatever_the_chunking(
    text: str, stop: str, data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=len(text)))
    out, matched, pieces = feed([stop], split(text, cuts))
    at = text.find(stop)
    if at < 0:
        assert (out, matched) == (text, None)
    else:
        assert (out, matched) == (text[:at], stop)
    assert stop not in out


@settings(max_examples=500, deadline=None)
@given(text=alphabet, stop_list=stops, data=st.data())
def test_many_stops_are_chunking_independent(text: str, stop_list: list[str], data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=len(text)))
    whole = feed(stop_list, [text])[:2]
    assert feed(stop_list, split(text, cuts))[:2] == whole
    out, matched = whole
    assert text.startswith(out)
    if matched is None:
        assert out == text
    else:
        assert text[len(out) :].startswith(matched)
        assert not any(s in out for s in stop_list)


@settings(max_examples=300, deadline=None)
@given(text=alphabet, stop_list=stops, data=st.data())
def test_held_text_is_always_shorter_than_the_longest_stop(
    text: str, stop_list: list[str], data: st.DataObject
) -> None:
    matcher = StopMatcher(stop_list)
    longest = max(len(s) for s in stop_list)
    for piece in split(text, data.draw(st.lists(st.integers(0, len(text)), max_size=len(text)))):
        matcher.push(piece)
        assert len(matcher._held) < longest
