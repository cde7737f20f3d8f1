"""Draws a pool as one cell per block so fragmentation and sharing show at a glance.

grey = free, teal = cached-free (reusable prefix), orange→dark red = used, darker the more
sequences share the block.
"""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")  # files only: no display here or in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from pagedserve.allocator.v1 import allocator_pb2 as pb  # noqa: E402

FREE = to_rgb("#d9d9d9")
CACHED_FREE = to_rgb("#41b6c4")
USED_LIGHT = to_rgb("#fdae61")
USED_DARK = to_rgb("#7f0000")


def used_colour(ref_count: int, max_ref_count: int) -> tuple[float, float, float]:
    """Shade from light (refcount 1) to dark (the pool's highest refcount)."""
    share = 0.0 if max_ref_count <= 1 else (ref_count - 1) / (max_ref_count - 1)
    return tuple(light + (dark - light) * share  # type: ignore[return-value]
                 for light, dark in zip(USED_LIGHT, USED_DARK))


def draw_pool(dump: pb.DumpBlocksResponse, path: str) -> None:
    blocks = list(dump.blocks)
    columns = max(1, math.ceil(math.sqrt(len(blocks) * 2)))
    rows = max(1, math.ceil(len(blocks) / columns))
    max_ref = max((b.ref_count for b in blocks), default=1)
    image = [[(1.0, 1.0, 1.0)] * columns for _ in range(rows)]
    counts = {"free": 0, "cached-free": 0, "used": 0}
    for block in blocks:
        if block.state == pb.BLOCK_STATE_USED:
            colour, counts["used"] = used_colour(block.ref_count, max_ref), counts["used"] + 1
        elif block.state == pb.BLOCK_STATE_CACHED_FREE:
            colour, counts["cached-free"] = CACHED_FREE, counts["cached-free"] + 1
        else:
            colour, counts["free"] = FREE, counts["free"] + 1
        image[block.block_id // columns][block.block_id % columns] = colour

    width = min(16.0, max(6.0, columns * 0.25))
    figure, axes = plt.subplots(figsize=(width, max(3.0, width * rows / columns + 1.2)))
    axes.imshow(image, interpolation="nearest", aspect="equal")
    # White lines between cells so neighbouring blocks of one state stay countable.
    axes.set_xticks([x - 0.5 for x in range(1, columns)], minor=True)
    axes.set_yticks([y - 0.5 for y in range(1, rows)], minor=True)
    axes.grid(which="minor", color="white", linewidth=0.6 if columns <= 64 else 0.2)
    axes.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
    axes.set_title(f"pool {dump.executor_id}: {len(blocks)} blocks of {dump.block_size} slots — "
                   f"{counts['used']} used, {counts['cached-free']} cached-free, "
                   f"{counts['free']} free (row-major by block id)", fontsize=9)
    legend = [Patch(color=FREE, label="free"), Patch(color=CACHED_FREE, label="cached-free"),
              Patch(color=USED_LIGHT, label="used, refcount 1")]
    if max_ref > 1:
        legend.append(Patch(color=USED_DARK, label=f"used, refcount {max_ref}"))
    axes.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=len(legend),
                fontsize=8, frameon=False)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
