"""Frozen-backbone features: the estimator that turns images into vectors.

Fifth stage of the pipeline (… → datasets → **features** → probe). The paper, Sec. 3.4.1 and supplement B.1:
the backbone runs in eval mode with no augmentation; each image is resized
so that its shorter side is S pixels (bicubic), center-cropped to S×S,
scaled to [0, 1] and normalized; the features are the input of the
classifier (the penultimate layer), l2-normalized.

The network comes from a model spec (``_models``: torchvision, timm, OpenCLIP,
Hugging Face, torch.hub) or is the user's own module; the paper's presets live in
``_models.presets``. torch and the model libraries are imported only when a network is loaded.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import warnings
from contextlib import nullcontext

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin

from ._features.settings import (
    DECODERS,
    RESIZES,
    decoder_name,
    default_workers,
    network_precision,
    resize_name,
)
from ._models.classifier_input import NoClassifierError, find_feature_layer
from ._models.presets import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    MODEL_ZOO,
    NORMALIZATION,
    module_preprocessing,
    paper_preset,
)
from ._models.registry import (
    LoadedModel,
    load_source_model,
)
from ._models.spec import spec_by_content
from ._models.untrained import (  # noqa: F401 - the thresholds stay importable from here
    CHECKED_FEATURES,
    NEAR_IDENTICAL_COSINE,
    FeatureCheck,
    normalization_at_init,
    untrained_reasons,
    weights_at_init,
)
from ._models.weights import check_head_unused, recorded_reads, weights_file_record
from ._provenance import RANDOM_WEIGHTS, differs_from_preset, weights_of

_LOG = logging.getLogger("imagenet_cog")

# Public names are exported by the package (imagenet_cog.__all__), not here.
__all__: list[str] = []

_DEFAULT_PREPROCESSING = {
    "resize": 224,
    "crop": 224,
    "interpolation": "bicubic",
    "mean": list(IMAGENET_MEAN),
    "std": list(IMAGENET_STD),
}
_INTERPOLATIONS = ("bicubic", "bilinear", "nearest")
_TRUNCATED = ("keep", "skip")


def weights_sha256(module):
    """A deterministic sha256 of a network's state dict.

    Every tensor is hashed with its name, dtype and shape, in sorted key
    order, from its CPU bytes.

    Parameters
    ----------
    module : torch.nn.Module

    Returns
    -------
    str
        Hex digest.

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Linear(2, 1)
    >>> _ = torch.nn.init.zeros_(net.weight), torch.nn.init.zeros_(net.bias)
    >>> weights_sha256(net)[:16]
    '2afbeb9ca7b5195c'
    """
    import torch

    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        if not isinstance(tensor, torch.Tensor):
            continue
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}\t{t.dtype}\t{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ------------------------------------------------------------------- layers
def _default_layer(module):
    """The layer of :func:`find_feature_layer`, or ``None`` where it finds none."""
    try:
        return find_feature_layer(module).layer
    except NoClassifierError:
        return None


class _Captured(Exception):
    """Raised by a hook once the wanted activation is in hand: skips the rest."""


def _forward_layer(module, x, layer):
    if layer == "output" or layer.startswith("feature:"):  # a source's feature: its output
        out = module(x)
    else:
        kind, _, name = layer.partition(":")
        target = module.get_submodule(name)
        box = []

        def pre_hook(_module, args):
            box.append(args[0])
            raise _Captured

        def hook(_module, _args, output):
            box.append(output)
            raise _Captured

        if kind == "input":
            handle = target.register_forward_pre_hook(pre_hook)
        else:
            handle = target.register_forward_hook(hook)
        try:
            module(x)
        except _Captured:
            pass
        finally:
            handle.remove()
        if not box:
            raise RuntimeError(f"the forward pass never ran layer {name!r}")
        out = box[0]
    if isinstance(out, (tuple, list)):
        out = out[0]
    if not hasattr(out, "flatten"):
        raise TypeError(f"layer {layer!r} gave a {type(out).__name__}, not a tensor")
    return out.flatten(1)


# -------------------------------------------------------------- estimator
class FeatureExtractor(TransformerMixin, BaseEstimator):
    """Features of images from a frozen network, following the paper, Sec. 3.4.1 and supplement B.1.

    Each image is decoded to RGB, resized so that its shorter side is ``S``
    (bicubic), center-cropped to ``S×S``, scaled to [0, 1] and normalized.
    The network runs in eval mode under ``torch.inference_mode``; the
    features are the input of its classifier, flattened, and l2-normalized.

    ``fit`` does nothing, so the extractor can sit in a ``Pipeline`` before a
    probe. The network is loaded on first use and dropped from pickles.

    Parameters
    ----------
    model : str or torch.nn.Module
        A spec such as ``"torchvision:resnet50"`` (random weights),
        ``"torchvision:resnet50:IMAGENET1K_V1"``,
        ``"torchvision:resnet50:/path/to/checkpoint.pth"``,
        ``"timm:deit_small_patch16_224:pretrained"``,
        ``"open_clip:ViT-B-16:openai"``, ``"hf:facebook/dinov2-small"`` or
        ``"torchhub:/path/to/dinov2:dinov2_vits14"`` (see :func:`load_model`),
        or a module (put in eval mode and moved to ``device``).
    preprocessing : None, str or dict
        ``None``: the preset of the architecture in :data:`MODEL_ZOO` for the
        paper's models; for other timm, OpenCLIP and Hugging Face models the
        preprocessing their library prescribes (timm's data config, OpenCLIP's
        ``preprocess_cfg``, the image processor's settings); else 224 px,
        bicubic, and the ImageNet mean/std. A :data:`MODEL_ZOO` key
        (``"clip"``, ``"simclr_v2"``, ``"inception_v3"``...). Or a dict with
        any of ``resize`` (the shorter side, or ``[height, width]`` to resize
        both sides, ignoring the aspect ratio), ``crop``, ``size`` (both),
        ``interpolation`` (``"bicubic"``, ``"bilinear"``, ``"nearest"``),
        ``mean`` and ``std`` (``None``: no normalization), the rest from the
        defaults.
    layer : str, optional
        ``None``: the input of the classifier, whether the network comes as a
        spec or as a module: for timm, OpenCLIP and Hugging Face networks the
        layer their library's contract names (``feature:...``, see
        :doc:`/model_zoo`); otherwise the input of the last ``nn.Linear`` of
        the network's ``fc``, ``classifier``, ``head`` or ``heads`` (at its top,
        else nested), or of its last child when that is an ``nn.Linear``. A
        network with none of them is refused (``ValueError``): name its layer.
        ``"output"``: the network's output. A module name such as
        ``"avgpool"`` or ``"layer4"``: that module's output (``"input:NAME"``
        for its input). The forward pass stops there.
    normalize : bool
        l2-normalize each feature vector.
    batch_size : int
        Images per forward pass. On out-of-memory errors it is halved, with a
        warning, and the run goes on.
    num_workers : int, optional
        DataLoader worker processes; ``None`` is 0 on the CPU (the network
        takes the cores) and, with CUDA, the cores this process may use less
        one (shared among the processes of a machine under ``torchrun``).
    device : str, optional
        ``None`` is CUDA when available, else the CPU.
    amp : bool or {"bf16", "fp16"}
        Run under ``torch.autocast``; ``True`` is fp16 on CUDA and bf16 on the
        CPU. The features are float32 either way.
    channels_last : bool
        Use the channels-last memory format (faster for CNNs on recent GPUs).
    progress : bool
        Show a progress bar (images per second).
    decoder : {"auto", "pil", "torchvision"}
        How image files become tensors. ``"pil"``, the worker path: DataLoader
        workers decode (JPEGs with ``torchvision.io.decode_jpeg``, which gives
        Pillow's pixels, checked on reference JPEGs before each run; the rest with
        Pillow), resize and crop, and hand over 8-bit pixels, scaled and
        normalized on ``device``. ``"torchvision"``, the tensor path: workers
        read the bytes; baseline JPEGs are decoded in batches by
        ``decode_jpeg`` on ``device`` (nvJPEG on a GPU) and resized together
        exactly as Pillow resizes 8-bit images (on the CPU the features equal
        Pillow's; see "The tensor path" in the features guide). Files it should
        not take (PNG named ``.JPEG``, CMYK JPEGs, truncated JPEGs...) are left
        to Pillow, which decodes them (listed in :attr:`pillow_fallbacks_` and a
        warning) or skips them as the Pillow path does. ``"auto"``: the worker
        path (measured the faster); a store goes on with the decoder it was
        started with.
    resize : {"auto", "pil", "torch"}
        The worker path's resize. ``"pil"``: Pillow's (the official code's),
        exact. ``"torch"``: torch's antialiased resize of the 8-bit pixels, a
        few times faster, its pixels within a level or two of Pillow's (its
        measured effect on features is in the features guide; a store's key
        records it). ``"auto"``: ``"pil"`` on the CPU, where the network is
        the bottleneck, and ``"torch"`` with CUDA; a store goes on with the
        resize it was started with. The tensor path always resizes as Pillow.
    tf32 : bool
        Let cuDNN's convolutions and cuBLAS's products run in TF32 on CUDA
        (faster on Ampere and later GPUs, with 10-bit mantissas). Off by
        default: float32, as the paper's V100 computed; a store's key records
        it when on.
    truncated_images : {"keep", "skip"}
        An image file whose data stops early: ``"keep"`` decodes it as the
        official code's loader does (Pillow with ``LOAD_TRUNCATED_IMAGES``, set
        for that decode only: the missing part grey), ``"skip"`` skips and lists
        it. Either way the images kept with a missing part, including JPEGs cut
        short but closed by an end-of-image marker, are listed in
        :attr:`truncated_` (and a feature store's manifest).

    Attributes
    ----------
    pillow_fallbacks_ : list of (int, str)
        ``(index, reason)`` of the images of the last :meth:`iter_batches` or
        :meth:`transform` call that the tensor decoder left to Pillow.
    decoder_check_ : dict or None
        The tensor decoder's first images against the Pillow path in that
        call: ``images``, ``max_abs_diff`` and ``mean_abs_diff`` (8-bit units).
    jpeg_check_ : dict
        ``torchvision.io.decode_jpeg`` against Pillow on the package's
        reference JPEGs (real photos, baseline and progressive), checked in
        that call: ``images``, ``max_abs_diff`` (8-bit levels) and
        ``workers_decode_jpegs_with`` (``"torchvision.io"``, or ``"Pillow"``
        when they differ).
    truncated_ : list of (int, str)
        ``(index, note)`` of the images of that call kept although their file
        stops early (see ``truncated_images``).
    feature_check_ : dict or None
        Whether the network looks untrained, from its weights and from the
        features of that call's first different images (up to 64, over as many
        batches as it takes): ``images``, ``mean_cosine`` between them,
        ``nearly_identical`` (over 0.9), ``zero_features``,
        ``normalization_layers`` and ``normalization_at_init`` (those that hold
        the values they were built with), ``weight_tensors``,
        ``weight_tensors_at_init`` (those spread as an initialisation draws
        them) and ``weight_spread_ratio``, and ``untrained`` (said in a logged
        warning when a feature store is built). See "Checks of
        the features" in the features guide for what it can and cannot see.
        Non-finite features, in any batch, stop the call with a ``ValueError``.

    Examples
    --------
    >>> from PIL import Image
    >>> extractor = FeatureExtractor("torchvision:resnet18", preprocessing={"size": 32})
    >>> X = extractor.fit_transform([Image.new("RGB", (40, 30), "red")] * 3)
    >>> X.shape, X.dtype
    ((3, 512), dtype('float32'))
    >>> bool(abs((X**2).sum(axis=1) - 1).max() < 1e-5)
    True
    >>> extractor.fingerprint()["layer"]
    'input:fc'
    """

    def __init__(
        self,
        model="torchvision:resnet50",
        *,
        preprocessing=None,
        layer=None,
        normalize=True,
        batch_size=64,
        num_workers=None,
        device=None,
        amp=False,
        channels_last=False,
        progress=False,
        decoder="auto",
        truncated_images="keep",
        resize="auto",
        tf32=False,
    ):
        self.model = model
        self.preprocessing = preprocessing
        self.layer = layer
        self.normalize = normalize
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.device = device
        self.amp = amp
        self.channels_last = channels_last
        self.progress = progress
        self.decoder = decoder
        self.truncated_images = truncated_images
        self.resize = resize
        self.tf32 = tf32

    # ------------------------------------------------------------ sklearn
    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.requires_fit = False
        tags.input_tags.two_d_array = False
        tags.input_tags.string = True
        return tags

    def __getstate__(self):
        # Never pickle the loaded network: it is rebuilt from the spec.
        state = super().__getstate__()
        for key in ("_loaded", "_micro_batch"):
            state.pop(key, None)
        return state

    def fit(self, X=None, y=None):
        """Do nothing: the network is frozen.

        Parameters
        ----------
        X, y : ignored

        Returns
        -------
        self
        """
        return self

    # ------------------------------------------------------- configuration
    def _cache_key(self):
        model = self.model if isinstance(self.model, str) else id(self.model)
        return (model, repr(self.preprocessing), self.layer, str(self.device), self.channels_last)

    def _validate(self):
        if not isinstance(self.batch_size, (int, np.integer)) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if self.num_workers is not None and (
            not isinstance(self.num_workers, (int, np.integer)) or self.num_workers < 0
        ):
            raise ValueError(f"num_workers must be None or >= 0, got {self.num_workers!r}")
        if self.amp not in (False, True, None, "off", "bf16", "fp16"):
            raise ValueError(f"amp must be a bool, 'bf16' or 'fp16', got {self.amp!r}")
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {self.decoder!r}")
        if self.resize not in RESIZES:
            raise ValueError(f"resize must be one of {RESIZES}, got {self.resize!r}")
        if self.decoder == "torchvision" and self.resize == "torch":
            raise ValueError(
                "decoder='torchvision' resizes as Pillow does; resize='torch' is the worker "
                "path's (decoder='pil' or 'auto')"
            )
        if self.tf32 not in (False, True):
            raise ValueError(f"tf32 must be True or False, got {self.tf32!r}")
        if self.truncated_images not in _TRUNCATED:
            raise ValueError(
                f"truncated_images must be one of {_TRUNCATED}, got {self.truncated_images!r}"
            )

    def _load(self):
        """The network, device and resolved settings, loaded once."""
        loaded = getattr(self, "_loaded", None)
        if loaded is not None and loaded["key"] == self._cache_key():
            return loaded
        import torch

        from ._device import resolve_device

        self._validate()
        device = resolve_device(self.device or None)
        if isinstance(self.model, str):
            with recorded_reads() as files:
                loaded = load_source_model(self.model)
            spec = self.model
        elif isinstance(self.model, torch.nn.Module):
            loaded = LoadedModel(self.model.eval(), "file")  # the caller's own weights
            spec = f"module:{type(self.model).__module__}.{type(self.model).__qualname__}"
            files = []
        else:
            raise TypeError(f"model must be a spec string or an nn.Module, got {self.model!r}")
        module = loaded.module
        digest = weights_sha256(module)
        layer, run = self._resolve_layer(module, loaded.layer)
        check_head_unused(module, layer, loaded.head_not_loaded, f"the weights of {spec!r}")
        preprocessing = self._resolve_preprocessing(module, loaded)
        # How the weights were set; random weights are said, in one line, when the spec
        # named none.
        weights = weights_of(self.model, notify=loaded.weights == "random")
        if loaded.weights == "random":
            weights = RANDOM_WEIGHTS
        off = differs_from_preset(  # None for a module: its preset is not known
            self.model,
            {"preprocessing": preprocessing, "layer": layer, "amp": self._amp_dtype(device)},
            loaded.layer or _default_layer(module),
            MODEL_ZOO,
            functools.partial(self._preset_preprocessing, module, loaded),
        )
        # Before the network moves: its weights and normalization layers, as built or trained.
        normalization, weights_check = normalization_at_init(module), weights_at_init(module)
        run = run.to(device)  # the network, or the wrapper that reads its library's feature
        if self.channels_last:
            run = run.to(memory_format=torch.channels_last)
        self._loaded = {
            "key": self._cache_key(),
            "module": run,
            "device": device,
            "spec": spec,
            "weights": "module" if spec.startswith("module:") else loaded.weights,
            "weights_sha256": digest,
            "layer": layer,
            "preprocessing": preprocessing,
            # Which code loaded the network (a plug-in may take a built-in source's name).
            "origin": {
                "weights": weights,
                "differs_from_preset": off,
                "loader": loaded.loader or None,
                # The files the weights were read from, by their own sha256 (what sha256sum
                # prints); the key's weights_sha256 is the state dict's, whatever the file.
                "weights_files": [weights_file_record(f) for f in files],
            },
            "loader": loaded.loader if loaded.replaces_builtin else None,
            "normalization": normalization,
            "weights_check": weights_check,
        }
        self._micro_batch = None
        return self._loaded

    def _preset_preprocessing(self, module, loaded, key):
        """The preprocessing of ``preprocessing=key``; None where it cannot be followed."""
        try:
            return type(self)(self.model, preprocessing=key)._resolve_preprocessing(module, loaded)
        except ValueError:
            return None

    def _resolve_layer(self, module, source_layer=None):
        """``(layer, the module to run)``: the source's layer, else the classifier's input
        (:func:`find_feature_layer`), or the layer asked for."""
        if self.layer is None:
            return (source_layer, module) if source_layer else find_feature_layer(module)
        layer = str(self.layer)
        if layer == "output" or (source_layer and layer == source_layer):
            return layer, module
        kind, sep, name = layer.partition(":")
        if kind == "feature" and not source_layer:  # the one a library's contract names
            found = _default_layer(module)
            if layer == found:
                return find_feature_layer(module)
        if not sep:
            kind, name = "output", layer
        if kind not in ("input", "output"):
            raise ValueError(
                f"layer must be 'output', a module name or 'input:NAME', got {layer!r}"
            )
        names = dict(module.named_modules())
        if name not in names or not name:
            close = [n for n in names if n and name.split(".")[0] in n][:8]
            hint = f"; close names: {', '.join(close)}" if close else ""
            raise ValueError(f"the network has no module named {name!r}{hint}")
        return f"{kind}:{name}", module

    def _resolve_preprocessing(self, module, loaded):
        p = self.preprocessing
        if p is None:
            preset = paper_preset(self.model)
            library = loaded.get_preprocessing() if preset is None else None
            if preset is not None:  # the paper's models keep the paper's preprocessing
                p = MODEL_ZOO[preset]
            elif library is not None:  # what the model's library prescribes
                p = library
            else:  # a network passed as a module: its library's, where it says (timm's)
                p = module_preprocessing(module) or {}
        elif isinstance(p, str):
            if p not in MODEL_ZOO:
                raise ValueError(f"unknown preprocessing {p!r}; use a MODEL_ZOO key or a dict")
            p = MODEL_ZOO[p]
        elif not isinstance(p, dict):
            raise TypeError(f"preprocessing must be None, a MODEL_ZOO key or a dict, got {p!r}")
        if "normalization" in p:  # a MODEL_ZOO row
            mean, std = NORMALIZATION[p["normalization"]]
            p = {"size": p["size"], "mean": mean, "std": std}
        unknown = set(p) - {"size", "resize", "crop", "interpolation", "mean", "std"}
        if unknown:
            raise ValueError(f"unknown preprocessing keys {sorted(unknown)}")
        out = dict(_DEFAULT_PREPROCESSING)
        if "size" in p:
            out["resize"] = out["crop"] = p["size"]
        out.update({k: v for k, v in p.items() if k != "size"})
        for key in ("resize", "crop"):
            value = out[key]
            pair = key == "resize" and isinstance(value, (list, tuple)) and len(value) == 2
            sizes = list(value) if pair else [value]
            if not all(isinstance(v, (int, np.integer)) and v >= 1 for v in sizes):
                what = "a positive integer" + (" or [height, width]" if key == "resize" else "")
                raise ValueError(f"preprocessing {key} must be {what}, got {value!r}")
            out[key] = [int(v) for v in sizes] if pair else int(value)
        if out["interpolation"] not in _INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {_INTERPOLATIONS}")
        if (out["mean"] is None) != (out["std"] is None):
            raise ValueError("give both mean and std, or neither")
        if out["mean"] is not None:
            out["mean"] = [float(x) for x in out["mean"]]
            out["std"] = [float(x) for x in out["std"]]
        return out

    def _amp_dtype(self, device):
        amp = self.amp
        if amp in (False, None, "off"):
            return "off"
        if amp is True:
            return "fp16" if device.type == "cuda" else "bf16"
        return amp

    def _decoder_name(self, device):
        """The decoder that runs: ``"pil"`` (the worker path) or ``"torchvision"``."""
        return decoder_name(self.decoder)

    def _resize_name(self, device):
        """The resize that runs: ``"pil"`` or ``"torch"`` (the worker path's, on 8-bit pixels)."""
        return resize_name(self.decoder, self.resize, device)

    def get_preprocessing(self):
        """The resolved preprocessing: ``resize``, ``crop``, ``interpolation``, ``mean``, ``std``.

        Examples
        --------
        >>> FeatureExtractor("torchvision:inception_v3").get_preprocessing()["crop"]
        299
        """
        return dict(self._load()["preprocessing"])

    def make_transform(self):
        """The torchvision transform from an RGB PIL image to a normalized tensor.

        Examples
        --------
        >>> from PIL import Image
        >>> t = FeatureExtractor("torchvision:resnet18").make_transform()
        >>> tuple(t(Image.new("RGB", (300, 200))).shape)
        (3, 224, 224)
        """
        from torchvision import transforms

        p = self._load()["preprocessing"]
        steps = [
            transforms.Resize(
                p["resize"], interpolation=transforms.InterpolationMode(p["interpolation"])
            ),
            transforms.CenterCrop(p["crop"]),
            transforms.ToTensor(),
        ]
        if p["mean"] is not None:
            steps.append(transforms.Normalize(p["mean"], p["std"]))
        return transforms.Compose(steps)

    def fingerprint(self):
        """Everything that shapes the features, as a dict (the feature store's key).

        ``model`` (the spec, or ``module:<class>``), ``weights_sha256``,
        ``layer`` (such as ``input:fc``, or ``feature:<what>`` for the feature
        layer a model's family defines: ``feature:pre_logits:token``,
        ``feature:image_embedding``, ``feature:cls_token``...),
        ``preprocessing``, ``normalize``, ``amp`` and ``dtype``;
        and ``decoder`` when the tensor decoder runs (its features differ
        slightly from Pillow's); ``resize`` when torch's resize runs; ``tf32``
        when TF32 is allowed; ``truncated_images`` when image files cut short
        are skipped; ``loader`` (``package.module:function``) when a plug-in
        registered under a built-in source's name loaded the network, which the
        spec alone would attribute to the library's own source.

        Examples
        --------
        >>> key = FeatureExtractor("torchvision:resnet18").fingerprint()
        >>> sorted(key)
        ['amp', 'dtype', 'layer', 'model', 'normalize', 'preprocessing', 'weights_sha256']
        """
        loaded = self._load()
        key = {
            # A checkpoint file by its content: the same file under another path is the same.
            "model": spec_by_content(loaded["spec"], loaded["weights_sha256"]),
            "weights_sha256": loaded["weights_sha256"],
            "layer": loaded["layer"],
            "preprocessing": dict(loaded["preprocessing"]),
            "normalize": bool(self.normalize),
            "amp": self._amp_dtype(loaded["device"]),
            "dtype": "float32",
        }
        # Only when they differ from Pillow's: stores made before the options stay valid.
        if self._decoder_name(loaded["device"]) != "pil":
            key["decoder"] = self._decoder_name(loaded["device"])
        if self._resize_name(loaded["device"]) != "pil":
            key["resize"] = self._resize_name(loaded["device"])
        if self.tf32:
            key["tf32"] = True
        if self.truncated_images != "keep":  # other images than the official loader's
            key["truncated_images"] = self.truncated_images
        if loaded["loader"]:  # a plug-in in a built-in source's place: other code, other store
            key["loader"] = loaded["loader"]
        return key

    # -------------------------------------------------------------- forward
    def _workers(self, device):
        return default_workers(device) if self.num_workers is None else int(self.num_workers)

    @staticmethod
    def _launch_ahead(device):
        """Whether the next batch goes to the network before this one's features are waited
        for (on CUDA: the device never idles while the host stores a batch)."""
        return device.type == "cuda"

    def _forward(self, x):
        import torch

        loaded = self._loaded
        device = loaded["device"]
        x = x.to(device, non_blocking=True)
        if self.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        amp = self._amp_dtype(device)
        ctx = (
            torch.autocast(device.type, dtype=torch.bfloat16 if amp == "bf16" else torch.float16)
            if amp != "off"
            else nullcontext()
        )
        with torch.inference_mode(), ctx, network_precision(device, self.tf32):
            features = _forward_layer(loaded["module"], x, loaded["layer"])
        features = features.float()
        if self.normalize:
            features = torch.nn.functional.normalize(features, dim=1)
        return features

    def _embed(self, x):
        """Features of one loaded batch; halves the batch on out-of-memory errors.

        Returns a function that gives them as an array: on CUDA they are copied out through
        pinned memory as the device gets there, so that the caller can launch the next batch
        before it waits for them.
        """
        import torch

        parts, start, n = [], 0, len(x)
        while start < n:
            size = min(self._micro_batch or n, n - start)
            try:
                parts.append(self._forward(x[start : start + size]))
            except torch.cuda.OutOfMemoryError:
                if size == 1:
                    raise
                self._micro_batch = max(1, size // 2)
                warnings.warn(
                    f"out of memory with {size} images per forward pass; going on with "
                    f"{self._micro_batch}",
                    UserWarning,
                    stacklevel=3,
                )
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                continue
            start += size
        features = torch.cat(parts) if len(parts) > 1 else parts[0]
        if features.device.type != "cuda":
            return lambda: features.numpy()
        host = torch.empty(features.shape, dtype=features.dtype, pin_memory=True)
        host.copy_(features, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()

        def result():
            copied.synchronize()
            return host.numpy().copy()  # the pinned block goes back to torch's cache

        return result

    def _check_finite(self, features, indices, dataset, first):
        """Stop the run, in one line naming an image, when a batch has non-finite features."""
        bad = ~np.isfinite(features).all(axis=1)
        if not bad.any():
            return
        where = f"the first {len(features)}" if first else f"the {len(features)}"
        raise ValueError(
            f"{self._loaded['spec']} gives non-finite features (NaN or infinity) for "
            f"{int(bad.sum())} of {where} images of a batch (the first: "
            f"{dataset.ids[int(indices[np.argmax(bad)])]}): its weights are broken (or "
            "overflow in this precision); nothing of the batch is stored"
        )

    def _report_check(self, check, warn):
        """Keep the check of the first images in :attr:`feature_check_`; with ``warn``, say an
        untrained network in one logged line (unless its spec named no weights, which is said
        already)."""
        self.feature_check_ = found = check.result()
        reasons = untrained_reasons(found) if found else []
        if warn and reasons and self._loaded["weights"] != RANDOM_WEIGHTS:
            _LOG.warning(
                f"imagenet_cog: {self._loaded['spec']} looks untrained, as a randomly "
                f"initialised network does: {'; '.join(reasons)}. Check its weights: its "
                "results are not comparable with the paper's"
            )

    def iter_batches(
        self, dataset, batches, *, progress=None, desc="features", for_store=False, by_file=False
    ):
        """Run the network over ``dataset`` and yield the features batch by batch.

        Parameters
        ----------
        dataset : ImageDataset
            Its transform is replaced by :meth:`make_transform`.
        batches : sequence of sequence of int
            The dataset indices of each batch, in order.
        progress : bool or tqdm bar, optional
            Defaults to the ``progress`` parameter. A bar is advanced, not
            closed (one bar over several calls).
        desc : str
            Label of the progress bar.
        for_store : bool
            For a feature store: also yield the batch's images kept with a note
            (see :attr:`truncated_`) and those the tensor decoder left to Pillow
            (see :attr:`pillow_fallbacks_`), and say nearly identical features
            (:attr:`feature_check_`) in a logged warning.
        by_file : bool
            The batches, in the order their images lie on disk, are cut into one
            contiguous run per DataLoader worker, so that each worker reads its own
            data files (tars, Parquet row groups) forward and once. The batches then
            come in the workers' turn, not in the order given (so a store holds up to
            one unfinished shard per worker). Images in files of their own keep the
            usual DataLoader.

        Yields
        ------
        indices : ndarray of int64
            The decoded images of the batch.
        features : ndarray of float32, shape (len(indices), d), or None
            ``None`` when no image of the batch decoded.
        failed : list of (int, str)
            ``(index, reason)`` of the images that could not be decoded.
        notes : list of (int, str)
            With ``for_store``: ``(index, note)`` of the images kept although
            their file stops early.
        fallbacks : list of (int, str)
            With ``for_store``: ``(index, reason)`` of the images the tensor
            decoder left to Pillow.

        Raises
        ------
        ValueError
            When a batch's features are not finite.

        Examples
        --------
        >>> import pathlib, tempfile
        >>> from PIL import Image
        >>> from imagenet_cog import FeatureExtractor, Levels, make_split
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> (root / "n00000001").mkdir()
        >>> for i in range(3):
        ...     Image.new("RGB", (8, 8), (80 * i, 9, 9)).save(root / "n00000001" / f"x{i}.JPEG")
        >>> split = make_split(root, "L1", "train", Levels([["n00000001"]]), n_test=1)
        >>> ext = FeatureExtractor("torchvision:resnet18", preprocessing={"size": 16})
        >>> [(i.tolist(), f.shape, bad) for i, f, bad in ext.iter_batches(split.dataset(), [[0, 1]])]
        [([0, 1], (2, 512), [])]
        """
        import torch
        from tqdm.auto import tqdm

        from ._data.network_inputs import NetworkInputs
        from ._data.sources import STALE_LISTING, StaleListingError

        loaded = self._load()
        device = loaded["device"]
        inputs = NetworkInputs(
            dataset,
            loaded["preprocessing"],
            decoder=self._decoder_name(device),
            resize=self._resize_name(device),
            truncated=self.truncated_images,
            device=device,
            workers=self._workers(device),
            reference_transform=self.make_transform(),
        )
        self.jpeg_check_ = inputs.check_jpeg_decoder()
        if self.jpeg_check_["max_abs_diff"] != 0 and self.jpeg_check_["images"]:
            warnings.warn(
                "torchvision.io.decode_jpeg gives other pixels than Pillow here (up to "
                f"{self.jpeg_check_['max_abs_diff']} levels on the package's "
                f"{self.jpeg_check_['images']} reference JPEGs: their libjpeg builds differ): the "
                "workers decode JPEGs with Pillow, which is slower",
                UserWarning,
                stacklevel=2,
            )
        show = self.progress if progress is None else progress
        total = sum(len(b) for b in batches)
        self.pillow_fallbacks_, self.truncated_, self.feature_check_ = [], [], None
        check = FeatureCheck(loaded["normalization"], loaded["weights_check"])
        first, said = True, False
        if hasattr(show, "update"):  # a caller's bar, over more than these batches
            bar = nullcontext(show)
        else:
            bar = tqdm(total=total, desc=desc, unit="img", disable=not show, smoothing=0.1)

        def finish(indices, x, failed, notes, fallbacks, features):
            nonlocal first
            if features is not None:
                features = features()[: len(x)]
                # Every batch: a NaN may come with any image.
                self._check_finite(features, indices, dataset, first)
                first = False
                if not check.full:
                    check.add(x, features)
                    if check.full:  # said as soon as known, not after the whole run
                        self._report_check(check, for_store)
            bar.update(len(indices) + len(failed))
            out = indices.numpy(), features, failed
            return (*out, notes, fallbacks) if for_store else out

        ahead = self._launch_ahead(device)
        with bar as bar:
            pending = None
            for indices, x, failed, fallbacks, notes in inputs.batches(batches, by_file=by_file):
                if inputs.decoder is not None and inputs.decoder.warning and not said:
                    said = True
                    warnings.warn(inputs.decoder.warning, UserWarning, stacklevel=2)
                self.pillow_fallbacks_ += fallbacks
                self.truncated_ += notes
                stale = [why for _, why in failed if str(why).startswith(STALE_LISTING)]
                if stale:  # a data file rewritten since its listing: no label can be trusted
                    raise StaleListingError(stale[0][len(STALE_LISTING) :])
                features = None
                if x is not None:
                    # For a store, an image that cannot be decoded leaves the network a batch
                    # of the size planned (the last image repeated): in some kernels an
                    # image's features depend on the batch size, and the one pass over a copy
                    # must give the features of a store built alone.
                    planned = len(indices) + len(failed) if for_store else len(x)
                    filler = x[-1:].expand(planned - len(x), *x.shape[1:])
                    features = self._embed(torch.cat([x, filler]) if len(filler) else x)
                batch = (indices, x, failed, notes, fallbacks, features)
                if pending is not None:
                    yield finish(*pending)
                pending = batch
                if not ahead:
                    yield finish(*pending)
                    pending = None
            if pending is not None:
                yield finish(*pending)
        if not check.full:  # fewer images than the check takes: what there is
            self._report_check(check, for_store)
        self.decoder_check_ = inputs.decoder.check if inputs.decoder is not None else None
        if self.pillow_fallbacks_:
            n = len(self.pillow_fallbacks_)
            shown = "; ".join(f"{dataset.ids[i]} ({why})" for i, why in self.pillow_fallbacks_[:5])
            warnings.warn(
                f"{n} image(s) were decoded with Pillow, not the tensor decoder: {shown}"
                + (f" and {n - 5} more" if n > 5 else ""),
                UserWarning,
                stacklevel=2,
            )

    def transform(self, X):
        """Features of images.

        Parameters
        ----------
        X : sequence of paths or PIL images, an ``ImageDataset``, a ``Split``,
            or a map-style dataset whose items are PIL images or tuples that
            start with one (such as torchvision's ``ImageFolder``).

        Returns
        -------
        ndarray of shape (n_images, n_features), float32

        Raises
        ------
        ValueError
            When some images cannot be read or decoded (all are listed). To
            skip and list them instead, use :func:`imagenet_cog.extract`.
        """
        dataset = _as_dataset(X)
        n = len(dataset)
        if n == 0:
            raise ValueError("no images to transform")
        bs = int(self.batch_size)
        batches = [range(i, min(i + bs, n)) for i in range(0, n, bs)]
        parts, bad = [], []
        for _indices, features, failed in self.iter_batches(dataset, batches):
            bad += failed
            if features is not None:
                parts.append(features)
        if bad:
            shown = "; ".join(f"{dataset.ids[i]}: {why}" for i, why in bad[:10])
            more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
            raise ValueError(f"{len(bad)} image(s) could not be read: {shown}{more}")
        return np.concatenate(parts)


def _as_dataset(X):
    import torch.utils.data

    from ._data.sources import ItemOf
    from .datasets import ImageDataset, Split

    if isinstance(X, ImageDataset):
        return X
    if isinstance(X, Split):
        return X.dataset()
    if isinstance(X, (str, bytes, os.PathLike)) or hasattr(X, "convert"):
        raise TypeError("X must be a collection of images; wrap a single image in a list")
    if isinstance(X, torch.utils.data.Dataset):
        n = len(X)
        return ImageDataset([ItemOf(X, i) for i in range(n)], ids=[str(i) for i in range(n)])
    items = X.ravel().tolist() if isinstance(X, np.ndarray) else list(X)
    ids = [
        str(x) if isinstance(x, (str, os.PathLike)) else f"<image {i}>" for i, x in enumerate(items)
    ]
    return ImageDataset(items, ids=ids)
