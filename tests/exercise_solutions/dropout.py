def dropout_forward(x, p, rng, training=True):
    if not training or p == 0:
        return x, None
    mask = (rng.random(x.shape) >= p) / (1 - p)
    return x * mask, mask


def dropout_backward(dy, cache):
    if cache is None:
        return dy
    return dy * cache
