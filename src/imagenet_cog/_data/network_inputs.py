"""From a dataset's images to the network's input on the device, batch by batch.

The two ways of :class:`imagenet_cog.FeatureExtractor` (its ``decoder``), behind one
iterator:

* ``"pil"``, the worker path (``worker_images``): the DataLoader workers decode (JPEGs with
  ``decode_jpeg``, the rest with Pillow), resize (Pillow's resize, or torch's with
  ``resize="torch"``) and crop; uint8 batches travel, and are scaled and normalized on the
  device;
* ``"torchvision"``, the tensor path (``tensor_decode``): the workers walk the JPEGs and
  decode only what the device does not; the device decodes the batch's baseline JPEGs and
  resizes them together, exactly as Pillow does.

Either way the batches are made ready one step ahead of the network (``device_feed``).
"""

from __future__ import annotations

import functools

import torch

from .device_feed import DeviceFeed
from .worker_images import WorkerImages, WorkerSteps, jpeg_decoder_agrees, scale_and_normalize

__all__ = ["NetworkInputs"]


class NetworkInputs:
    """The network's inputs from ``dataset``, one batch at a time.

    Parameters
    ----------
    dataset : ImageDataset
    preprocessing : dict
        The extractor's resolved preprocessing.
    decoder : {"pil", "torchvision"}
    resize : {"pil", "torch"}
    truncated : {"keep", "skip"}
    device : torch.device
    workers : int
    reference_transform : callable
        The Pillow path's transform (PIL image to float tensor), for the tensor path's check.

    Attributes
    ----------
    jpeg_check : dict or None
        After :meth:`check_jpeg_decoder`: the JPEGs compared, the largest difference of
        ``decode_jpeg``'s pixels from Pillow's, and which of the two the workers use.
    decoder : TensorDecoder or None
        The tensor path's decoder (its ``check`` and ``warning``).
    """

    def __init__(
        self,
        dataset,
        preprocessing,
        *,
        decoder,
        resize,
        truncated,
        device,
        workers,
        reference_transform,
    ):
        self.p = preprocessing
        self.device = torch.device(device)
        self.workers = int(workers)
        self.tensor_path = decoder == "torchvision"
        # The tensor path resizes exactly; so do its workers, for what they decode.
        steps = WorkerSteps(preprocessing, "pil" if self.tensor_path else resize, True)
        self.images = WorkerImages(
            dataset.with_transform(steps.from_pil, truncated=truncated), steps
        )
        self.reference = dataset.with_transform(reference_transform, truncated=truncated)
        self.jpeg_check = None
        self.decoder = None
        self.mean = self.std = None
        if preprocessing["mean"] is not None:
            self.mean = torch.tensor(preprocessing["mean"]).view(1, 3, 1, 1).to(self.device)
            self.std = torch.tensor(preprocessing["std"]).view(1, 3, 1, 1).to(self.device)

    def check_jpeg_decoder(self):
        """Compare ``decode_jpeg`` with Pillow on the package's reference JPEGs; the workers
        decode JPEGs with Pillow when they differ. Returns :attr:`jpeg_check`."""
        found = jpeg_decoder_agrees()
        agree = found["max_abs_diff"] == 0
        self.images.steps.decode_jpegs = agree
        self.jpeg_check = {
            **found,
            "workers_decode_jpegs_with": "torchvision.io" if agree else "Pillow",
        }
        return self.jpeg_check

    def _ready(self, batch):
        """A worker path batch on the device: ``(indices, x, failed, fallbacks, notes)``."""
        indices, pixels, failed, notes = batch
        x = None
        if pixels is not None:
            x = scale_and_normalize(pixels.to(self.device, non_blocking=True), self.mean, self.std)
        return indices, x, failed, [], notes

    def _loader(self, batches, by_file):
        from ..datasets import collate_images
        from .file_split import WorkerBatches, split_runs
        from .sources import data_file
        from .tensor_decode import EncodedImages, collate_encoded

        if self.tensor_path:
            source, collate = EncodedImages(self.images), collate_encoded
        else:
            source, collate = self.images, functools.partial(collate_images, notes=True)
        pin = self.device.type == "cuda"
        sources = self.images.pil.sources
        if by_file and any(data_file(sources[b[0]]) for b in batches if len(b)):
            runs = split_runs([list(b) for b in batches], sources, max(self.workers, 1))
            return WorkerBatches(source, runs, collate).loader(pin_memory=pin)
        return torch.utils.data.DataLoader(
            source,
            batch_sampler=[list(b) for b in batches],
            num_workers=self.workers,
            collate_fn=collate,
            pin_memory=pin,
            prefetch_factor=4 if self.workers else None,
        )

    def batches(self, batches, *, by_file=False, background=None):
        """``(indices, x or None, failed, fallbacks, notes)`` of each batch (see
        :meth:`imagenet_cog.FeatureExtractor.iter_batches`), ``x`` on the device."""
        from .tensor_decode import TensorDecoder

        prepare = self._ready
        if self.tensor_path:
            self.decoder = prepare = TensorDecoder(self.images, self.reference, self.p, self.device)
        loader = self._loader(batches, by_file)
        return DeviceFeed(loader, prepare, self.device, background=background)
