"""Write the small real photos that ``imagenet-cog selftest`` decodes.

Run once, by a maintainer, with matplotlib and scikit-learn installed::

    python tools/make_selftest_photos.py

It reads three photos that ship inside those packages (their provenance and
licences are in ``src/imagenet_cog/data/PROVENANCE.rst``), downscales or crops
them, and writes four JPEGs of tens of KB to ``src/imagenet_cog/data/photos/``.
They differ in what a JPEG decoder has to do, as ImageNet's files do: baseline
4:2:0 (the common case), progressive, 4:4:4 chroma, and grayscale smaller than
the 224 px input (upscaled by the preprocessing). The output is deterministic
for a given Pillow version.
"""

import hashlib
from pathlib import Path

from PIL import Image

OUT = Path(__file__).resolve().parents[1] / "src" / "imagenet_cog" / "data" / "photos"


def sources():
    import matplotlib.cbook
    import sklearn.datasets

    images = Path(sklearn.datasets.__file__).parent / "images"
    return {
        "grace_hopper": Path(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)),
        "china": images / "china.jpg",
        "flower": images / "flower.jpg",
    }


def main():
    src = sources()
    OUT.mkdir(parents=True, exist_ok=True)
    with Image.open(src["grace_hopper"]) as im:
        hopper = im.convert("RGB")
    with Image.open(src["china"]) as im:
        china = im.convert("RGB")
    with Image.open(src["flower"]) as im:
        flower = im.convert("RGB")
    outputs = {
        # 512x600 -> 320x375, baseline, 4:2:0 chroma (Pillow's default)
        "grace_hopper.jpg": (hopper.resize((320, 375), Image.Resampling.LANCZOS), {"quality": 88}),
        # grayscale, smaller than the 224 px input: the preprocessing upscales it
        "grace_hopper_gray.jpg": (
            hopper.convert("L").resize((160, 188), Image.Resampling.LANCZOS),
            {"quality": 88},
        ),
        # 640x427 -> 400x267, progressive
        "china.jpg": (
            china.resize((400, 267), Image.Resampling.LANCZOS),
            {"quality": 85, "progressive": True},
        ),
        # the central 360x270 crop at full resolution, 4:4:4 chroma
        "flower.jpg": (flower.crop((140, 78, 500, 348)), {"quality": 85, "subsampling": 0}),
    }
    for name, (image, options) in outputs.items():
        path = OUT / name
        image.save(path, "JPEG", optimize=True, **options)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        print(
            f"{name}: {image.size[0]}x{image.size[1]} {image.mode}, "
            f"{path.stat().st_size / 1000:.1f} kB, sha256 {digest}"
        )


if __name__ == "__main__":
    main()
