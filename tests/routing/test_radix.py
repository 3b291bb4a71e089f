"""The approximate prefix tree: matching, per-worker sizes, LRU trimming, removal."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from smg.routing.policies.radix import Match, PrefixTree


def test_match_counts_characters_and_names_the_holders() -> None:
    tree = PrefixTree()
    tree.insert("hello world", "a")
    tree.insert("hello there", "b")
    assert tree.match("hello world") == Match(11, 11, ("a",))
    # Stopping inside the shared "hello " node: both hold it.
    assert tree.match("hello") == Match(5, 5, ("a", "b"))
    # Falling off after "hello t": the holders are those of the node the walk stopped in.
    assert tree.match("hello tx") == Match(7, 8, ("b",))
    assert tree.match("goodbye") == Match(0, 7, ())
    assert tree.match("") == Match(0, 0, ())
    assert tree.match("hello wor").ratio == 1.0


def test_sizes_count_a_shared_prefix_once_per_worker() -> None:
    tree = PrefixTree()
    tree.insert("hello world", "a")
    tree.insert("hello there", "b")
    tree.insert("hello", "a")
    assert tree.sizes() == {"a": 11, "b": 11}
    assert tree.total == 22


def test_evict_drops_least_recently_used_leaves_first() -> None:
    tree = PrefixTree()
    tree.insert("aaaa1111", "a")  # oldest
    tree.insert("bbbb2222", "b")
    tree.insert("aaaa3333", "a")
    tree.evict(16)
    # "1111" went first (4 chars); 20 -> 16.
    assert tree.sizes() == {"a": 8, "b": 8}
    assert tree.match("aaaa1111") == Match(4, 8, ("a",))
    tree.evict(8)
    # Then all of b ("bbbb2222" as one leaf) is older than a's "3333".
    assert tree.sizes() == {"a": 8, "b": 0}
    assert tree.match("bbbb2222") == Match(0, 8, ())


def test_evict_reaches_a_parent_once_its_children_are_gone() -> None:
    tree = PrefixTree()
    tree.insert("root-x", "a")
    tree.insert("root-y", "a")
    tree.evict(0)
    assert tree.total == 0
    assert tree.match("root-x") == Match(0, 6, ())


def test_insert_refreshes_the_whole_path() -> None:
    tree = PrefixTree()
    tree.insert("shared-1", "a")
    tree.insert("other", "b")
    tree.insert("shared-1", "a")  # a's path is now newer than b's
    tree.evict(8)
    assert tree.sizes() == {"a": 8, "b": 0}


def test_remove_forgets_a_worker_and_prunes_its_nodes() -> None:
    tree = PrefixTree()
    tree.insert("hello world", "a")
    tree.insert("hello there", "b")
    tree.remove("a")
    assert tree.sizes() == {"b": 11}
    assert tree.total == 11
    assert tree.match("hello world") == Match(6, 11, ("b",))
    tree.remove("b")
    assert tree.total == 0
    assert tree.match("hello") == Match(0, 5, ())


@settings(max_examples=80, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["insert", "evict", "remove"]), st.text("abc", max_size=8), st.sampled_from("xyz")),
        max_size=40,
    )
)
def test_sizes_stay_the_sum_of_what_each_worker_holds(ops: list[tuple[str, str, str]]) -> None:
    tree = PrefixTree()
    for op, text, worker in ops:
        if op == "insert":
            tree.insert(text, worker)
            assert tree.match(text).matched == len(text)
        elif op == "evict":
            tree.evict(len(text))
            assert tree.total <= len(text)
        else:
            tree.remove(worker)
            assert worker not in tree.sizes()
        assert tree.total == sum(tree.sizes().values())
        assert all(size >= 0 for size in tree.sizes().values())


@settings(max_examples=150, deadline=None)
@given(
    inserts=st.lists(st.tuples(st.text("abc", max_size=10), st.sampled_from("xyz")), max_size=25),
    query=st.text("abc", max_size=12),
)
def test_match_agrees_with_a_brute_force_scan(inserts: list[tuple[str, str]], query: str) -> None:
    tree = PrefixTree()
    for text, worker in inserts:
        tree.insert(text, worker)

    def shared(a: str, b: str) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    matched = max((shared(query, text) for text, _ in inserts), default=0)
    # Every text extending the matched part runs through the node the walk stops in.
    holders = {worker for text, worker in inserts if text.startswith(query[:matched])} if matched else set()
    result = tree.match(query)
    assert (result.matched, result.total, set(result.tenants)) == (matched, len(query), holders)
    # A worker holds one character for each distinct non-empty prefix of its texts.
    for worker, size in tree.sizes().items():
        assert size == len({text[:i] for text, w in inserts if w == worker for i in range(1, len(text) + 1)})
