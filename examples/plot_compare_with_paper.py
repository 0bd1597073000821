"""
Placing a model among the paper's 31
====================================

The paper publishes every number of its 31 models (supplementary Tables
5-10); :func:`imagenet_cog.reference_results` ships them. Here a made-up run
(5 seeds, all shots) is ranked among them, shown relative to ResNet50, and
drawn over the published models.
"""

# %%
import tempfile

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np

from imagenet_cog import Results, reference_results

paper = reference_results()
print(paper.subset(models=["ResNet50", "s-DINO", "a-DeiT-B-distilled"]).table(with_std=False))

# %%
# A hypothetical model: DINO's numbers plus a little, with seed noise.
rng = np.random.default_rng(0)
cells = [
    {
        "model": "my-model",
        "domain": d,
        "shots": n,
        "seed": seed,
        "top1": paper.mean("s-DINO", d, n) + 0.6 + rng.normal(0, 0.2),
    }
    for d in paper.domains
    for n in paper.shots
    for seed in (22, 37, 45, 77, 93)
]
mine = Results(
    cells, meta={"protocol": {"my-model": {"trials_per_batch": 1, "levels": "official"}}}
)
both = mine.compare(paper, baseline="ResNet50")
print(both.comparison_report())

# %%
# The Figure 3-style plot: the published models faint, ours bold.
out = tempfile.mkdtemp()
paths = both.plot(out, baseline="ResNet50", highlight=["my-model"])
fig, axes = plt.subplots(1, 2, figsize=(12, 4))
for ax, name in zip(axes, ["levels_absolute.png", "levels_relative.png"]):
    ax.imshow(mpimg.imread(f"{out}/{name}"))
    ax.axis("off")
fig.tight_layout()
