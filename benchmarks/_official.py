"""The official ImageNet-CoG training loop, written plainly, as the benchmarks' baseline.

What ``logreg.py`` and ``feature_ops.py`` of github.com/naver/cog do for one
classifier, re-implemented (not copied) with the same structure: a per-class
``int(0.2 n)`` validation split drawn with ``randperm``, few-shot draws with
``randperm``, one ``nn.Linear`` trained with ``torch.optim.SGD`` (momentum
0.9, weight decay) over ``randperm`` batches of 1024, the cosine step applied
after each epoch, and the last epoch's top-1. One configuration at a time.
"""

import math

import numpy as np
import torch


def official_split(y, seed, n_shots, gen):
    """``split_trainset`` (20% per class for validation), then ``make_fewshot_dataset``."""
    train, val = [], []
    for c in np.unique(y):
        idx = torch.from_numpy(np.flatnonzero(y == c))
        idx = idx[torch.randperm(len(idx), generator=gen)]
        n_val = int(len(idx) * 0.2)
        train.append(idx[: len(idx) - n_val])
        val.append(idx[len(idx) - n_val :])
    train, val = torch.cat(train), torch.cat(val)
    if n_shots is not None:
        train = official_fewshot(y, train, n_shots, gen)
    return train, val


def progress_bar(total, desc):
    """A tqdm bar over SGD steps on stderr, refreshed at most every 5 s (log files stay short)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="step", mininterval=5, smoothing=0.1)


def official_fewshot(y, rows, n_shots, gen):
    """``make_fewshot_dataset``: ``n_shots`` random rows of each class among ``rows``."""
    out = []
    labels = y[rows.numpy()]
    for c in np.unique(labels):
        idx = rows[torch.from_numpy(labels == c)]
        out.append(idx[torch.randperm(len(idx), generator=gen)[:n_shots]])
    return torch.cat(out)


def official_train(X, y, rows, eval_X, eval_y, lr, wd, epochs, gen, batch_size=1024, bar=None):
    """``LogReg.__call__``: train one probe, return its last-epoch top-1 (%) on the eval set.

    NaN when the loss becomes non-finite (the official code stops training there). ``bar``
    (a tqdm bar, optional) advances by each epoch's SGD steps, so long runs show progress.
    """
    x, t = X[rows], y[rows]
    model = torch.nn.Linear(X.shape[1], int(y.max()) + 1).to(X.device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=wd)
    bs = min(batch_size, len(t))
    for epoch in range(epochs):
        order = torch.randperm(len(t), generator=gen).to(X.device)
        for start in range(0, len(t), bs):
            batch = order[start : start + bs]
            loss = torch.nn.functional.cross_entropy(model(x[batch]), t[batch])
            if not torch.isfinite(loss):
                return math.nan
            opt.zero_grad()
            loss.backward()
            opt.step()
        for group in opt.param_groups:  # adjust_learning_rate, after the epoch
            group["lr"] = lr * 0.5 * (1.0 + math.cos(math.pi * epoch / epochs))
        if bar is not None:
            bar.update(math.ceil(len(t) / bs))
    with torch.no_grad():
        return 100.0 * float((model(eval_X).argmax(1) == eval_y).float().mean())
