"""Copies of model configurations published on the Hugging Face Hub, and a fake hub cache.

The tests build ``hf:`` specs offline: these are the ``config.json`` and
``preprocessor_config.json`` of the repositories the model zoo page names (their
architecture and image-processor fields), written into a Hugging Face cache laid out as
``huggingface_hub`` lays it out, with no weights in it.
"""

import json
from pathlib import Path

#: DINOv2's image processor (the same file in the four facebook/dinov2-* repositories).
DINOV2_PROCESSOR = {
    "crop_size": {"height": 224, "width": 224},
    "do_center_crop": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.485, 0.456, 0.406],
    "image_processor_type": "BitImageProcessor",
    "image_std": [0.229, 0.224, 0.225],
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"shortest_edge": 256},
}


def _dinov2(hidden, heads, layers, swiglu):
    return {
        "architectures": ["Dinov2Model"],
        "attention_probs_dropout_prob": 0.0,
        "drop_path_rate": 0.0,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "hidden_size": hidden,
        "image_size": 518,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-06,
        "layerscale_value": 1.0,
        "mlp_ratio": 4,
        "model_type": "dinov2",
        "num_attention_heads": heads,
        "num_channels": 3,
        "num_hidden_layers": layers,
        "patch_size": 14,
        "qkv_bias": True,
        "use_swiglu_ffn": swiglu,
    }


#: ``{repo id: {file name: contents}}``.
HUB_FILES = {
    "facebook/dinov2-small": {"config.json": _dinov2(384, 6, 12, False)},
    "facebook/dinov2-base": {"config.json": _dinov2(768, 12, 12, False)},
    "facebook/dinov2-large": {"config.json": _dinov2(1024, 16, 24, False)},
    "facebook/dinov2-giant": {"config.json": _dinov2(1536, 24, 40, True)},
    "facebook/convnext-base-224": {
        "config.json": {
            "architectures": ["ConvNextForImageClassification"],
            "depths": [3, 3, 27, 3],
            "drop_path_rate": 0.0,
            "hidden_act": "gelu",
            "hidden_sizes": [128, 256, 512, 1024],
            "image_size": 224,
            "initializer_range": 0.02,
            "layer_norm_eps": 1e-12,
            "layer_scale_init_value": 1e-06,
            "model_type": "convnext",
            "num_channels": 3,
            "num_stages": 4,
            "patch_size": 4,
        },
        "preprocessor_config.json": {
            "crop_pct": 0.875,
            "do_normalize": True,
            "do_resize": True,
            "feature_extractor_type": "ConvNextFeatureExtractor",
            "image_mean": [0.485, 0.456, 0.406],
            "image_std": [0.229, 0.224, 0.225],
            "resample": 3,
            "size": 224,
        },
    },
}
for _repo in ("small", "base", "large", "giant"):
    HUB_FILES[f"facebook/dinov2-{_repo}"]["preprocessor_config.json"] = DINOV2_PROCESSOR


def write_hub_cache(cache, repos=HUB_FILES, commit="0" * 40):
    """Write ``{repo: {file: contents}}`` into a Hugging Face hub cache folder.

    Contents are JSON objects or bytes. Returns ``{repo: snapshot folder}``.
    """
    folders = {}
    for repo, files in repos.items():
        base = Path(cache) / ("models--" + repo.replace("/", "--"))
        snapshot = base / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        (base / "refs").mkdir(exist_ok=True)
        (base / "refs" / "main").write_text(commit)
        for name, content in files.items():
            data = content if isinstance(content, bytes) else json.dumps(content).encode()
            (snapshot / name).write_bytes(data)
        folders[repo] = snapshot
    return folders
