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
ImageNet-21K), or, for the ImageNet-1K validation set, a flat folder with a
label file. A :class:`Split` is a pure function of the listing of the data
root, the levels, the seed and the cap, and it is written as a text manifest
whose sha256 proves which images a run used.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import tarfile
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

import torch.utils.data

from ._base import IMAGE_SUFFIXES, WNID_RE, data_path
from ._copies import ParquetImage, copy_layout, folder_copy, list_copy, read_parquet_image
from ._fileio import atomic_write_bytes
from ._pillow_decode import TRUNCATED_POLICIES, decode_checked, short_reason
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

#: Largest image, in bytes, that is read (256 MiB): a tar member over it is
#: refused when the tar is listed, a larger file is skipped and listed.
MAX_IMAGE_BYTES = 256 * 2**20

_IN1K = "in1k"
_BLOCK = 512  # tar block size
_READ_CHUNK = 1 << 24  # one pread reads at most this much (Linux stops at 2 GiB anyway)


class TarMember(NamedTuple):
    """Where one image lies inside an uncompressed tar file.

    Attributes
    ----------
    tar : str
        Path of the tar file.
    offset : int
        Byte offset of the member's data in the tar file.
    size : int
        Size of the member's data in bytes.
    """

    tar: str
    offset: int
    size: int


# ------------------------------------------------------------------ listing
def _is_image(name):
    return name.lower().endswith(IMAGE_SUFFIXES)


def _index_tar(path, wnid):
    """``{image id: TarMember}`` from the headers of one tar; nothing is extracted.

    Python's tarfile takes a header cut short (or garbage) for the end of the
    archive, so the end is checked here: the archive must end with a zero
    block and every member's data must lie inside the file.
    """
    images, names = {}, {}
    last = None
    try:
        with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r:") as tar:
            file_size = os.fstat(f.fileno()).st_size
            for member in tar:
                name = member.name
                parts = name.replace("\\", "/").split("/")
                if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or ".." in parts:
                    raise ValueError(
                        f"{path}: refusing tar member {name!r} (absolute path or '..')"
                    )
                last = name
                if member.issparse():
                    if _is_image(name):  # its data is a map of holes, not an image's bytes
                        raise ValueError(f"{path}: refusing GNU sparse tar member {name!r}")
                    continue
                if member.isreg() and member.offset_data + member.size > file_size:
                    raise ValueError(
                        f"{path}: tar member {name!r} runs past the end of the file "
                        f"({member.offset_data + member.size} > {file_size} bytes); the tar "
                        "is cut short, download it again"
                    )
                if not member.isfile() or not _is_image(name):
                    continue
                if member.size > MAX_IMAGE_BYTES:
                    raise ValueError(
                        f"{path}: tar member {name!r} is {member.size} bytes, over the limit of "
                        f"{MAX_IMAGE_BYTES} bytes per image (imagenet_cog.datasets.MAX_IMAGE_BYTES)"
                    )
                parts = [p for p in parts if p not in ("", ".")]
                if len(parts) > 1 and parts[0] == wnid:
                    parts = parts[1:]
                image_id = f"{wnid}/{'/'.join(parts)}"
                if image_id in names:
                    raise ValueError(
                        f"{path}: tar members {names[image_id]!r} and {name!r} both give the "
                        f"image id {image_id!r}; keep one of them"
                    )
                names[image_id] = name
                images[image_id] = TarMember(str(path), member.offset_data, member.size)
            end = tar.offset
            if os.pread(f.fileno(), _BLOCK, end) != bytes(_BLOCK):
                after = f"after member {last!r}" if last is not None else "at its start"
                raise ValueError(
                    f"{path}: no end-of-archive block at byte {end} of {file_size} ({after}): "
                    "the tar is cut short or damaged and images would be lost; download it again"
                )
    except tarfile.TarError as exc:
        raise ValueError(
            f"{wnid}: unreadable tar file {path} ({exc}); only uncompressed tar files can be "
            "read without extracting them"
        ) from None
    return images


def _image_entries(folder, skipped):
    """The entries of ``folder`` named like images that are regular files (links followed).

    The others named like images, a dangling link, a link loop, a FIFO, a folder, are all
    passed over alike and added to ``skipped`` (a list of paths), for one warning.
    """
    with os.scandir(folder) as entries:
        for e in entries:
            if not _is_image(e.name):
                continue
            try:
                regular = e.is_file()
            except OSError:  # a link loop (ELOOP), a link into a folder that cannot be read
                regular = False
            if regular:
                yield e
            else:
                skipped.append(e.path)


