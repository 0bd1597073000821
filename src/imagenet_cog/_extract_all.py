"""The extraction entry points: one store (:func:`extract`), every store the protocol needs
(:func:`extract_all`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from ._data.listing import read_in_one_pass
from ._distributed import Part, Ranks, lock_problem, process_group
from ._fileio import loads_json
from ._onepass import remove_leftovers
from .datasets import N_TEST, SPLIT_SEED, TRAIN_CAP, make_split
from .levels import load_levels, official_test_images
from .store import DEFAULT_SHARD_SIZE, build_store, build_stores, open_store, store_path
from .taxonomy import imagenet1k_wnids

__all__ = ["extract", "extract_all", "store_parts"]

_IN1K = "in1k"
_SPLITS = ("train", "test")


def _domain_wnids(domains, levels, wnids):
    """``{domain: sorted wnids}``, restricted to ``wnids`` when given."""
    out = {}
    for domain in domains:
        if domain == _IN1K:
            every = list(imagenet1k_wnids())
        else:
            if domain not in levels.names:
                raise ValueError(f"unknown domain {domain!r}; use 'in1k' or one of {levels.names}")
            every = levels[domain]
        if wnids is None:
            out[domain] = sorted(every)
        elif isinstance(wnids, Mapping):
            out[domain] = sorted(wnids[domain]) if domain in wnids else sorted(every)
        else:
            mine = sorted(set(wnids) & set(every))
            if not mine:
                raise ValueError(
                    f"none of the wnids given is a concept of {domain}: name the domains they "
                    "belong to with --domain (domains= in Python)"
                )
            out[domain] = mine
    return out


#: Key fields that only some settings add: a store that has one was made otherwise.
_OPTIONAL_FIELDS = ("decoder", "resize", "tf32", "truncated_images", "loader")


def _finished(path, fingerprint, domain, split, expect, any_of=()):
    """True when ``path`` holds a complete store made for this very request.

    Decided from the manifest and the split file alone, without listing the
    data root, so that a rerun skips finished splits at once. Anything
    unexpected answers False, and the full path (listing, then
    ``build_store``'s own checks) decides. The fields in ``any_of`` (``decoder``
    and ``resize`` when they are ``"auto"``) may hold any value: a store made
    with either decoder (resize) is reused.
    """
    try:
        manifest = loads_json((path / "manifest.json").read_text(encoding="utf-8"))
        key, info = manifest["key"], manifest["split"]
        if key.get("domain") != domain or key.get("split") != split:
            return False
        fingerprint = {k: v for k, v in fingerprint.items() if k not in any_of}
        if any(key.get(k) != v for k, v in fingerprint.items()) or any(
            key.get(k) != fingerprint.get(k) for k in _OPTIONAL_FIELDS if k not in any_of
        ):
            return False
        if any(info.get(k) != v for k, v in expect["info"].items()):
            return False
        lines = (path / info["file"]).read_text(encoding="utf-8").splitlines()[1:]
        if {line.rsplit("\t", 1)[-1] for line in lines} != expect["wnids"]:
            return False
        open_store(path, verify="size")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


def _resolve(data, levels, domains, splits, wnids):
    """``(data, levels, domains, concepts)`` of an :func:`extract_all` call, checked: the roots
    as paths, the levels loaded (``None`` when no level is asked for), the domains in order,
    and ``{domain: sorted wnids}``."""
    if not isinstance(data, Mapping):
        raise TypeError(
            "data must be a mapping {'in1k': ImageNet-1K root, 'in21k': ImageNet-21K root}; "
            "for one domain and split, use extract()"
        )
    unknown = set(data) - {_IN1K, "in21k"}
    if unknown:
        raise ValueError(f"data keys must be 'in1k' and 'in21k', got {sorted(unknown)}")
    data = {k: Path(v) for k, v in data.items() if v is not None}
    bad = [s for s in splits if s not in _SPLITS]
    if bad or not splits:
        raise ValueError(f"splits must be among {_SPLITS}, got {list(splits)}")
    lv = load_levels(levels) if "in21k" in data or (domains and set(domains) - {_IN1K}) else None
    if domains is None:
        domains = ([_IN1K] if _IN1K in data else []) + (list(lv.names) if lv else [])
        if not domains:
            raise ValueError("data has neither 'in1k' nor 'in21k'")
    domains = list(dict.fromkeys(domains))
    for domain in domains:
        need = _IN1K if domain == _IN1K else "in21k"
        if need not in data:
            raise ValueError(f"domain {domain} needs data[{need!r}], the root of its images")
    return data, lv, domains, _domain_wnids(domains, lv, wnids)


def _share_stores(domains, splits, concepts, cap, n_test, count):
    """``{(domain, split): part}``: the stores dealt out to ``count`` parts (from 1), the
    largest first, each to the part with the fewest images so far (the lowest on a tie).

    The images of a store are estimated before any listing, from its concepts: ``cap`` train
    images each, ``n_test`` test images (ImageNet-1K's val/: 50), so that every part, whatever
    it has done, deals them out alike.
    """
    stores = [(d, s) for d in domains for s in splits]

    def images(store):
        domain, split = store
        per = cap if split == "train" else (50 if domain == _IN1K else n_test)
        return len(concepts[domain]) * per

    load, owner = [0] * count, {}
    for store in sorted(stores, key=lambda st: (-images(st), stores.index(st))):
        number = min(range(count), key=lambda k: (load[k], k))
        owner[store] = number + 1
        load[number] += images(store)
    return {store: owner[store] for store in stores}


def store_parts(
    data,
    levels="official",
    *,
    domains=None,
    splits=_SPLITS,
    wnids=None,
    cap=TRAIN_CAP,
    n_test=N_TEST,
    count=1,
):
    """``{(domain, split): part}``: which of ``count`` parts (numbered from 1) extracts each
    store of :func:`extract_all` with ``part="i/count"`` (same arguments)."""
    data, _lv, domains, concepts = _resolve(data, levels, domains, splits, wnids)
    return _share_stores(domains, splits, concepts, cap, n_test, count)


def extract_all(
    model,
    data,
    out,
    levels="official",
    *,
    domains=None,
    splits=_SPLITS,
    seed=SPLIT_SEED,
    cap=TRAIN_CAP,
    n_test=N_TEST,
    wnids=None,
    official_test=True,
    val_labels=None,
    shard_size=DEFAULT_SHARD_SIZE,
    overwrite=False,
    progress=True,
    part=None,
    **params,
):
    """Extract every store the protocol needs, with one network and one progress bar.

    By default the train and test splits of ImageNet-1K and of the levels
    L1..L5: twelve stores ``out/<domain>/<split>``, each as
    :func:`imagenet_cog.extract` makes it. The network is loaded once. A
    finished store made with the same settings is recognised from its
    manifest and skipped without listing the data again; an unfinished one
    is resumed; one made with other settings raises
    :class:`~imagenet_cog.StoreMismatchError` (or is rebuilt with
    ``overwrite=True``). The splits still to do are listed first, then one
    bar counts all their images. The stores whose images lie in one
    webdataset or Parquet copy are built in one pass over its data files:
    each file is read once, in order, for all of them, and a killed pass
    resumes at the data files not yet done. Under ``torchrun`` the processes
    share out those data files; the stores of folders and tars per wnid are
    built one after the other, their shards shared among the processes, as
    with :func:`imagenet_cog.extract`.

    Parameters
    ----------
    model : str, torch.nn.Module or FeatureExtractor
        See :func:`imagenet_cog.extract`.
    data : mapping
        ``{"in1k": ImageNet-1K root (train/ and val/), "in21k": ImageNet-21K
        root}``; either may be left out, and the domains that need it with it.
    out : path
        The store ROOT.
    levels : "official", path or Levels
    domains : sequence of str, optional
        Default: ``"in1k"`` when ``data`` has it, and every level of
        ``levels`` when ``data`` has ``"in21k"``.
    splits : sequence of {"train", "test"}
    seed, cap, n_test, official_test, val_labels
        See :func:`imagenet_cog.make_split`.
    wnids : sequence of str or mapping, optional
        Only these concepts (a quick check): a flat list is shared out among
        the domains (each domain needs at least one), a mapping
        ``{domain: wnids}`` gives them per domain.
    shard_size : int
    overwrite : bool
    progress : bool
    part : str, optional
        ``"i/n"``: extract part ``i`` of ``n`` (numbered from 1) of the stores, in a job of
        its own, into ``out`` beside the other parts (a SLURM job array). The stores are dealt
        out by their estimated images, the largest first, the same way in every part; the
        finished root is the one a single run makes. ``out`` must be on a filesystem whose
        file locks every machine sees.
    **params
        :class:`FeatureExtractor` parameters.

    Returns
    -------
    pathlib.Path
        ``out``, the store ROOT, ready for :func:`imagenet_cog.evaluate` (with ``part``, once
        every part has finished).

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from PIL import Image
    >>> from imagenet_cog import Levels, extract_all
    >>> from imagenet_cog import list_domains
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> for w in ("n00000001", "n00000002"):
    ...     (root / "in21k" / w).mkdir(parents=True)
    ...     for i in range(3):
    ...         Image.new("RGB", (20, 20), (70 * i, 9, 9)).save(root / "in21k" / w / f"{i}.JPEG")
    >>> levels = Levels([["n00000001"], ["n00000002"]])
    >>> out = extract_all("torchvision:resnet18:none", {"in21k": root / "in21k"}, root / "features",
    ...                   levels, n_test=1, preprocessing={"size": 16}, progress=False)
    >>> list_domains(out)
    ['L1', 'L2']
    """
    from tqdm.auto import tqdm

    data, lv, domains, concepts = _resolve(data, levels, domains, splits, wnids)
    if lv is not None:
        official = lv.test_images if lv.test_images is not None else official_test_images()
        level_name = lv.provenance.get("name", str(levels))
    mine = None  # with part: the stores this part extracts
    if part is not None:
        part = part if isinstance(part, Part) else Part.parse(part)
        problem = lock_problem(out)
        if problem:
            raise ValueError(f"--part {part}: {problem}")
        owner = _share_stores(domains, splits, concepts, cap, n_test, part.count)
        mine = {store for store, number in owner.items() if number == part.number}

    extractor = _extractor(model, params)
    extractor.fingerprint()  # the network, loaded once, before any listing

    with process_group(extractor, progress, folder=out) as (extractor, show):
        fingerprint = json.loads(json.dumps(extractor.fingerprint(), sort_keys=True))
        first_rank = Ranks.current().rank == 0
        todo = []
        for domain in domains:
            root = data[_IN1K if domain == _IN1K else "in21k"]
            info = {"data_root": str(root.resolve()), "n_concepts": len(concepts[domain])}
            if domain != _IN1K:
                n_official = sum(w in official for w in concepts[domain]) if official_test else 0
                info.update(
                    {
                        "levels": level_name,
                        "seed": seed,
                        "cap": cap,
                        "n_test": n_test,
                        "official_test_lists": n_official,
                    }
                )
            expect = {"info": info, "wnids": set(concepts[domain])}
            for split in splits:
                if mine is not None and (domain, split) not in mine:
                    continue  # another part's
                path = store_path(out, domain, split)
                auto = [k for k in ("decoder", "resize") if getattr(extractor, k) == "auto"]
                if overwrite or not _finished(path, fingerprint, domain, split, expect, auto):
                    todo.append((domain, split, root, path))
                elif first_rank:  # skipped: what a run killed once it was finished left goes
                    remove_leftovers(path)
        # Nothing to do (every store finished): no bars, which would only show 0 of 0.
        show = show and bool(todo)
        chosen = []
        for domain, split, root, _path in tqdm(
            todo, desc="listing images", unit="split", disable=not show
        ):
            chosen.append(
                make_split(
                    root,
                    domain,
                    split,
                    levels,
                    seed=seed,
                    cap=cap,
                    n_test=n_test,
                    wnids=None if wnids is None else concepts[domain],
                    official_test=official_test,
                    val_labels=val_labels,
                )
            )
        total = sum(len(s) for s in chosen)
        # The stores of one shard copy are built in one pass over its data files (each read
        # once, in order); folders and tars per wnid, store after store.
        by_root = {}
        for pos, (_, _, root, _) in enumerate(todo):
            by_root.setdefault(root, []).append(pos)
        kwargs = {"shard_size": shard_size, "overwrite": overwrite}
        with tqdm(
            total=total, desc="features", unit="img", disable=not show, smoothing=0.05
        ) as bar:
            for root, positions in by_root.items():
                if len(positions) > 1 and read_in_one_pass(chosen[positions[0]].info):
                    bar.set_description(f"features {root.name} (one pass)")
                    start = bar.n
                    jobs = [(todo[p][3], chosen[p]) for p in positions]
                    build_stores(jobs, extractor, progress=bar if show else False, **kwargs)
                    bar.update(start + sum(len(s) for _, s in jobs) - bar.n)
                    continue
                for p in positions:
                    domain, split, _, path = todo[p]
                    bar.set_description(f"features {domain}/{split}")
                    start = bar.n
                    build_store(
                        path, extractor, chosen[p], progress=bar if show else False, **kwargs
                    )
                    bar.update(start + len(chosen[p]) - bar.n)  # shards done by an earlier run
    return Path(out)


def extract(
    model,
    data,
    domain,
    split,
    out,
    levels="official",
    *,
    seed=SPLIT_SEED,
    cap=TRAIN_CAP,
    n_test=N_TEST,
    wnids=None,
    official_test=True,
    val_labels=None,
    shard_size=DEFAULT_SHARD_SIZE,
    overwrite=False,
    progress=True,
    **params,
):
    """Extract the features of one split of one domain into ``out/<domain>/<split>``.

    Lists the images (:func:`imagenet_cog.make_split`), then runs
    ``store.build_store``. An existing store with the same key is reused; an
    unfinished one is resumed. Under ``torchrun`` with several processes it
    initializes ``torch.distributed`` (NCCL on CUDA, Gloo on the CPU), each
    process computes its share of the shards on its own GPU, and the group
    is closed at the end.

    Parameters
    ----------
    model : str, torch.nn.Module or FeatureExtractor
        A model spec (see :class:`FeatureExtractor`), a module, or an
        extractor whose parameters are used (``params`` override them).
    data : path
        The ImageNet-21K root for the levels, the ImageNet-1K root (with
        ``train/`` and ``val/``) for ``"in1k"``.
    domain : str
        ``"in1k"`` or a level name (``"L1"`` to ``"L5"``).
    split : {"train", "test"}
    out : path
        The store ROOT.
    levels : "official", path or Levels
    seed, cap, n_test, wnids, official_test, val_labels
        See :func:`imagenet_cog.make_split`.
    shard_size : int
        Images per shard.
    overwrite : bool
        Rebuild a store made with other settings.
    progress : bool
        Show progress bars (on rank 0 only).
    **params
        :class:`FeatureExtractor` parameters: ``preprocessing``, ``layer``,
        ``normalize``, ``batch_size``, ``num_workers``, ``device``, ``amp``,
        ``channels_last``, ``decoder``, ``resize``, ``tf32``, ``truncated_images``.

    Returns
    -------
    pathlib.Path
        The store folder ``out/<domain>/<split>``.

    Examples
    --------
    >>> extract("torchvision:resnet50:IMAGENET1K_V1", "/data/imagenet21k", "L1", "test",
    ...         "features/resnet50")  # doctest: +SKIP
    PosixPath('features/resnet50/L1/test')
    """
    path = store_path(out, domain, split)
    extractor = _extractor(model, params)
    with process_group(extractor, progress, folder=out) as (extractor, show):
        chosen = make_split(
            data,
            domain,
            split,
            levels,
            seed=seed,
            cap=cap,
            n_test=n_test,
            wnids=wnids,
            official_test=official_test,
            val_labels=val_labels,
            progress=show,
        )
        return build_store(
            path, extractor, chosen, shard_size=shard_size, overwrite=overwrite, progress=show
        )


def _extractor(model, params):
    """The extractor of ``model``: the caller's own (with its loaded network) unless ``params``
    change it, or a new one."""
    from sklearn.base import clone

    from .features import FeatureExtractor

    if isinstance(model, FeatureExtractor):
        return clone(model).set_params(**params) if params else model
    return FeatureExtractor(model, **params)
