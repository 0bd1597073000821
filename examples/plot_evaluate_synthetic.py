"""
The protocol on synthetic features
==================================

:func:`imagenet_cog.evaluate` runs every domain x shots x seed cell of the
ImageNet-CoG protocol. Here the "features" are Gaussian classes whose
separation falls from IN-1K to L5, as a representation's does on the real
levels, and the protocol runs at a reduced scale (fewer trials and epochs)
so the example takes seconds on a CPU.
"""

# %%
import numpy as np

from imagenet_cog import evaluate

rng = np.random.default_rng(0)


def domain(separation, n_classes=20, n_train=40, n_test=20, dim=32):
    means = rng.normal(size=(n_classes, dim)) * separation
    y_train = np.repeat(np.arange(n_classes), n_train)
    y_test = np.repeat(np.arange(n_classes), n_test)
    X_train = means[y_train] + rng.normal(size=(len(y_train), dim)) * 4
    X_test = means[y_test] + rng.normal(size=(len(y_test), dim)) * 4
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
    return unit(X_train), y_train, unit(X_test), y_test


separations = dict(zip(["in1k", "L1", "L2", "L3", "L4", "L5"], [1.6, 1.3, 1.1, 0.95, 0.8, 0.65]))
features = {d: domain(s) for d, s in separations.items()}

# %%
results = evaluate(
    features,
    shots=(1, 4, 16, "all"),
    seeds=(22, 37, 45),
    n_trials=8,
    epochs=15,
    device="cpu",
    progress=False,
)
print(results.table())
print()
print(results.table(domain="L5"))

# %%
# The Figure 3 and Figure 4 views.
import tempfile

import matplotlib.image as mpimg
import matplotlib.pyplot as plt

out = tempfile.mkdtemp()
results.plot(out)
fig, axes = plt.subplots(1, 2, figsize=(14, 4.5), gridspec_kw={"width_ratios": [1, 1.6]})
for ax, name in zip(axes, ["levels_absolute.png", "fewshot.png"]):
    ax.imshow(mpimg.imread(f"{out}/{name}"))
    ax.axis("off")
fig.tight_layout()