def _warn_skipped(skipped):
    if skipped:
        shown = ", ".join(sorted(skipped)[:3]) + (", ..." if len(skipped) > 3 else "")
        warnings.warn(
            f"skipped {len(skipped)} entr{'y' if len(skipped) == 1 else 'ies'} named like an "
            f"image but not {'a readable file' if len(skipped) == 1 else 'readable files'} (a "
            f"dangling or looping link, a FIFO, a folder): {shown}",
            UserWarning,
            stacklevel=3,
        )


def _list_folder(path, wnid, skipped):
    return {f"{wnid}/{e.name}": e.path for e in _image_entries(path, skipped)}


def _check_not_another_concept(wnid, path, seen):
    """Refuse a concept folder (or tar) that is, through links, another concept's: its images
    would be given two labels."""
    real = os.path.realpath(path)
    name = os.path.basename(real)
    name = name.removesuffix(".tar")
    other = seen.get(real) or (name if WNID_RE.match(name) and name != wnid else None)
    if other is not None and other != wnid:
        raise ValueError(
            f"{wnid}: {path} is a link to {real}, the images of concept {other}; the same "
            "images would be given two labels: give each concept its own folder or tar"
        )
    seen[real] = wnid


def list_images(root, wnids, *, progress=False):
    """List the images of some concepts in a folder-per-wnid or tar-per-wnid copy.

    Each concept is read from ``root/<wnid>/`` when that folder exists, else
    from ``root/<wnid>.tar`` (only the tar headers are read, once; nothing is
    extracted). Files ending in ``.JPEG``, ``.jpg`` or ``.png`` (any case)
    count as images; other entries so named (a dangling or looping link, a
    FIFO, a folder) are skipped, with one warning that counts them.

    Parameters
    ----------
    root : path
        The data root.
    wnids : sequence of str
        The concepts to list.
    progress : bool
        Show a progress bar.

    Returns
    -------
    dict
        ``{wnid: {image id: source}}`` where the image id is
        ``"<wnid>/<file name>"`` and the source is a file path (str) or a
        :class:`TarMember`.

    Raises
    ------
    FileNotFoundError
        When concepts have neither a folder nor a tar file; the message names
        them.
    ValueError
        When a concept has no image, or a tar file is unreadable, cut short
        (no end-of-archive block, or a member's data past the end of the
        file), or holds a member whose name is absolute or contains ``..``,
        two members that give the same image id (``x.JPEG`` and
        ``<wnid>/x.JPEG``), a GNU sparse image member, or an image member
        over :data:`MAX_IMAGE_BYTES`. The message names the tar file and the
        member. Also when a concept's folder or tar is a link to another
        concept's (its images would be given two labels).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "n02123159").mkdir()
    >>> _ = (root / "n02123159" / "n02123159_1.JPEG").write_bytes(b"")
    >>> images = list_images(root, ["n02123159"])
    >>> list(images["n02123159"])
    ['n02123159/n02123159_1.JPEG']
    """
    from tqdm.auto import tqdm

    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no data folder at {root}")
    entries = {e.name: e for e in os.scandir(root)}
    missing = [
        w for w in wnids if not (w in entries and entries[w].is_dir()) and f"{w}.tar" not in entries
    ]
    if missing:
        shown = ", ".join(missing[:10]) + (
            f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        )
        raise FileNotFoundError(
            f"{len(missing)} concept(s) missing from {root} (no <wnid>/ folder and no "
            f"<wnid>.tar): {shown}; to extract only the concepts you have, name them with "
            "--wnids FILE (wnids= in Python), which makes a run not comparable with the paper"
        )
    out, skipped, seen = {}, [], {}
    for wnid in tqdm(wnids, desc="listing images", unit="concept", disable=not progress):
        entry = entries.get(wnid)
        if entry is not None and entry.is_dir():
            where = entry.path
            _check_not_another_concept(wnid, where, seen)
            images = _list_folder(where, wnid, skipped)
        else:
            where = entries[f"{wnid}.tar"].path
            _check_not_another_concept(wnid, where, seen)
            if os.path.getsize(where) == 0:
                raise ValueError(f"{wnid}: {where} is an empty file (no images in it)")
            images = _index_tar(where, wnid)
        if not images:
            _warn_skipped(skipped)
            raise ValueError(f"{wnid}: no images in {where} (empty concept)")
        out[wnid] = dict(sorted(images.items()))
    _warn_skipped(skipped)
    return out


