#!/usr/bin/env python3
"""A greedy list schedule of one-CTA-a-tile grids in the two CTA orders of forward.cu's tile_order,
and the static schedule of persistent CTAs (PERSISTENT_CTAS = 1) in the same orders.

Not a measurement: a model that the comments on L2_SECTIONS and PERSISTENT_CTAS cite. Each SM takes
the next CTA in launch order when it frees; a CTA of query block q (causal, BLOCK_M = BLOCK_N) costs
(q + 1) key tiles of TILE_US plus CTA_US of start and end. A persistent CTA x takes tiles x, x + SMS,
... of the same order, without the CTA_US (hidden under the tile before). Tiles drawn from a counter
(PERSISTENT_CTAS = 2) are the greedy schedule again, without the CTA_US. Prints each schedule's
makespan past the ideal (total work / SMs; for the persistent ones, without the CTA_US).

    python3 scripts/tile-order-sim.py            # large-128-causal on 132 SMs
"""
import heapq

SMS, HEADS, Q_BLOCKS, SECTION_HEADS = 132, 32, 64, 8  # large-128-causal: 2 x 16 heads, 8192 / 128
TILE_US, CTA_US = 1.6, 2.6


def cost(q_rev):
    return (Q_BLOCKS - q_rev) * TILE_US + CTA_US


def makespan(durations):
    free = [0.0] * SMS
    for d in durations:
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free)


head_after_head = [cost(q) for _ in range(HEADS) for q in range(Q_BLOCKS)]
sections = [cost(q) for _ in range(HEADS // SECTION_HEADS) for q in range(Q_BLOCKS) for _ in range(SECTION_HEADS)]
ideal = sum(head_after_head) / SMS
tile_ideal = (sum(head_after_head) - CTA_US * len(head_after_head)) / SMS
for name, order in [("L2_SECTIONS = 0 (head after head)", head_after_head), ("L2_SECTIONS = 1 (sections)", sections)]:
    tiles = [d - CTA_US for d in order]
    print(f"{name}: {makespan(order):.1f} us, {100 * (makespan(order) / ideal - 1):.1f}% past the ideal {ideal:.1f} us")
    for schedule, span in [
        ("persistent, static", max(sum(tiles[x::SMS]) for x in range(SMS))),
        ("persistent, drawn from a counter", makespan(tiles)),
    ]:
        print(f"  {schedule}: {span:.1f} us, {100 * (span / tile_ideal - 1):.1f}% past its ideal {tile_ideal:.1f} us")
