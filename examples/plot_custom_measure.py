"""
Your own similarity measure
===========================

A measure is any callable ``(wnids_a, wnids_b, *, taxonomy) -> matrix``.
Register it and use it wherever a measure name is accepted. Here: how far
apart two concepts sit in depth, compared with Lin and Wu-Palmer on the
official levels.
"""

# %%
import matplotlib.pyplot as plt
import numpy as np

from imagenet_cog import (
    build_levels,
    imagenet1k_wnids,
    load_levels,
    max_similarity,
    register_measure,
)


def depth_gap(wnids_a, wnids_b, *, taxonomy):
    """Minus the difference of WordNet depths: concepts at similar depth are 'similar'."""
    da = taxonomy.min_depth[taxonomy.indices(wnids_a)]
    db = taxonomy.min_depth[taxonomy.indices(wnids_b)]
    return -np.abs(da[:, None] - db[None, :]).astype(float)


register_measure("depth-gap", depth_gap, overwrite=True)

# %%
# Re-rank the official 5000 concepts with it (supplement D's experiment).
levels = build_levels(measure="depth-gap", candidates="cog")
official = load_levels("official")
for name, mine, theirs in zip(levels.names, levels.levels, official.levels):
    print(f"{name}: {len(set(mine) & set(theirs)):>4} of 1000 concepts in the official {name}")

# %%
# How the built-in measures spread the official levels: the mean similarity
# to IN-1K per official level.
seen = imagenet1k_wnids()
fig, ax = plt.subplots(figsize=(6, 3.5))
for measure in ("lin", "wup", "path"):
    means = [max_similarity(measure, level, seen).mean() for level in official.levels]
    ax.plot(official.names, means, marker="o", label=measure)
ax.set_ylabel("mean similarity to IN-1K")
ax.set_title("Official levels under three WordNet measures")
ax.legend()
fig.tight_layout()
