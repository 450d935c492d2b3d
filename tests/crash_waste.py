"""What a `kill -9` may waste: the ranges the killed node held, and no more.

A node logs ``event=range_taken`` after its pop returns, and its preloader logs
``event=range_claimed`` after the claim is marked; so the killed run held more
than its log names: one pop in flight (a block no wider than a range, inside a
range some preloader logged as claimed) and one claim in flight (a block no log
names at all). Ranges any other run took must lose nothing.
"""

from __future__ import annotations

from ops.toolkit import NodeProcess

Run = tuple[NodeProcess, int]  # a node and the index of one of its logs


def blocks(ids: set[int]) -> list[tuple[int, int]]:
    """The IDs as contiguous [start, end) blocks, in order."""
    found: list[tuple[int, int]] = []
    for i in sorted(ids):
        if found and found[-1][1] == i:
            found[-1] = (found[-1][0], i + 1)
        else:
            found.append((i, i + 1))
    return found


def assert_only_the_killed_run_wasted(missing: set[int], runs: list[Run], killed: Run) -> None:
    """``missing``: IDs below the ledger's max_id neither issued nor in the pool."""
    node, index = killed
    held = node.held_ranges(index)
    assert held, "the killed node's log names no range"
    outside_ids = {i for i in missing if not any(s <= i < e for s, e in held)}
    # (a remainder another run returned and the killed run took is the killed run's)
    others_took = [r for n, i in runs if (n, i) != killed for r in n.held_ranges(i, False)]
    lost = [i for i in outside_ids if any(s <= i < e for s, e in others_took)]
    assert not lost, f"{len(lost)} IDs lost from ranges that surviving runs took"
    logged = [r for n, i in runs for r in n.held_ranges(i)]
    widest = max(e - s for n, i in runs for s, e in n.held_ranges(i, False))
    outside = blocks(outside_ids)
    popped = [(s, e) for s, e in outside if any(a <= s and e <= b for a, b in logged)]
    unlogged = [(s, e) for s, e in outside if not any(a < e and s < b for a, b in logged)]
    assert len(popped) <= 1 and all(e - s <= widest for s, e in popped), f"lost: {popped}"
    assert len(unlogged) <= 1, f"IDs no log names lost: {unlogged}"
    assert len(popped) + len(unlogged) == len(outside), f"lost outside the node's: {outside}"
