"""The analysis wing: every analysis beyond the linear probe's accuracy, each in its module.

- ``kmeans``: k-means on the GPU or CPU, purity, and the cluster scores of a domain;
- ``alignment``: alignment and uniformity of a feature space (Wang & Isola, 2020);
- ``semantic_errors``: where in WordNet a classifier's errors land;
- ``probes``: the PCA and MLP probes, on the protocol of the linear probe;
- ``mlp``: the MLP probe as a scikit-learn classifier;
- ``concept_accuracy``: each concept's accuracy against its similarity to ImageNet-1K;
- ``checks``: the input checks and tensor helpers they share.

:mod:`imagenet_cog.analysis`, the wing's face, exports their public names and runs them
(:func:`~imagenet_cog.analysis.analyze`).
"""
