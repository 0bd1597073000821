"""
A Hugging Face model through the whole protocol, offline
========================================================

Any ``transformers`` vision backbone is a model spec: ``"hf:facebook/dinov2-small"``
reads the model, its weights and its image processor from the Hugging Face cache (never
from the network), and the features are the class token, as DINOv2's own linear
evaluation takes them. Here the model is DINOv2-shaped but small, built from its
configuration in a local folder (``:none``: random weights, nothing to download), with
DINOv2's real image-processor settings. It goes through :func:`~imagenet_cog.extract_all`
and :func:`~imagenet_cog.evaluate` on a tiny image tree this example makes itself.
"""

# %%
import json
import pathlib
import tempfile

import matplotlib.pyplot as plt
import numpy as np
from PIL import Image
from transformers import Dinov2Config

from imagenet_cog import Levels, comparability, evaluate, extract_all, open_store

root = pathlib.Path(tempfile.mkdtemp())
model = root / "dinov2-tiny"
Dinov2Config(
    hidden_size=96, num_hidden_layers=2, num_attention_heads=3, patch_size=14, image_size=518
).save_pretrained(model)
# The image processor of facebook/dinov2-*: shorter side 256, centre crop 224, bicubic.
processor = {
    "image_processor_type": "BitImageProcessor",
    "size": {"shortest_edge": 256},
    "crop_size": {"height": 224, "width": 224},
    "do_center_crop": True,
    "resample": 3,
    "image_mean": [0.485, 0.456, 0.406],
    "image_std": [0.229, 0.224, 0.225],
}
(model / "preprocessor_config.json").write_text(json.dumps(processor))
spec = f"hf:{model}:none"

# %%
# Six "concepts" of coloured noise, in two levels of three: L1's colours far apart,
# L2's close to one another, so that L2 is the harder level.
rng = np.random.default_rng(0)
colours = [
    (200, 40, 40),
    (40, 200, 40),
    (40, 40, 200),
    (120, 120, 120),
    (140, 120, 120),
    (120, 140, 120),
]
wnids = [f"n0000000{i}" for i in range(1, 7)]
for wnid, colour in zip(wnids, colours):
    (root / "in21k" / wnid).mkdir(parents=True)
    for i in range(12):
        shade = np.add(colour, rng.normal(0, 15, size=3))  # each image a shade of its colour
        pixels = np.clip(rng.normal(shade, 70, size=(64, 80, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(root / "in21k" / wnid / f"{wnid}_{i}.JPEG")
levels = Levels([wnids[:3], wnids[3:]])

# %%
# Every store in one call, the network loaded once. The store's key records the feature
# layer and the preprocessing the image processor prescribes.
store = extract_all(
    spec,
    {"in21k": root / "in21k"},
    root / "features",
    levels,
    n_test=3,
    batch_size=16,
    progress=False,
)
key = open_store(store / "L1" / "train").key
print({k: key[k] for k in ("layer", "preprocessing")})

# %%
# The protocol, at a reduced scale (fewer trials and epochs) so that it takes seconds.
results = evaluate(
    store,
    domains=("L1", "L2"),
    shots=(2, "all"),
    seeds=(22, 37),
    n_trials=4,
    n_startup_trials=2,
    epochs=10,
    device="cpu",
    progress=False,
)
print(results.table())

# %%
# Next to the paper's models, this one is "another model": compared under the same
# protocol, with no paper preset claimed for it.
print(next(note for note in comparability(results) if "paper's 31" in note))

# %%
fig, ax = plt.subplots(figsize=(4.5, 3))
means = [results.mean(spec, d, "all") for d in ("L1", "L2")]
ax.bar(["L1", "L2"], means, color=["tab:blue", "tab:orange"])
ax.set_ylabel("top-1 (%), all training images")
ax.set_title("A DINOv2-shaped model (random weights)")
fig.tight_layout()
