"""Optimizers and schedules against torch.optim (100 steps, float64, 1e-10) and gradient clipping."""
from __future__ import annotations

import math

import numpy as np
import pytest

from numformer import GPT
from numformer.nn import Parameter
from numformer.optim import SGD, Adam, AdamW, clip_grad_norm, make_schedule, param_groups

torch = pytest.importorskip("torch")

STEPS = 100


def run_pair(nf_cls, torch_cls, options, n_groups=1, lr_schedule=None):
    rng = np.random.default_rng(0)
    shapes = [(4, 3), (5,), (2, 2, 2)]
    init = [rng.standard_normal(s) for s in shapes]
    ours = [Parameter(a.copy()) for a in init]
    theirs = [torch.tensor(a.copy(), requires_grad=True) for a in init]
    if n_groups == 1:
        opt = nf_cls(ours, **options)
        topt = torch_cls(theirs, **options)
    else:   # two groups with different weight decay, as param_groups() makes
        opt = nf_cls([{"params": ours[:2]}, {"params": ours[2:], "weight_decay": 0.0}], **options)
        topt = torch_cls([{"params": theirs[:2]}, {"params": theirs[2:], "weight_decay": 0.0}], **options)
    for step in range(STEPS):
        if lr_schedule is not None:
            opt.set_lr(lr_schedule(step))
            for g in topt.param_groups:
                g["lr"] = lr_schedule(step)
        grads = [rng.standard_normal(s) for s in shapes]
        for p, t, g in zip(ours, theirs, grads):
            p.grad = g.copy()
            t.grad = torch.tensor(g.copy())
        if step == 37:          # a parameter without gradient is skipped, as in torch
            ours[1].grad = None
            theirs[1].grad = None
        opt.step()
        topt.step()
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.data, t.detach().numpy(), rtol=1e-10, atol=1e-10)
    return opt


@pytest.mark.parametrize("options", [
    {"lr": 0.1},
    {"lr": 0.05, "momentum": 0.9},
    {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01},
    {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
])
def test_sgd_matches_torch(options):
    run_pair(SGD, torch.optim.SGD, options)


@pytest.mark.parametrize("options", [
    {"lr": 1e-2},
    {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1},
])
def test_adam_matches_torch(options):
    run_pair(Adam, torch.optim.Adam, options)


@pytest.mark.parametrize("options", [
    {"lr": 1e-2},
    {"lr": 1e-2, "betas": (0.9, 0.95), "weight_decay": 0.1},
])
@pytest.mark.parametrize("groups", [1, 2])
def test_adamw_matches_torch(options, groups):
    run_pair(AdamW, torch.optim.AdamW, options, n_groups=groups)


def test_adamw_with_schedule_matches_torch():
    run_pair(AdamW, torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1},
             lr_schedule=make_schedule("cosine", 1e-2, warmup_steps=10, max_steps=80, min_lr=1e-3))


@pytest.mark.parametrize("cls", [Adam, AdamW])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_builtin_update_equals_the_step_function(cls, dtype):
    """The optimizer's own update (temporaries in a reused scratch buffer) gives exactly what its readable
    step function (adam_step / adamw_step, called when another function is put in its place) gives."""
    rng = np.random.default_rng(0)
    shapes = [(5, 3), (7,), (2, 4, 3)]
    runs = []
    for replaced in (False, True):
        params = [Parameter(rng.standard_normal(s).astype(dtype)) for s in shapes]
        rng = np.random.default_rng(0)
        opt = cls(params, lr=1e-2, weight_decay=0.1)
        if replaced:
            own = opt.step_function
            opt.step_function = lambda *args: own(*args)
        grads = np.random.default_rng(1)
        for _ in range(5):
            for p in params:
                p.grad = grads.standard_normal(p.shape).astype(dtype)
            opt.step()
        runs.append([p.data.copy() for p in params])
    for a, b in zip(*runs):
        assert a.dtype == dtype
        np.testing.assert_array_equal(a, b)


def test_optimizer_state_roundtrip():
    opt = run_pair(AdamW, torch.optim.AdamW, {"lr": 1e-2})
    arrays, meta = opt.state_dict()
    params = opt.params
    opt2 = AdamW(params, lr=5.0)
    opt2.load_state_dict(arrays, meta)
    assert opt2.param_groups[0]["lr"] == 1e-2
    for p in params:
        for b in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(opt.state[id(p)][b], opt2.state[id(p)][b])
        assert opt.state[id(p)]["step"] == opt2.state[id(p)]["step"]
    with pytest.raises(ValueError, match="optimizer state is for AdamW, not SGD"):
        SGD(params).load_state_dict(arrays, meta)


