"""The approximate prefix tree of one model: which workers were recently sent which routing texts.

A radix tree over characters whose nodes record the workers ("tenants") whose texts pass through
them, each with the tick it was last used. `match` says how many leading characters of a text the
tree holds and which workers hold them; `insert` records a text for a worker. Size is counted per
worker (a prefix two workers share counts twice, once for each cache it stands for), and `evict`
trims the least recently used leaves, across workers, until the total is within a budget. Ticks
are a counter, not a clock: only their order matters, and it keeps the tree deterministic.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


@dataclass(eq=False)
class _Node:
    text: str
    parent: _Node | None
    children: dict[str, _Node] = field(default_factory=dict)
    tenants: dict[str, int] = field(default_factory=dict)  # worker id -> tick of last use

    def is_leaf_for(self, tenant: str) -> bool:
        return tenant in self.tenants and not any(tenant in child.tenants for child in self.children.values())


@dataclass(frozen=True, slots=True)
class Match:
    matched: int  # characters of the text the tree holds
    total: int  # characters in the text
    tenants: tuple[str, ...]  # workers holding the deepest node reached, in arrival order

    @property
    def ratio(self) -> float:
        return self.matched / self.total if self.total else 0.0


def _shared(text: str, pos: int, edge: str) -> int:
    """How many characters of `edge` match `text` from `pos`; the first one is known to."""
    if text.startswith(edge, pos):
        return len(edge)
    # Bisect on slice equality: memcmp-speed comparisons instead of a loop over characters.
    lo, hi = 1, min(len(edge), len(text) - pos)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if text[pos : pos + mid] == edge[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixTree:
    def __init__(self) -> None:
        self._root = _Node("", None)
        self._tick = 0
        self._sizes: dict[str, int] = {}
        self.total = 0  # characters held, summed over workers

    def sizes(self) -> dict[str, int]:
        """Characters each worker holds."""
        return dict(self._sizes)

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick

    def match(self, text: str) -> Match:
        node, pos = self._root, 0
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None:
                break
            shared = _shared(text, pos, child.text)
            pos += shared
            node = child
            if shared < len(child.text):
                break
        return Match(pos, len(text), tuple(node.tenants) if pos else ())

    def _attach(self, node: _Node, tenant: str, tick: int) -> None:
        if tenant not in node.tenants:
            self._sizes[tenant] = self._sizes.get(tenant, 0) + len(node.text)
            self.total += len(node.text)
        node.tenants[tenant] = tick

    def insert(self, text: str, tenant: str) -> None:
        tick = self._next_tick()
        self._root.tenants.setdefault(tenant, 0)
        self._sizes.setdefault(tenant, 0)
        node, pos = self._root, 0
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None:
                leaf = _Node(text[pos:], node)
                node.children[text[pos]] = leaf
                self._attach(leaf, tenant, tick)
                return
            shared = _shared(text, pos, child.text)
            if shared < len(child.text):
                # Split: the shared part becomes a node of its own, held by everyone who held the
                # child; each of them keeps the same number of characters.
                upper = _Node(child.text[:shared], node, tenants=dict(child.tenants))
                node.children[text[pos]] = upper
                child.text = child.text[shared:]
                child.parent = upper
                upper.children[child.text[0]] = child
                child = upper
            self._attach(child, tenant, tick)
            node, pos = child, pos + shared

    def evict(self, budget: int) -> None:
        """Drop least recently used leaves until at most `budget` characters are held."""
        if self.total <= budget:
            return
        heap: list[tuple[int, int, str, _Node]] = []
        order = 0  # tie-break for equal ticks, so nodes are never compared
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for tenant, tick in node.tenants.items():
                if node.is_leaf_for(tenant):
                    heap.append((tick, order, tenant, node))
                    order += 1
        heapq.heapify(heap)
        while self.total > budget and heap:
            _, _, tenant, node = heapq.heappop(heap)
            if not node.is_leaf_for(tenant):
                continue
            self._detach(node, tenant)
            parent = node.parent
            if parent is not None and parent is not self._root and parent.is_leaf_for(tenant):
                heapq.heappush(heap, (parent.tenants[tenant], order, tenant, parent))
                order += 1

    def _detach(self, node: _Node, tenant: str) -> None:
        del node.tenants[tenant]
        self._sizes[tenant] -= len(node.text)
        self.total -= len(node.text)
        while node.parent is not None and not node.children and not node.tenants:
            del node.parent.children[node.text[0]]
            node = node.parent

    def remove(self, tenant: str) -> None:
        """Forget everything `tenant` holds."""
        stack = [self._root]
        held: list[_Node] = []
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if tenant in node.tenants and node is not self._root:
                held.append(node)
        # Deepest first, so a node is emptied of children before it is checked for removal.
        for node in reversed(held):
            if tenant in node.tenants:
                self._detach(node, tenant)
        self._root.tenants.pop(tenant, None)
        self.total -= self._sizes.pop(tenant, 0)
