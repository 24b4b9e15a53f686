"""Attacks on what split learning exchanges, as pure functions on arrays.

A secondary sees, per step, the tokens of its records the batch needs (U,) and the gradient of
the primary's loss w.r.t. their embeddings (U, c): one row per record, summed over every primary
record of the batch linked to it (the *mixing* of a fuzzy linkage). It holds its own features and
bottom model. From these it may infer the primary's labels:

- **norm** (Li et al., ICLR 2022): a record's gradient norm; for binary labels with the minority
  class positive, |p - y| is larger for positives.
- **direction** (Li et al.'s cosine attack): the step's gradients projected on their principal
  direction, kept aligned from step to step (strategies/vfl/exchange_observer.py); binary labels split by its sign, a regression's signed
  residual (prediction - label) rides on it. Its orientation is fixed with the attacker's handful of
  known labels, never with the truth.
  For classes, the cosine attack by centroids (:func:`class_direction`): each record's mean unit
  gradient row against the mean of those of the known records of each class.
- **completion** (Fu et al., USENIX Security 2022): a head fitted on the secondary's own
  embeddings of a handful of its records whose labels it knows, applied to all its records.

The primary sees the secondaries' embeddings (U, c): **inversion** fits a model from embedding
to features on an auxiliary sample whose features it knows (a public sample of the secondary's
population, say) and predicts the others' features; scored against predicting the sample's mean.

Truth for a secondary record is the label of the training primary records linked to it: their
mean (regression, binary: the positive share, binarised at 1/2) or their majority class.
"""

from __future__ import annotations

import numpy as np

KNOWN = 20  # labels the attacker is assumed to know (Fu et al. use a few dozen): at least this many


def auc(scores: np.ndarray, truth: np.ndarray) -> float:
    """ROC AUC of ``scores`` for binary ``truth`` (0/1), ties averaged; nan when one class is absent."""
    pos = truth.astype(bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if not n_pos or not n_neg:
        return float("nan")
    ranks = average_ranks(scores)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation; nan for fewer than 3 pairs or a constant side."""
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(np.corrcoef(average_ranks(a), average_ranks(b))[0, 1])  # Pearson on the ranks


def average_ranks(values: np.ndarray) -> np.ndarray:
    """(n,) 1-based ranks, ties given their average rank (scipy.stats.rankdata's default, whose
    import cost every ServerApp 0.4 s of CPU for these two uses)."""
    values = np.asarray(values).ravel()
    _, tie, counts = np.unique(values, return_inverse=True, return_counts=True)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])  # each tied group's first 0-based rank
    return (first + (counts + 1) / 2.0)[tie]


def standardise(x: np.ndarray) -> np.ndarray:
    """(x - mean) / std, zeros for a constant x: one step's scores on a common scale."""
    sd = x.std()
    return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x)


