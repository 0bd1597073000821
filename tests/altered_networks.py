"""Networks the untrained-network check must judge: random ones altered as users alter them
(BatchNorm folded, another norm initialisation, a step of training), and a trained network's
input of near-identical images (crops of one photo). Shared by the tests and
``benchmarks/bench_random_weights.py``."""

import itertools
from pathlib import Path

import numpy as np
import torch


def fold_batchnorm(net):
    """``net`` with each BatchNorm that follows a convolution in a Sequential folded into it
    (as deployment tools fold them), the BatchNorm then an identity."""
    for seq in [m for m in net.modules() if isinstance(m, torch.nn.Sequential)]:
        names = list(seq._modules)
        for a, b in itertools.pairwise(names):
            conv, bn = seq._modules[a], seq._modules[b]
            if isinstance(conv, torch.nn.Conv2d) and isinstance(bn, torch.nn.BatchNorm2d):
                scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
                bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
                with torch.no_grad():
                    conv.weight.mul_(scale[:, None, None, None])
                    conv.bias = torch.nn.Parameter(bn.bias + (bias - bn.running_mean) * scale)
                seq._modules[b] = torch.nn.Identity()
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())
    return net.eval()


def norm_init_altered(net):
    """``net`` with the scales and shifts of its normalization layers drawn at random, as an
    initialisation of its own might draw them."""
    with torch.no_grad():
        for m in net.modules():
            if "Norm" in type(m).__name__ and getattr(m, "weight", None) is not None:
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.02)
    return net.eval()


def one_sgd_step(net, photos, lr=0.1):
    """``net`` (a timm network) after one step of SGD (momentum 0.9) on the ``photos``
    (paths), twice each, at 64 px, with random labels."""
    from imagenet_cog import FeatureExtractor
    from imagenet_cog.datasets import decode_image

    t = FeatureExtractor(net, preprocessing={"size": 64}).make_transform()
    x = torch.stack([t(decode_image(Path(p).read_bytes())) for p in photos] * 2)
    y = torch.randint(0, net.num_classes, (len(x),), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
    return net.eval()


def crops_of_one_photo(photo, n=64, seed=0):
    """``n`` crops of a PIL image, each 75-100% of its width and height, anywhere in it."""
    rng = np.random.default_rng(seed)
    crops = []
    w, h = photo.size
    for _ in range(n):
        cw, ch = int(rng.integers(w * 3 // 4, w + 1)), int(rng.integers(h * 3 // 4, h + 1))
        x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        crops.append(photo.crop((x0, y0, x0 + cw, y0 + ch)))
    return crops
