"""Which images make up each split, and a torch Dataset that reads them.

Fourth stage of the pipeline (taxonomy → measures → levels → **datasets** →
features). The paper, Sec. 3.3 and supplement A.4: each CoG concept has 50 test images (the
package ships a third-party copy of the official lists,
``load_levels("official").test_images``) and the rest of its images for training,
capped at 1300 with a seeded choice (not the official training lists, which are not read).
ImageNet-1K uses its own train set and the ILSVRC-2012 validation set as test set.

Images are named by an *image id*, ``"<wnid>/<file name>"`` (for instance
``"n01322508/n01322508_2514.JPEG"``), whatever the layout of the copy on disk:
a folder per wnid, a tar file per wnid (the Winter 2021 release of
ImageNet-21K), webdataset shards or Parquet files, or, for the ImageNet-1K
validation set, a flat folder with a label file. Reading a copy, whatever its
layout, is the data wing's (``_data``); this module keeps the paper's split
policy and the torch Dataset. A :class:`Split` is a pure function of the
listing of the data root, the levels, the seed and the cap, and it is written
as a text manifest whose sha256 proves which images a run used.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import torch.utils.data

from ._data.listing import list_root
from ._data.pillow_decode import TRUNCATED_POLICIES, decode_checked, short_reason
from ._data.sources import (
    DATASET_ITEM,
    STALE_LISTING,
    UNNAMED_HELP,
    OpenTars,
    StaleListingError,
    is_pil,
    kind,
    read_bytes,
    source_id,
    unnamed_images,
)
from ._fileio import atomic_write_bytes
from .levels import load_levels, official_test_images
from .taxonomy import imagenet1k_wnids

# Public names are exported by the package (imagenet_cog.__all__), not here.
__all__: list[str] = []

#: Default seed of the seeded choices (train cap, test images of concepts
#: without a bundled test list). Changing it changes the split checksum.
SPLIT_SEED = 0
#: At most this many train images per CoG concept (the paper, supplement A.4).
TRAIN_CAP = 1300
#: Test images per CoG concept (the paper, supplement A.4).
N_TEST = 50
#: Header of a split manifest; the checksum covers it.
SPLIT_HEADER = "image_id\twnid"

_IN1K = "in1k"


# ------------------------------------------------------------------- splits
def _pick(ids, k, seed, purpose):
    """``k`` ids chosen by a seeded hash, returned sorted.

    The choice is a pure function of the ids, ``k``, the seed and the purpose:
    no random-number generator whose stream may change between versions.
    """
    if k >= len(ids):
        return sorted(ids)

    def rank(image_id):
        return hashlib.sha256(f"{seed}\t{purpose}\t{image_id}".encode()).digest(), image_id

    return sorted(sorted(ids, key=rank)[:k])


class Split:
    """The images of one split of one domain, in a fixed order.

    Images are ordered by concept (in the order of the domain's wnids, which
    are sorted) and, within a concept, by image id.

    Parameters
    ----------
    ids : sequence of str
        Image ids, ``"<wnid>/<file name>"``.
    labels : sequence of str
        The wnid of each image.
    sources : sequence, optional
        Where each image is: a path, a tar member or a Parquet image. ``None`` for a
        split read back from its manifest.
    info : dict, optional
        How the split was made (domain, split, data root, seed, cap...).

    Attributes
    ----------
    ids, labels, sources, info

    Examples
    --------
    >>> split = Split(["n1/a.JPEG", "n1/b.JPEG"], ["n1", "n1"])
    >>> [line.split(chr(9)) for line in split.to_tsv().splitlines()]
    [['image_id', 'wnid'], ['n1/a.JPEG', 'n1'], ['n1/b.JPEG', 'n1']]
    >>> split.checksum[:12]
    'aeb2aa774918'
    """

    def __init__(self, ids, labels, sources=None, info=None):
        self.ids = [str(x) for x in ids]
        self.labels = [str(x) for x in labels]
        if len(self.ids) != len(self.labels):
            raise ValueError(f"{len(self.ids)} ids but {len(self.labels)} labels")
        for image_id, label in zip(self.ids, self.labels):
            if "\t" in image_id or "\n" in image_id:
                raise ValueError(f"image id {image_id!r} contains a tab or a newline")
            if not image_id.startswith(f"{label}/"):
                raise ValueError(f"image id {image_id!r} does not start with its wnid {label}")
        self.sources = None if sources is None else list(sources)
        if self.sources is not None and len(self.sources) != len(self.ids):
            raise ValueError(f"{len(self.ids)} ids but {len(self.sources)} sources")
        self.info = dict(info or {})

    def __len__(self):
        return len(self.ids)

    def __repr__(self):
        what = "/".join(str(self.info[k]) for k in ("domain", "split") if k in self.info)
        n_concepts = len(set(self.labels))
        return f"Split({what or '?'}: {len(self)} images of {n_concepts} concepts)"

    @property
    def wnids(self):
        """The concepts, in order of first appearance."""
        return list(dict.fromkeys(self.labels))

    def to_tsv(self):
        """The canonical manifest text: a header, then ``image_id<TAB>wnid`` lines."""
        lines = [SPLIT_HEADER, *(f"{i}\t{w}" for i, w in zip(self.ids, self.labels))]
        return "\n".join(lines) + "\n"

    @property
    def checksum(self):
        """sha256 (hex) of :meth:`to_tsv` encoded as UTF-8."""
        if getattr(self, "_checksum", None) is None:
            self._checksum = hashlib.sha256(self.to_tsv().encode("utf-8")).hexdigest()
        return self._checksum

    def save(self, path):
        """Write the manifest (:meth:`to_tsv`) atomically; returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, self.to_tsv().encode("utf-8"))
        return path

    @classmethod
    def read(cls, path, checksum=None):
        """Read a manifest written by :meth:`save`.

        Parameters
        ----------
        path : path
        checksum : str, optional
            The expected sha256; a different content raises ``ValueError``.

        Returns
        -------
        Split
            Without sources.
        """
        raw = Path(path).read_bytes()
        if checksum is not None and hashlib.sha256(raw).hexdigest() != checksum:
            raise ValueError(f"{path}: its sha256 is not the recorded {checksum}")
        lines = raw.decode("utf-8").splitlines()
        if not lines or lines[0] != SPLIT_HEADER:
            raise ValueError(f"{path}: not a split manifest (first line must be {SPLIT_HEADER!r})")
        rows = [line.split("\t") for line in lines[1:]]
        if any(len(r) != 2 for r in rows):
            raise ValueError(f"{path}: every line must be 'image_id<TAB>wnid'")
        return cls([r[0] for r in rows], [r[1] for r in rows])

    def dataset(self, transform=None):
        """An :class:`ImageDataset` over this split's images."""
        if self.sources is None:
            raise ValueError("this split was read from a manifest and has no image sources")
        return ImageDataset(self.sources, self.ids, self.labels, transform=transform)