def read_val_labels(path=None):
    """Read an ImageNet-1K validation label file.

    Parameters
    ----------
    path : path, optional
        Lines of ``file<TAB>wnid`` (tab, comma or spaces; ``#`` comments and a
        header line are allowed; ``.gz`` is read compressed). Defaults to the
        bundled labels of the 50,000 ILSVRC-2012 validation images.

    Returns
    -------
    dict
        ``{file name: wnid}``.

    Examples
    --------
    >>> labels = read_val_labels()
    >>> len(labels), labels["ILSVRC2012_val_00000001.JPEG"]
    (50000, 'n01751748')
    """
    if path is None:
        raw = data_path("imagenet1k_val_labels.tsv.gz").read_bytes()
        name = "the bundled imagenet1k_val_labels.tsv.gz"
    else:
        raw = Path(path).read_bytes()
        name = str(path)
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    labels = {}
    for n, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.replace(",", " ").split()
        if len(parts) != 2 or not WNID_RE.match(parts[1]):
            if not labels:
                continue  # a header line
            raise ValueError(f"{name}:{n}: expected 'file wnid', got {line!r}")
        labels[os.path.basename(parts[0])] = parts[1]
    if not labels:
        raise ValueError(f"{name}: no 'file wnid' lines")
    return labels


def _list_flat_val(val, wnids, val_labels):
    labels = read_val_labels(val_labels)
    where = val_labels or "the bundled ILSVRC-2012 validation labels"
    wanted = set(wnids)
    out = {w: {} for w in wnids}
    skipped = []
    for e in sorted(_image_entries(val, skipped), key=lambda e: e.name):
        wnid = labels.get(e.name)
        if wnid is None:
            raise ValueError(f"{e.path}: no label for this file in {where}")
        if wnid in wanted:
            out[wnid][f"{wnid}/{e.name}"] = e.path
    _warn_skipped(skipped)
    empty = [w for w in wnids if not out[w]]
    if empty:
        raise ValueError(
            f"{len(empty)} concept(s) have no validation image in {val}: "
            + ", ".join(empty[:10])
            + (f" and {len(empty) - 10} more" if len(empty) > 10 else "")
        )
    return out


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
        Where each image is: a path or a :class:`TarMember`. ``None`` for a
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

    copy = copy_layout(data)  # webdataset shards or Parquet files, else None
    if copy is not None:
        part = "all" if domain != _IN1K else split
        listing, info["copy"] = list_copy(
            data, domain_wnids, part=part, tar_member=TarMember, progress=progress
        )
        missing = [w for w in domain_wnids if w not in listing]
        if missing:
            raise FileNotFoundError(
                f"{len(missing)} concept(s) missing from the {copy} copy at {data}: "
                + ", ".join(missing[:10])
                + (f" and {len(missing) - 10} more" * (len(missing) > 10))
            )
    if domain == _IN1K and copy is not None:
        info["layout"] = f"{copy} ({split})"
        chosen = {w: list(listing[w]) for w in domain_wnids}
    elif domain == _IN1K:
        if split == "train":
            listing = list_images(data / "train", domain_wnids, progress=progress)
            info["layout"] = "train/ folder or tar per wnid"
        else:
            val = data / "val"
            if not val.is_dir():
                raise FileNotFoundError(f"no val/ folder in {data}")
            with os.scandir(val) as entries:
                foldered = any(WNID_RE.match(e.name) and e.is_dir() for e in entries)
            if foldered:
                listing = list_images(val, domain_wnids, progress=progress)
                info["layout"] = "val/ folder per wnid"
            else:
                listing = _list_flat_val(val, domain_wnids, val_labels)
                info["layout"] = "val/ flat with labels"
                info["val_labels"] = str(val_labels) if val_labels else "bundled ILSVRC-2012"
        chosen = {w: list(listing[w]) for w in domain_wnids}
    else:
        if cap is not None and cap < 1:
            raise ValueError(f"cap must be positive or None, got {cap}")
        if n_test < 1:
            raise ValueError(f"n_test must be positive, got {n_test}")
        # Levels read from a file carry no test lists: concepts of the official
        # pool (re-ranked levels, supplement D) still get their official ones.
        official = lv.test_images if lv.test_images is not None else official_test_images()
        if copy is None:
            listing = list_images(data, domain_wnids, progress=progress)
            if (found := folder_copy(listing)) is not None:  # ImageNet-21K-P as folders
                info["copy"] = found
        chosen = {}
        n_official = 0
        for wnid in domain_wnids:
            have = listing[wnid]
            if official_test and wnid in official:
                test = sorted(official[wnid])
                absent = [t for t in test if t not in have]
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
        n_tars = sum(isinstance(next(iter(listing[w].values())), TarMember) for w in domain_wnids)
        info["layout"] = copy or (
            "tar per wnid"
            if n_tars == len(domain_wnids)
            else "folder per wnid"
            if not n_tars
            else "folders and tars"
        )
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
class ItemOf(NamedTuple):
    """Item ``index`` of a foreign map-style dataset (a PIL image or a tuple starting with one).

    An image source of :class:`ImageDataset`, as a path or a :class:`TarMember` is: it lets a
    torchvision-style dataset be extracted like an image folder. :meth:`get` returns the image.

    Examples
    --------
    >>> ItemOf([("image", 0), ("other", 1)], 1).get()
    'other'
    """

    dataset: object
    index: int

    def get(self):
        """The image: the item itself, or the first element of a tuple item."""
        item = self.dataset[self.index]
        return item[0] if isinstance(item, (tuple, list)) else item


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
        Paths (str or path-like), :class:`TarMember` or PIL images.
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

    _MAX_OPEN = 64  # tar files kept open per process

    def __init__(self, sources, ids=None, labels=None, transform=None, truncated="skip"):
        if truncated not in TRUNCATED_POLICIES:
            raise ValueError(f"truncated must be one of {TRUNCATED_POLICIES}, got {truncated!r}")
        self.truncated = truncated
        self.sources = list(sources)
        self.ids = [_source_id(s, i) for i, s in enumerate(self.sources)] if ids is None else ids
        self.labels = labels
        if len(self.ids) != len(self.sources):
            raise ValueError(f"{len(self.sources)} sources but {len(self.ids)} ids")
        self.transform = transform
        self._files = OrderedDict()
        self._pid = None

    def __len__(self):
        return len(self.sources)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_files"] = OrderedDict()
        state["_pid"] = None
        return state

    def __del__(self):
        if os.getpid() == getattr(self, "_pid", None):
            for f in self._files.values():
                f.close()

    def with_transform(self, transform, truncated=None):
        """A copy that shares the image lists but applies ``transform`` (and ``truncated``)."""
        return ImageDataset(
            self.sources,
            self.ids,
            self.labels,
            transform=transform,
            truncated=truncated or self.truncated,
        )

    def _tar_file(self, path):
        if self._pid != os.getpid():  # a forked worker: never share parent handles
            self._files = OrderedDict()
            self._pid = os.getpid()
        f = self._files.pop(path, None)
        if f is None:
            f = open(path, "rb")  # noqa: SIM115 - kept open across reads, closed on eviction
            while len(self._files) >= self._MAX_OPEN:
                self._files.popitem(last=False)[1].close()
        self._files[path] = f
        return f

    def read_bytes(self, index):
        """The encoded bytes of image ``index`` (raises on I/O errors)."""
        source = self.sources[index]
        if isinstance(source, ParquetImage):
            return read_parquet_image(source)
        if isinstance(source, TarMember):
            _check_size(source.size)
            return _read_at(self._tar_file(source.tar), source.offset, source.size)
        with open(source, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            _check_size(size)
            return _read_at(f, 0, size)

    def _load_checked(self, index):
        """``(image, note)`` of image ``index``; the note says why a kept file was not whole."""
        source = self.sources[index]
        if isinstance(source, ItemOf):
            source = source.get()
            if not _is_pil(source):
                raise TypeError(f"the dataset gave a {type(source).__name__}, not a PIL image")
        if _is_pil(source):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return (source if source.mode == "RGB" else source.convert("RGB")), None
        return decode_checked(self.read_bytes(index), self.truncated)

    def __getitem__(self, index):
        try:
            image, note = self._load_checked(index)
            if self.transform is not None:
                image = self.transform(image)
        except Exception as exc:  # noqa: BLE001 - a bad image is reported, never fatal
            return index, None, short_reason(exc)
        return index, image, note


def _check_size(size):
    if size > MAX_IMAGE_BYTES:
        raise ValueError(f"{size} bytes, over the limit of {MAX_IMAGE_BYTES} bytes per image")


def _read_at(f, offset, size):
    """``size`` bytes at ``offset``, read in bounded chunks (one pread stops short of 2 GiB)."""
    parts, done = [], 0
    while done < size:
        n = min(_READ_CHUNK, size - done)
        if hasattr(os, "pread"):
            chunk = os.pread(f.fileno(), n, offset + done)
        else:  # pragma: no cover - Windows
            f.seek(offset + done)
            chunk = f.read(n)
        if not chunk:
            raise OSError(f"data cut short: {done} of {size} bytes")
        parts.append(chunk)
        done += len(chunk)
    return b"".join(parts)


def _is_pil(obj):
    return type(obj).__module__.startswith("PIL.") and hasattr(obj, "convert")


def _source_id(source, i):
    if isinstance(source, ItemOf):
        return str(source.index)
    if isinstance(source, TarMember):
        return f"{source.tar}@{source.offset}"
    if isinstance(source, ParquetImage):
        return f"{source.path}@{source.row_group}:{source.row}"
    if _is_pil(source):
        return f"<image {i}>"
    return str(source)


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
