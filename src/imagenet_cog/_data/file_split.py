"""DataLoader workers that split data files, not batches.

A DataLoader given a list of batches hands them to its workers in turn: batch 0 to worker 0,
batch 1 to worker 1... On a copy kept in large data files (webdataset shards, Parquet files,
tars per wnid) every worker then reads a little of every file: each file is opened by every
worker, and a Parquet row group, the unit Parquet compresses, is read and decompressed by
every worker that needs one of its images. Here the batches, in the order their images lie on
disk, are cut into one contiguous run per worker, balanced by images and cut where a data
file ends when one is near: each worker reads its own files, forward. Only a batch that
straddles two runs reads from both.

The batches come back in the workers' turn (a batch of each worker, and so on), not in the
order given: the callers put features back by index.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch.utils.data

from .sources import data_file, planned_parquet_reads

__all__ = ["WorkerBatches", "split_runs"]


def split_runs(batches, sources, parts):
    """Cut ``batches`` into ``parts`` contiguous runs of about as many images each.

    A cut is moved, by at most a tenth of a run, to the batch boundary nearest to where a
    data file ends: a data file is then read by one worker, but for the images of at most
    one batch that straddles two runs.

    Returns
    -------
    list of list
        The batches of each run, in their given order; a run may be empty.
    """
    batches = [list(b) for b in batches]
    sizes = np.array([len(b) for b in batches], dtype=np.int64)
    ends = np.cumsum(sizes)
    total = int(ends[-1]) if len(ends) else 0
    # Where data files end, as image positions: between two batches, or inside a batch
    # that straddles them (only those batches are scanned, not every image).
    file_ends, previous = [], None
    for b, batch in enumerate(batches):
        start = int(ends[b] - sizes[b])
        if not batch:
            continue
        first, last = data_file(sources[batch[0]]), data_file(sources[batch[-1]])
        if previous is not None and first != previous:
            file_ends.append(start)
        if first != last:
            files = [data_file(sources[i]) for i in batch]
            file_ends += [start + k for k in range(1, len(batch)) if files[k] != files[k - 1]]
        previous = last
    file_ends = np.array(file_ends, dtype=np.int64)
    cuts, slack = [0], max(1, total // parts // 10)
    for p in range(1, parts):
        target = total * p // parts
        best = int(np.searchsorted(ends, target))  # the batch that holds image `target`
        near = np.flatnonzero(np.abs(ends[:-1] - target) <= slack)
        if len(near) and len(file_ends):
            at = np.searchsorted(file_ends, ends[near])
            left = np.abs(ends[near] - file_ends[np.maximum(at - 1, 0)])
            right = np.abs(file_ends[np.minimum(at, len(file_ends) - 1)] - ends[near])
            off_file = np.minimum(left, right)
            # The boundary nearest to a file end, then to the even cut.
            best = int(near[np.lexsort((np.abs(ends[near] - target), off_file))[0]])
        cuts.append(max(cuts[-1], min(best + 1, len(batches))))
    cuts.append(len(batches))
    return [batches[a:b] for a, b in itertools.pairwise(cuts)]


def _identity(batch):
    return batch


class WorkerBatches(torch.utils.data.IterableDataset):
    """Each DataLoader worker collates the batches of its own run (:func:`split_runs`).

    Parameters
    ----------
    source : map-style dataset
        Gives ``source[i]`` for every index of the batches.
    runs : list of list of sequence of int
        One run of batches per worker.
    collate : callable
        Makes a batch of the items ``[source[i] for i in batch]``.
    """

    def __init__(self, source, runs, collate):
        self.source = source
        self.runs = runs
        self.collate = collate

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        run = self.runs[0 if info is None else info.id]
        sources = getattr(getattr(self.source, "pil", self.source), "sources", None)
        wanted = [sources[i] for b in run for i in b] if sources is not None else []
        # The worker knows every image it will read: a Parquet row group is kept until its
        # last image is read, then dropped, so that it is read once.
        with planned_parquet_reads(wanted):
            for batch in run:
                yield self.collate([self.source[i] for i in batch])

    def loader(self, **kwargs):
        """A DataLoader with one worker per run; one run is read in this process."""
        workers = len(self.runs) if len(self.runs) > 1 else 0
        return torch.utils.data.DataLoader(
            self,
            batch_size=None,
            num_workers=workers,
            collate_fn=_identity,
            prefetch_factor=4 if workers else None,
            **kwargs,
        )