def make_split(
    data,
    domain,
    split,
    levels="official",
    *,
    seed=SPLIT_SEED,
    cap=TRAIN_CAP,
    n_test=N_TEST,
    wnids=None,
    official_test=True,
    val_labels=None,
    progress=False,
):
    """The images of one split of a domain, as a pure function of the data listing.

    For a CoG level (``"L1"``...), each concept's test images are its bundled copy of the
    official test list (the paper, supplement A.4;
    ``load_levels("official").test_images``) when ``official_test`` and the
    concept has one, else
    ``n_test`` images chosen with ``seed``. Its train images are all the other
    images, of which at most ``cap`` are kept, chosen with ``seed``. A seeded
    choice ranks the image ids by ``sha256(f"{seed}\\t{purpose}\\t{id}")``,
    so it depends only on the ids, never on a random-number generator.

    For ``"in1k"``, ``data`` holds ``train/`` (a folder or a tar per wnid) and
    ``val/`` (a folder per wnid, or flat files with a label file); the test
    split is the validation set and nothing is capped.

    Parameters
    ----------
    data : path
        The ImageNet-21K root for the levels (``root/<wnid>/`` folders or
        ``root/<wnid>.tar`` files), the ImageNet-1K root for ``"in1k"``.
    domain : str
        ``"in1k"`` or a level name of ``levels`` (``"L1"`` to ``"L5"``).
    split : {"train", "test"}
    levels : "official", path or Levels
    seed : int
        Seed of the seeded choices, :data:`SPLIT_SEED` by default.
    cap : int or None
        Most train images per CoG concept, :data:`TRAIN_CAP` by default.
    n_test : int
        Test images per CoG concept without a bundled test list.
    wnids : sequence of str, optional
        Only these concepts of the domain (a quick check on a few concepts).
    official_test : bool
        Use the bundled copies of the official test lists where a concept has one.
    val_labels : path, optional
        Label file of a flat ImageNet-1K ``val/`` folder; the bundled
        ILSVRC-2012 labels by default.
    progress : bool
        Show a progress bar while listing.

    Returns
    -------
    Split

    Raises
    ------
    FileNotFoundError, ValueError
        For a missing concept folder, an empty concept, a missing official
        test image or a concept with fewer images than the split needs; the
        message names the wnid.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from imagenet_cog import Levels
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> for w in ["n00000001", "n00000002"]:
    ...     (root / w).mkdir()
    ...     for i in range(4):
    ...         _ = (root / w / f"{w}_{i}.JPEG").write_bytes(b"")
    >>> levels = Levels([["n00000001", "n00000002"]])
    >>> test = make_split(root, "L1", "test", levels, n_test=1)
    >>> test.ids
    ['n00000001/n00000001_1.JPEG', 'n00000002/n00000002_1.JPEG']
    >>> len(make_split(root, "L1", "train", levels, n_test=1, cap=2))
    4
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    data = Path(data)
    if domain == _IN1K:
        domain_wnids = list(imagenet1k_wnids())
    else:
        lv = load_levels(levels)
        if domain not in lv.names:
            raise ValueError(f"unknown domain {domain!r}; use 'in1k' or one of {lv.names}")
        domain_wnids = sorted(lv[domain])
    if wnids is not None:
        wnids = sorted(dict.fromkeys(wnids))
        extra = [w for w in wnids if w not in set(domain_wnids)]
        if extra:
            raise ValueError(f"not concepts of {domain}: {', '.join(extra[:10])}")
        domain_wnids = wnids
    info = {"domain": domain, "split": split, "data_root": str(data.resolve())}
    if domain != _IN1K:
        if cap is not None and cap < 1:
            raise ValueError(f"cap must be positive or None, got {cap}")
        if n_test < 1:
            raise ValueError(f"n_test must be positive, got {n_test}")
    # ImageNet-1K's splits are its train and validation parts; a level's, all the images.
    part = split if domain == _IN1K else "all"
    found = list_root(data, domain_wnids, part=part, val_labels=val_labels, progress=progress)
    listing = found.images
    info["layout"] = found.layout
    if found.copy is not None:  # a published copy, or ImageNet-21K-P as folders
        info["copy"] = found.copy
    if found.val_labels is not None:
        info["val_labels"] = found.val_labels
    if domain == _IN1K:
        chosen = {w: list(listing[w]) for w in domain_wnids}
    else:
        # Levels read from a file carry no test lists: concepts of the official
        # pool (re-ranked levels, supplement D) still get their official ones.
        official = lv.test_images if lv.test_images is not None else official_test_images()
        chosen = {}
        n_official = 0
        for wnid in domain_wnids:
            have = listing[wnid]
            if official_test and wnid in official:
                test = sorted(official[wnid])
                absent = [t for t in test if t not in have]
                unnamed = unnamed_images(have) if len(absent) == len(test) else []
                if unnamed:  # a copy without file names: no official test image can be found
                    raise ValueError(
                        f"{wnid}: its {len(have)} images in {data} have no file names (a Parquet "
                        "copy written from decoded images, "
                        f"{Path(have[unnamed[0]].path).name}), so its {len(test)} official test "
                        f"images, known by their file names, cannot be found among them; "
                        f"{UNNAMED_HELP}"
                    )
                if absent:
                    raise ValueError(
                        f"{wnid}: {len(absent)} of its {len(test)} listed test images are "
                        f"missing from {data}, e.g. {absent[0]}"
                    )
                n_official += 1
            else:
                if len(have) <= n_test:
                    raise ValueError(
                        f"{wnid}: {len(have)} images, fewer than the split needs ({n_test} test "
                        "images and at least 1 train image)"
                    )
                test = _pick(list(have), n_test, seed, "test")
            if split == "test":
                chosen[wnid] = test
                continue
            test_set = set(test)
            train = [i for i in have if i not in test_set]
            if not train:
                raise ValueError(f"{wnid}: no train image left after its {len(test)} test images")
            chosen[wnid] = _pick(train, cap, seed, "train") if cap is not None else train
        info.update(
            {
                "levels": lv.provenance.get("name", str(levels)),
                "levels_sha256": lv.checksum,
                "seed": seed,
                "cap": cap,
                "n_test": n_test,
                "official_test_lists": n_official,
            }
        )
    ids, labels, sources = [], [], []
    for wnid in domain_wnids:
        for image_id in chosen[wnid]:
            ids.append(image_id)
            labels.append(wnid)
            sources.append(listing[wnid][image_id])
    info["n_images"] = len(ids)
    info["n_concepts"] = len(domain_wnids)
    return Split(ids, labels, sources, info)


# ------------------------------------------------------------ reading images
def decode_image(data, *, truncated="raise"):
    """Decode image bytes into an RGB PIL image.

    Grayscale, CMYK, palette and alpha images are converted to RGB. Images of
    more than 8 bits per pixel are scaled to 8 bits, not clipped: 16-bit ones
    (``I;16``, and ``I`` with values in ``[0, 65535]``) are divided by 257;
    float ones (``F``) with values in ``[0, 1]`` are multiplied by 255; other
    ``I`` and ``F`` images are rescaled from their minimum and maximum to
    ``[0, 255]``; a float image with NaN or infinite values raises. PIL's
    warnings (say, about odd EXIF data) are silenced: a decodable image is used.

    The whole image is decoded here. A file whose data stops before the image
    is complete (Pillow's "image file is truncated") raises by default;
    ``truncated="keep"`` decodes it as the official code's loader does (Pillow
    with ``LOAD_TRUNCATED_IMAGES``, set for this decode only): the part the file
    holds, the rest grey. A JPEG whose data stops early but that still ends
    with an end-of-image marker (or whose data was zeroed) decodes with no error
    in libjpeg, its last blocks grey: it is decoded whatever ``truncated`` says.
    ``image.info["truncated"]`` says why an image holds a part its file did
    not: a truncated file kept, or such a JPEG (found for baseline JPEGs and
    progressive ones cut in their first scan, whose last blocks are grey).

    Parameters
    ----------
    data : bytes
    truncated : {"raise", "keep"}

    Returns
    -------
    PIL.Image.Image
        In mode ``"RGB"``.

    Raises
    ------
    OSError, ValueError...
        Whatever PIL raises for bytes it cannot decode.

    Examples
    --------
    >>> import io
    >>> from PIL import Image
    >>> buf = io.BytesIO()
    >>> Image.new("CMYK", (4, 3)).save(buf, "JPEG")
    >>> decode_image(buf.getvalue()).mode
    'RGB'
    >>> buf = io.BytesIO()
    >>> Image.effect_noise((64, 64), 60).convert("RGB").save(buf, "JPEG")
    >>> cut = buf.getvalue()[:900]
    >>> decode_image(cut)
    Traceback (most recent call last):
    OSError: image file is truncated (... bytes not processed)
    >>> decode_image(cut, truncated="keep").info["truncated"]
    'OSError: image file is truncated (... bytes not processed)'
    >>> decode_image(cut + b"\\xff\\xd9").info["truncated"]
    "JPEG data ends before the image's last blocks (decoded grey, as libjpeg does)"
    """
    image, note = decode_checked(data, truncated)
    if note is not None:
        image.info["truncated"] = note
    return image


class ImageDataset(torch.utils.data.Dataset):
    """A torch Dataset of images given by path, tar member or PIL image.

    ``dataset[i]`` returns ``(i, image, None)``, or ``(i, None, reason)`` when
    the image cannot be read or decoded, so that the extraction loop skips
    and lists it instead of crashing (:func:`collate_images`). The image is
    an RGB PIL image, passed through ``transform`` when one is given. An image
    whose file stops early and that is kept comes as ``(i, image, note)``, the
    note saying why (see :func:`decode_image`).

    Tar files are opened lazily in each process (each DataLoader worker opens
    its own) and read at the member's recorded offset, so reads are random
    access.

    Parameters
    ----------
    sources : sequence
        Paths (str or path-like), tar members, Parquet images or PIL images, as
        :func:`make_split` lists them.
    ids : sequence of str, optional
        Image ids, the source's string form by default.
    labels : sequence of str, optional
    transform : callable, optional
        Applied to the RGB PIL image.
    truncated : {"skip", "keep"}
        A file whose data stops early is skipped, or kept as the official code's
        loader keeps it (:func:`decode_image` with ``truncated="keep"``).
        :class:`~imagenet_cog.FeatureExtractor` passes its own setting (``"keep"``).

    Examples
    --------
    >>> from PIL import Image
    >>> ds = ImageDataset([Image.new("L", (5, 4))], ids=["gray"])
    >>> index, image, error = ds[0]
    >>> index, image.mode, image.size, error
    (0, 'RGB', (5, 4), None)
    """

    def __init__(self, sources, ids=None, labels=None, transform=None, truncated="skip"):
        if truncated not in TRUNCATED_POLICIES:
            raise ValueError(f"truncated must be one of {TRUNCATED_POLICIES}, got {truncated!r}")
        self.truncated = truncated
        self.sources = list(sources)
        self.ids = [source_id(s, i) for i, s in enumerate(self.sources)] if ids is None else ids
        self.labels = labels
        if len(self.ids) != len(self.sources):
            raise ValueError(f"{len(self.sources)} sources but {len(self.ids)} ids")
        self.transform = transform
        self._tars = OpenTars()  # each process (each DataLoader worker) opens its own

    def __len__(self):
        return len(self.sources)

    def __del__(self):
        if hasattr(self, "_tars"):
            self._tars.close()

    def with_transform(self, transform, truncated=None):
        """A copy that shares the image lists but applies ``transform`` (and ``truncated``)."""
        return ImageDataset(
            self.sources,
            self.ids,
            self.labels,
            transform=transform,
            truncated=truncated or self.truncated,
        )

    def read_bytes(self, index):
        """The encoded bytes of image ``index`` (raises on I/O errors)."""
        return read_bytes(self.sources[index], self._tars)

    def _load_checked(self, index):
        """``(image, note)`` of image ``index``; the note says why a kept file was not whole."""
        source = self.sources[index]
        if kind(source) == DATASET_ITEM:
            source = source.get()
            if not is_pil(source):
                raise TypeError(f"the dataset gave a {type(source).__name__}, not a PIL image")
        if is_pil(source):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return (source if source.mode == "RGB" else source.convert("RGB")), None
        return decode_checked(self.read_bytes(index), self.truncated)

    def __getitem__(self, index):
        try:
            image, note = self._load_checked(index)
            if self.transform is not None:
                image = self.transform(image)
        except StaleListingError as exc:  # the listing is wrong, not the image: the reader
            return index, None, STALE_LISTING + str(exc)  # stops (a worker cannot raise it whole)
        except Exception as exc:  # noqa: BLE001 - a bad image is reported, never fatal
            return index, None, short_reason(exc)
        return index, image, note


def collate_images(items, notes=False):
    """Collate ``(index, tensor or None, reason)`` items, setting failures aside.

    Parameters
    ----------
    items : list of tuple
    notes : bool
        Also return the notes of the images kept (``reason`` beside a tensor).

    Returns
    -------
    indices : torch.Tensor
        int64 indices of the decoded images.
    batch : torch.Tensor or None
        Their stacked tensors, ``None`` when none decoded.
    failed : list of (int, str)
        ``(index, reason)`` of the others.
    noted : list of (int, str)
        With ``notes``: ``(index, note)`` of the images kept with a note.

    Examples
    --------
    >>> import torch
    >>> idx, batch, failed = collate_images([(0, torch.zeros(3), None), (1, None, "bad")])
    >>> idx.tolist(), tuple(batch.shape), failed
    ([0], (1, 3), [(1, 'bad')])
    """
    import torch

    kept, tensors, failed, noted = [], [], [], []
    for index, tensor, reason in items:
        if tensor is None:
            failed.append((int(index), reason))
        else:
            kept.append(int(index))
            tensors.append(tensor)
            if reason is not None:
                noted.append((int(index), reason))
    batch = torch.stack(tensors) if tensors else None
    out = torch.tensor(kept, dtype=torch.int64), batch, failed
    return (*out, noted) if notes else out
