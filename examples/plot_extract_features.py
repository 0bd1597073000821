"""
Extracting features into a resumable store
==========================================

Phase 1 of ImageNet-CoG on a tiny image folder this example makes itself:
two "concepts" of coloured images, a ResNet-18 with random weights (no
download), features l2-normalised. The store records everything that shaped
the features, and a second call reuses it instead of recomputing.
"""

# %%
import pathlib
import tempfile

import matplotlib.pyplot as plt
import numpy as np
from PIL import Image

from imagenet_cog import FeatureExtractor, Levels, extract, load_domain, open_store

root = pathlib.Path(tempfile.mkdtemp())
rng = np.random.default_rng(0)
concepts = {"n00000001": (200, 40, 40), "n00000002": (40, 40, 200)}  # reddish, bluish
for wnid, colour in concepts.items():
    (root / "images" / wnid).mkdir(parents=True)
    for i in range(12):
        pixels = np.clip(rng.normal(colour, 60, size=(48, 48, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(root / "images" / wnid / f"{wnid}_{i}.JPEG")
(root / "images" / "n00000001" / "broken.JPEG").write_bytes(b"not an image")

# %%
# ``transform`` works on paths or PIL images, like any scikit-learn transformer.
extractor = FeatureExtractor("torchvision:resnet18:none", preprocessing={"size": 64}, batch_size=8)
paths = sorted((root / "images" / "n00000002").glob("*.JPEG"))[:3]
print(extractor.transform([str(p) for p in paths]).shape)

# %%
# A level made of the two concepts; 3 test images each, the rest for training.
level = Levels([list(concepts)])
for split in ("train", "test"):
    path = extract(
        extractor, root / "images", "L1", split, root / "features", level, n_test=3, progress=False
    )
store = open_store(root / "features" / "L1" / "train")
print(store)
print("skipped:", store.skipped)
print("key:", {k: store.key[k] for k in ("model", "layer", "normalize", "split_sha256")})

# %%
# Extracting again with the same settings finds the finished store.
again = extract(
    extractor, root / "images", "L1", "train", root / "features", level, n_test=3, progress=False
)
print("reused:", again == store.path)

# %%
# The features of the two concepts, projected on their first two principal axes.
X, y, X_test, y_test = load_domain(root / "features", "L1")
centred = X - X.mean(0)
_, _, vt = np.linalg.svd(centred, full_matrices=False)
xy = centred @ vt[:2].T
fig, ax = plt.subplots(figsize=(5, 4))
for wnid, colour in concepts.items():
    mask = y == wnid
    ax.scatter(*xy[mask].T, color=np.array(colour) / 255, label=wnid)
ax.set_title("ResNet-18 (random weights) features")
ax.legend()
fig.tight_layout()