def test_optimizer_option_errors():
    p = [Parameter(np.zeros(2))]
    with pytest.raises(ValueError, match=r"AdamW has no option\(s\) \['momentum'\]"):
        AdamW(p, momentum=0.9)
    with pytest.raises(ValueError, match="Nesterov"):
        SGD(p, nesterov=True)
    with pytest.raises(ValueError, match="betas"):
        Adam(p, betas=(1.0, 0.9))
    with pytest.raises(ValueError, match=r"betas must be a pair \(beta1, beta2\), got \(0.9,\)"):
        AdamW(p, betas=(0.9,))
    model = GPT(11, 8, n_layers=1, n_heads=2, d_model=8)
    with pytest.raises(TypeError, match=r"AdamW takes an iterable of Parameters .* got a GPT: pass model.parameters"):
        AdamW(model)
    with pytest.raises(TypeError, match="got a Parameter: pass"):
        AdamW(p[0])
    with pytest.raises(ValueError, match=r"parameter groups are dicts with a 'params' key .* \[\['lr', 'weights'\]\]"):
        AdamW([{"weights": p, "lr": 0.1}])
    AdamW(model.parameters())                                   # a generator, as torch's


def test_param_groups_exclude_biases_norms_embeddings():
    m = GPT(11, 8, n_layers=1, n_heads=2, d_model=8)
    groups = param_groups(m, 0.1, no_decay=("bias", "norm"))
    decay = {id(p) for p in groups[0]["params"]}
    named = dict(m.named_parameters())
    assert id(named["tok_emb.weight"]) in decay                 # nanoGPT decays embeddings
    assert id(named["blocks.0.ff.linear1.weight"]) in decay
    assert id(named["blocks.0.ff.linear1.bias"]) not in decay
    assert id(named["blocks.0.norm1.weight"]) not in decay
    assert groups[1]["weight_decay"] == 0.0
    groups = param_groups(m, 0.1, no_decay=("bias", "norm", "embedding"))
    decay = {id(p) for p in groups[0]["params"]}
    assert id(named["tok_emb.weight"]) not in decay and id(named["pos_emb.weight"]) not in decay
    assert sum(len(g["params"]) for g in groups) == len(named)


# -- schedules against torch.optim.lr_scheduler -------------------------------------------------
def torch_lrs(make, n, lr=1.0):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=lr)
    sched = make(opt)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return np.array(out)


def test_cosine_matches_torch():
    ours = make_schedule("cosine", 1.0, warmup_steps=0, max_steps=50, min_lr=0.1)
    ref = torch_lrs(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=50, eta_min=0.1), 50)
    np.testing.assert_allclose([ours(s) for s in range(50)], ref, rtol=1e-12)


def test_warmup_then_cosine_matches_torch():
    w, total = 10, 60
    ours = make_schedule("cosine", 1.0, warmup_steps=w, max_steps=total, min_lr=0.1)
    ref = torch_lrs(lambda o: torch.optim.lr_scheduler.SequentialLR(o, [
        torch.optim.lr_scheduler.LinearLR(o, start_factor=1 / (w + 1), total_iters=w),
        torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=total - w, eta_min=0.1)], milestones=[w]), total)
    np.testing.assert_allclose([ours(s) for s in range(total)], ref, rtol=1e-12)


def test_linear_decay_matches_torch():
    ours = make_schedule("linear", 1.0, warmup_steps=0, max_steps=40, min_lr=0.2)
    ref = torch_lrs(lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=1.0, end_factor=0.2,
                                                                total_iters=40), 45)
    np.testing.assert_allclose([ours(s) for s in range(45)], ref, rtol=1e-12)


def warmup_then(o, w, decay_piece, decay_steps=None, floor=None):
    """torch composition: nanoGPT's warmup (LinearLR from 1/(w+1)) for w steps, then ``decay_piece``;
    from ``decay_steps`` on, the constant ``floor`` (a factor of the base lr) when given."""
    sched = torch.optim.lr_scheduler
    pieces = [sched.LinearLR(o, start_factor=1 / (w + 1), end_factor=1.0, total_iters=w), decay_piece]
    milestones = [w]
    if floor is not None:
        pieces.append(sched.LambdaLR(o, lambda s: floor))
        milestones.append(decay_steps)
    return sched.SequentialLR(o, pieces, milestones=milestones)


def hand_warmup_linear(lr, w, decay_steps, min_lr):
    """The README's formula, written out: lr·(step+1)/(warmup+1), then a straight line to min_lr."""
    def f(s):
        if s < w:
            return lr * (s + 1) / (w + 1)
        if s >= decay_steps:
            return min_lr
        return lr - (lr - min_lr) * (s - w) / (decay_steps - w)
    return f


def hand_warmup_cosine(lr, w, decay_steps, min_lr):
    def f(s):
        if s < w:
            return lr * (s + 1) / (w + 1)
        if s >= decay_steps:
            return min_lr
        return min_lr + (lr - min_lr) * (1 + math.cos(math.pi * (s - w) / (decay_steps - w))) / 2
    return f


