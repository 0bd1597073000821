"""Rename a checkpoint's weights to a network's own names, pairing them in order.

A checkpoint of the same network written by another library names its weights its own way
(EfficientNet-PyTorch's ``_blocks.3._expand_conv.weight`` is timm's
``blocks.1.1.conv_pw.weight``), and ``extract`` refuses it: none of its keys is a weight of
the network. When the two list their weights in the same order (both follow the order the
layers are built in), this script pairs them one by one, checks every pair (the same last
part of the name, ``weight``, ``bias``, ``running_mean``...; the same shape) and writes the
file's tensors under the network's names::

    python tools/rename_weights.py efficientnet-lite0-57934424.pth \\
        timm:tf_efficientnet_lite0 lite0-timm.pth
    imagenet-cog extract timm:tf_efficientnet_lite0:lite0-timm.pth ...

The network is built from its spec with random weights, as ``extract`` builds it (nothing is
downloaded; timm's networks without their classifier, whose weights, the file's last, are
left out and said so); the file is read without unpickling anything but tensors. Any pair that does not match stops the script
with the pair named, and nothing is written: the two are not the same network, or not in the
same order, and the names must be mapped by hand.
"""

from __future__ import annotations

import argparse
import sys


def renamed(state, own):
    """``(tensors, left out)``: ``state``'s tensors under the names of ``own`` (both state
    dicts), paired in order, and the keys of the file's last tensors past the network's (the
    classifier of a network built without it, as ``extract`` builds timm's).

    Raises ``ValueError`` naming the first pair that differs in its last name part or its
    shape, or the counts when the network has more tensors than the file.
    """
    theirs, ours = list(state), list(own)
    if len(theirs) < len(ours):
        raise ValueError(
            f"the file holds {len(theirs)} tensors and the network {len(ours)}: not the same "
            "network, or a part of it is missing"
        )
    out = {}
    for i, (key, name) in enumerate(zip(theirs, ours)):
        a, b = tuple(state[key].shape), tuple(own[name].shape)
        if key.rsplit(".", 1)[-1] != name.rsplit(".", 1)[-1] or a != b:
            raise ValueError(
                f"tensor {i} of the file, {key} {a}, does not pair with the network's {name} "
                f"{b}: the two do not list the same weights in the same order"
            )
        out[name] = state[key]
    return out, theirs[len(ours) :]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("checkpoint", help="the weights file to rename")
    parser.add_argument("spec", help="the network, as a model spec with no weights")
    parser.add_argument("out", help="the file to write (.pth or .safetensors)")
    args = parser.parse_args(argv)
    import torch

    from imagenet_cog import load_model
    from imagenet_cog._models.spec import split_spec
    from imagenet_cog._models.weights import read_checkpoint

    source, name, _ = split_spec(args.spec)
    spec = f"{source}:{name}"
    own = load_model(f"{spec}:none").state_dict()
    state = read_checkpoint(args.checkpoint)
    try:
        out, left = renamed(state, own)
    except ValueError as exc:
        sys.exit(f"rename_weights: {args.checkpoint}: {exc}")
    out = {k: v.contiguous() for k, v in out.items()}
    if args.out.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(out, args.out)
    else:
        torch.save(out, args.out)
    print(
        f"{len(out)} tensors renamed ({next(iter(state))} -> {next(iter(out))}...), written "
        f"to {args.out}; extract with {spec}:{args.out}"
    )
    if left:
        print(
            f"the file's last {len(left)} tensors ({', '.join(left)}) have no place in the "
            "network as extract builds it (without its classifier): left out"
        )


if __name__ == "__main__":
    main()