def token_targets(index: np.ndarray, target: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per position 0..n-1 of a (B, K) ``index`` the number of the batch's pairs using it (links)
    and the mean of their records' ``target`` (B,) (nan where unused): the label a step's
    gradient row mixes."""
    k = index.shape[1]
    links = np.bincount(index.ravel(), minlength=n)
    sums = np.bincount(index.ravel(), weights=np.repeat(target.astype(float), k), minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return links, sums / links


def record_truth(tokens: np.ndarray, labels: np.ndarray, n: int, task: str) -> np.ndarray:
    """Per secondary token (n,) the label of the training primary records linked to it: ``tokens``
    (m, K) their links, ``labels`` (m,). Regression: the mean; binary: 1 / 0 where the positive
    share is above / below 1/2 (nan at exactly 1/2); multiclass: the majority class. Nan for an
    unlinked token."""
    flat, rep = tokens.ravel(), np.repeat(labels, tokens.shape[1])
    count = np.bincount(flat, minlength=n).astype(float)
    if task == "multiclass":
        votes = np.zeros((n, int(labels.max()) + 1))
        np.add.at(votes, (flat, rep.astype(int)), 1.0)
        return np.where(count > 0, votes.argmax(1), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.bincount(flat, weights=rep.astype(float), minlength=n) / count
    if task == "binary":
        return np.where(mean > 0.5, 1.0, np.where(mean < 0.5, 0.0, np.nan))
    return mean


def known_rows(truth: np.ndarray, task: str, rng: np.random.Generator, n_classes: int = 2) -> np.ndarray:
    """The attacker's known labels: positions of ``truth`` (nan = unknowable) it is given, at least
    :data:`KNOWN` and 4 per class for classification, drawn at random."""
    have = np.flatnonzero(~np.isnan(truth))
    want = min(len(have) // 2, max(KNOWN, 4 * n_classes if task != "regression" else KNOWN))
    return np.sort(rng.choice(have, size=want, replace=False)) if want else have[:0]


def orientation(scores: np.ndarray, truth: np.ndarray, known: np.ndarray, task: str) -> float:
    """+1 or -1: the sign that makes ``scores`` rise with the label on the ``known`` rows only
    (the attacker's handful), never on the truth it is scored against."""
    if not len(known):
        return 1.0
    value = (auc if task == "binary" else spearman)(scores[known], truth[known])
    return -1.0 if np.isfinite(value) and value < (0.5 if task == "binary" else 0.0) else 1.0


def chance(truth: np.ndarray, task: str) -> float:
    """What guessing scores: AUC 1/2, Spearman 0, the majority class's share (multiclass)."""
    if task != "multiclass":
        return 0.5 if task == "binary" else 0.0
    return float(np.bincount(truth.astype(int)).max() / len(truth)) if len(truth) else float("nan")


def score(pred: np.ndarray, truth: np.ndarray, task: str) -> float:
    """The attack's success: AUC (binary, ``pred`` a score), Spearman (regression), accuracy
    (multiclass, ``pred`` a class)."""
    if task == "binary":
        return auc(pred, truth)
    if task == "regression":
        return spearman(pred, truth)
    return float((pred == truth).mean()) if len(truth) else float("nan")


def completion(emb: np.ndarray, truth: np.ndarray, known: np.ndarray, task: str) -> float:
    """Model completion: a head fitted on the embeddings ``emb`` (n, c) of the ``known`` rows, scored
    on the other rows that have a truth. Logistic regression for labels, ridge for regression,
    on embeddings standardised with the known rows' statistics."""
    from sklearn.linear_model import LogisticRegression, Ridge  # lazy: the attacks alone need it

    rest = np.setdiff1d(np.flatnonzero(~np.isnan(truth)), known)
    if len(known) < 4 or not len(rest) or len(np.unique(truth[known])) < 2:
        return float("nan")
    mu, sd = emb[known].mean(0), emb[known].std(0) + 1e-12
    x = (emb - mu) / sd
    if task == "regression":
        return spearman(Ridge(alpha=1.0).fit(x[known], truth[known]).predict(x[rest]), truth[rest])
    head = LogisticRegression(max_iter=2000).fit(x[known], truth[known].astype(int))
    pred = head.predict_proba(x[rest])[:, 1] if task == "binary" else head.predict(x[rest])
    return score(pred, truth[rest], task)


def inversion(emb: np.ndarray, features: np.ndarray, aux: np.ndarray, seed: int = 0) -> dict[str, float]:
    """Feature reconstruction from embeddings: an MLP (sklearn, early stopping on a tenth of the
    auxiliary rows) fitted on the ``aux`` rows' (embedding, features), applied to the others.
    Returns the mean squared error over standardised features of the attack and of predicting the
    auxiliary mean, and their ratio (1 = the embeddings taught nothing; 0 = exact recovery)."""
    from sklearn.neural_network import MLPRegressor  # lazy: the attacks alone need it

    rest = np.setdiff1d(np.arange(len(emb)), aux)
    mu, sd = features[aux].mean(0), features[aux].std(0) + 1e-12
    f = (features - mu) / sd
    e_mu, e_sd = emb[aux].mean(0), emb[aux].std(0) + 1e-12
    e = (emb - e_mu) / e_sd
    target = f[aux] if f.shape[1] > 1 else f[aux].ravel()  # one feature: a 1-D target, as sklearn wants
    model = MLPRegressor(hidden_layer_sizes=(128, 128), max_iter=400, early_stopping=True, random_state=seed)
    model.fit(e[aux], target)
    attack = float(((model.predict(e[rest]).reshape(len(rest), -1) - f[rest]) ** 2).mean())
    baseline = float((f[rest] ** 2).mean())  # the auxiliary mean is 0 after standardising
    return {"mse": attack, "mean_baseline_mse": baseline, "ratio": attack / baseline if baseline else float("nan")}


def class_direction(directions: np.ndarray, truth: np.ndarray, known: np.ndarray) -> np.ndarray:
    """The cosine attack for classes: per record (n,) the class whose centroid its mean gradient
    direction ``directions`` (n, c) is most similar to (cosine), a class's centroid being the mean
    unit direction of its ``known`` records (classes with no known record are never predicted)."""
    unit = directions / np.maximum(np.linalg.norm(directions, axis=1, keepdims=True), 1e-30)  # (n, c)
    classes = np.unique(truth[known]).astype(int)
    cent = np.stack([unit[known[truth[known] == c]].mean(0) for c in classes])  # (C, c)
    cent /= np.maximum(np.linalg.norm(cent, axis=1, keepdims=True), 1e-30)
    return classes[(unit @ cent.T).argmax(1)].astype(float)
