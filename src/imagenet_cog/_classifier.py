"""The predict surface the probes share, as scikit-learn's ``LinearClassifierMixin`` shares
``predict`` among its linear models: the class scores of a fitted probe make its predictions,
probabilities and accuracy.

Probe stage; imports nothing from the package.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit, log_softmax, softmax
from sklearn.base import ClassifierMixin

__all__ = ["ProbeClassifierMixin"]


class ProbeClassifierMixin(ClassifierMixin):
    """``predict``, ``predict_proba``, ``predict_log_proba`` and ``score`` of a probe.

    A probe defines ``_class_scores(X)``, which checks the fit and ``X`` and returns the
    scores of shape ``(n_samples, n_classes)``, or ``(n_samples,)`` for two classes (the
    logit of ``classes_[1]``, scikit-learn's binary form); and ``classes_``.
    """

    def _class_scores(self, X):
        raise NotImplementedError

    def score(self, X, y, sample_weight=None):
        """Mean accuracy of :meth:`predict` on ``(X, y)``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        sample_weight : array-like of shape (n_samples,), optional

        Returns
        -------
        float

        Examples
        --------
        >>> from sklearn.datasets import make_blobs
        >>> from imagenet_cog import LinearProbe
        >>> X, y = make_blobs(n_samples=60, centers=[[-3, -3], [3, 3]], random_state=0)
        >>> LinearProbe(epochs=5, device="cpu", random_state=0).fit(X, y).score(X, y)
        1.0
        """
        return super().score(X, y, sample_weight=sample_weight)

    def predict(self, X):
        """Most probable class of each row.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)

        Examples
        --------
        >>> from imagenet_cog import LinearProbe
        >>> probe = LinearProbe(epochs=20, device="cpu", random_state=0)
        >>> probe.fit([[-1.0], [1.0]], ["neg", "pos"]).predict([[-3.0], [3.0]]).tolist()
        ['neg', 'pos']
        """
        scores = self._class_scores(X)  # checks the fit before classes_ is read
        best = (scores > 0).astype(int) if scores.ndim == 1 else scores.argmax(axis=1)
        return self.classes_[best]

    def predict_proba(self, X):
        """Softmax probabilities, columns in the order of ``classes_``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)

        Examples
        --------
        >>> from imagenet_cog import LinearProbe
        >>> probe = LinearProbe(epochs=5, device="cpu").fit([[-1.0], [1.0]], [0, 1])
        >>> float(probe.predict_proba([[0.0]]).sum())
        1.0
        """
        scores = self._class_scores(X)
        if scores.ndim == 1:
            p = expit(scores)
            return np.column_stack([1.0 - p, p])
        return softmax(scores, axis=1)

    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`, computed stably.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)

        Examples
        --------
        >>> from imagenet_cog import LinearProbe
        >>> probe = LinearProbe(epochs=5, device="cpu").fit([[-1.0], [1.0]], [0, 1])
        >>> probe.predict_log_proba([[0.0]]).shape
        (1, 2)
        """
        scores = self._class_scores(X)
        if scores.ndim == 1:
            scores = np.column_stack([np.zeros_like(scores), scores])
        return log_softmax(scores, axis=1)
