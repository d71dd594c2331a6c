import numpy as np


def cross_entropy_forward(logits, targets, ignore_index=-100, label_smoothing=0.0):
    C = logits.shape[-1]
    z = logits.reshape(-1, C)
    t = np.asarray(targets).reshape(-1)
    keep = t != ignore_index
    t = np.where(keep, t, 0)
    m = z.max(axis=1, keepdims=True)
    logp = z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))
    nll = -logp[np.arange(len(t)), t]
    smooth = -logp.mean(axis=1)
    per_row = (1 - label_smoothing) * nll + label_smoothing * smooth
    n = keep.sum()
    loss = float((per_row * keep).sum() / max(n, 1))
    return loss, (np.exp(logp), t, keep, n, label_smoothing, logits.shape)


def cross_entropy_backward(cache, dloss=1.0):
    p, t, keep, n, eps, shape = cache
    C = p.shape[1]
    q = np.full_like(p, eps / C)
    q[np.arange(len(t)), t] += 1 - eps
    g = (p - q) * keep[:, None] * (dloss / max(n, 1))
    return g.reshape(shape)
