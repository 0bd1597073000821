"""The analysis wing: every analysis beyond the linear probe's accuracy, and the table of
analyses.

- ``table``: the table of analyses, one row per analysis (what it needs, how it runs on a
  domain, its measures with their titles, definitions, units and better way), which
  :func:`~imagenet_cog.analysis.analyze` runs and every report of an analysis reads;
- ``kmeans``: k-means on the GPU or CPU, purity, and the cluster scores of a domain;
- ``alignment``: alignment and uniformity of a feature space (Wang & Isola, 2020);
- ``semantic_errors``: where in WordNet a classifier's errors land;
- ``probes``: the PCA and MLP probes, on the protocol of the linear probe;
- ``mlp``: the MLP probe as a scikit-learn classifier;
- ``concept_accuracy``: each concept's accuracy against its similarity to ImageNet-1K;
- ``checks``: the input checks and tensor helpers they share.

A new analysis is its module here and its row in the table. The wing sits with the results
stage: the readers of results (the analysis table, the HTML report) read its table, and its
analyses read features, probes and saved predictions, all of earlier stages.
:mod:`imagenet_cog.analysis`, its face, exports the public names and runs the analyses.
"""
