"""The models wing: model specs, the registry of model sources, one module per source, the
paper's preprocessing presets and the reading of weights.

Private: the public face is :class:`~imagenet_cog.FeatureExtractor` (and ``extract``).
"""