def test_warmup_then_linear_decay_matches_torch():
    lr, w, total, min_lr = 3e-3, 8, 50, 3e-4
    ours = make_schedule("linear", lr, warmup_steps=w, max_steps=total, min_lr=min_lr)
    n = total + 10                                          # past max_steps the floor holds
    ref = torch_lrs(lambda o: warmup_then(o, w, torch.optim.lr_scheduler.LinearLR(
        o, start_factor=1.0, end_factor=min_lr / lr, total_iters=total - w)), n, lr=lr)
    got = [ours(s) for s in range(n)]
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    np.testing.assert_allclose(got, [hand_warmup_linear(lr, w, total, min_lr)(s) for s in range(n)], rtol=1e-12)
    assert got[0] == pytest.approx(lr / (w + 1)) and got[w] == pytest.approx(lr)       # 1/(w+1) .. peak at w
    assert got[total] == min_lr and max(got) == pytest.approx(lr)


def test_constant_with_warmup_matches_torch():
    lr, w = 3e-4, 7
    ours = make_schedule("constant", lr, warmup_steps=w, max_steps=40)
    got = [ours(s) for s in range(40)]
    linear = torch_lrs(lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=1 / (w + 1), total_iters=w),
                       40, lr=lr)
    hand = torch_lrs(lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(s + 1, w + 1) / (w + 1)),
                     40, lr=lr)
    np.testing.assert_allclose(got, linear, rtol=1e-12)
    np.testing.assert_allclose(got, hand, rtol=1e-12)
    assert got[w - 1] < lr and got[w:] == [lr] * (40 - w)
    assert make_schedule("constant", lr, warmup_steps=0)(0) == lr


@pytest.mark.parametrize("name", ["linear", "cosine"])
@pytest.mark.parametrize("decay_steps", [30, 80])       # before max_steps: a floor to the end; after: never reached
def test_decay_steps_other_than_max_steps(name, decay_steps):
    lr, w, max_steps, min_lr = 1e-2, 5, 50, 1e-3
    ours = make_schedule(name, lr, warmup_steps=w, max_steps=max_steps, min_lr=min_lr, decay_steps=decay_steps)
    n = max(max_steps, decay_steps) + 5
    got = [ours(s) for s in range(n)]
    hand = {"linear": hand_warmup_linear, "cosine": hand_warmup_cosine}[name](lr, w, decay_steps, min_lr)
    np.testing.assert_allclose(got, [hand(s) for s in range(n)], rtol=1e-12)
    sched = torch.optim.lr_scheduler
    make_decay = {
        "linear": lambda o: sched.LinearLR(o, start_factor=1.0, end_factor=min_lr / lr, total_iters=decay_steps - w),
        "cosine": lambda o: sched.CosineAnnealingLR(o, T_max=decay_steps - w, eta_min=min_lr),
    }[name]
    ref = torch_lrs(lambda o: warmup_then(o, w, make_decay(o), decay_steps, floor=min_lr / lr), n, lr=lr)
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    default = make_schedule(name, lr, warmup_steps=w, max_steps=max_steps, min_lr=min_lr)
    assert got[decay_steps - 1] > min_lr and got[decay_steps] == min_lr
    if decay_steps < max_steps:
        assert got[decay_steps:max_steps] == [min_lr] * (max_steps - decay_steps)
        assert default(decay_steps) > min_lr                    # max_steps alone would still be decaying
    else:
        assert got[max_steps - 1] > default(max_steps - 1)      # training ends above the floor
        assert default(max_steps) == min_lr


def test_noam_matches_the_paper_and_torch():
    d, w = 512, 4000
    ours = make_schedule("noam", 1.0, warmup_steps=w, d_model=d)
    ref = torch_lrs(lambda o: torch.optim.lr_scheduler.LambdaLR(
        o, lambda s: d ** -0.5 * min((s + 1) ** -0.5, (s + 1) * w ** -1.5)), 100)
    np.testing.assert_allclose([ours(s) for s in range(100)], ref, rtol=1e-12)
    peak = max(ours(s) for s in range(10000))
    assert math.isclose(peak, d ** -0.5 * w ** -0.5, rel_tol=1e-12)   # the maximum is at step = warmup


def test_constant_and_errors():
    s = make_schedule("constant", 0.3, warmup_steps=2)
    np.testing.assert_allclose([s(i) for i in range(4)], [0.1, 0.2, 0.3, 0.3], rtol=1e-15)
    with pytest.raises(ValueError, match="unknown schedule 'step'"):
        make_schedule("step", 1.0)


def test_clip_grad_norm_matches_torch():
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((3, 4)) * 5, rng.standard_normal(7)]
    ours = [Parameter(np.zeros_like(a)) for a in arrays]
    theirs = [torch.zeros(a.shape, dtype=torch.float64, requires_grad=True) for a in arrays]
    for p, t, a in zip(ours, theirs, arrays):
        p.grad = a.copy()
        t.grad = torch.tensor(a.copy())
    norm = clip_grad_norm(ours, 1.0)
    tnorm = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert math.isclose(norm, float(tnorm), rel_tol=1e-12)
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.grad, t.grad.numpy(), rtol=1e-12)
    assert math.isclose(clip_grad_norm(ours, 0), 1.0, rel_tol=1e-5)     # measuring only
