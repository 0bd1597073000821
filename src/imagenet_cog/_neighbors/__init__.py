"""The k-nearest-neighbour wing of the probe stage: the cosine neighbour search in blocks
(:mod:`.search`), the temperature-weighted votes (:mod:`.votes`) and the estimator that joins
them (:mod:`.estimator`, :class:`~imagenet_cog.KNNProbe`).
"""
