"""The features stage's wing: what the extraction needs beyond its face modules.

- ``settings``: how an extraction runs on a device: its decoder and resize resolved from
  ``"auto"``, its DataLoader workers, the network's float32 or TF32 arithmetic, and a store
  going on with the settings it was started with.

Private: the public faces are :class:`~imagenet_cog.FeatureExtractor` and the stores.
"""
