"""
Knowledge-driven error analysis
===============================

Two made-up ImageNet-1K classifiers with the same accuracy: one confuses a
concept with its WordNet siblings, the other with random concepts.
:func:`~imagenet_cog.analysis.semantic_errors` tells them apart: the path,
Leacock-Chodorow and Wu-Palmer similarity of true and predicted concepts, the
sibling rate, and the most frequent confusions with the WordNet path that
explains each.
"""

# %%
import matplotlib.pyplot as plt
import numpy as np

from imagenet_cog import imagenet1k_wnids, load_taxonomy
from imagenet_cog.analysis import semantic_errors

tax = load_taxonomy()
classes = np.array(imagenet1k_wnids())
rng = np.random.default_rng(0)
y_true = np.repeat(classes, 10)

# Siblings of each class among the IN-1K classes (sharing a parent).
parent = {w: set(tax.parents(w)) for w in classes}
siblings = {w: [v for v in classes if v != w and parent[v] & parent[w]] for w in classes}

wrong = rng.random(len(y_true)) < 0.3  # 70% accuracy for both
near, far = y_true.copy(), y_true.copy()
for i in np.flatnonzero(wrong):
    t = y_true[i]
    near[i] = rng.choice(siblings[t]) if siblings[t] else rng.choice(classes)
    far[i] = rng.choice(classes[classes != t])

# %%
reports = {
    "confuses siblings": semantic_errors(y_true, near),
    "confuses at random": semantic_errors(y_true, far),
}
for name, rep in reports.items():
    o = rep.overall
    print(
        f"{name:>20}: accuracy {o['accuracy']:.2f}, path {o['path']:.3f}, "
        f"Wu-Palmer {o['wup']:.3f}, sibling rate {o['sibling_rate']:.2f}"
    )

# %%
# The top confusions of one class, with the WordNet path that joins them.
tiger_cat = "n02123159"
for c in reports["confuses siblings"].confusions[tiger_cat][:3]:
    print(f"MF {c.mf:.2f}  {c.explain()}")

# %%
metrics = ["path", "lch", "wup", "sibling_rate"]
fig, ax = plt.subplots(figsize=(7, 3.5))
x = np.arange(len(metrics))
for k, (name, rep) in enumerate(reports.items()):
    ax.bar(x + 0.38 * k, [rep.overall[m] for m in metrics], width=0.38, label=name)
ax.set_xticks(x + 0.19, ["path", "Leacock-Chodorow", "Wu-Palmer", "sibling rate"])
ax.set_title("Same accuracy, different mistakes")
ax.legend()
fig.tight_layout()
