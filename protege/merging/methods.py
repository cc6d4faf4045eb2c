"""Merge methods as pure tensor functions, one tensor name at a time, with mergekit's semantics.

The rules follow mergekit 0.1.5 (arcee-ai/mergekit, `mergekit/merge_methods/*.py` and `mergekit/sparsify.py`);
each docstring names the file that decided it. Every function takes the tensors of ONE tensor name:

- `tensors`: the models' tensors for that name, a list of K tensors of one shape S, or one stacked tensor [K, *S];
- `base`: the base model's tensor [*S] where the method has one;
- per-model parameters (`weights`, `densities`, `gammas`): a number for all K, or K numbers in model order;
- `generator`: a `torch.Generator` for the random methods (DARE).

The task-arithmetic family (task_arithmetic, ties, dare_linear, dare_ties, breadcrumbs, breadcrumbs_ties) also
accepts task vectors directly: with `base=None` the `tensors` ARE the task vectors d_k = m_k - base and the merged
task vector is returned (the in-RL merged teacher uses this form); with a base it returns base + merged task vector.

Arithmetic runs in the inputs' floating dtype (the streaming merger casts them to float32 or the config's
`dtype` first). `merge_tensor` is the uniform entry point used by the file merger and `merge_state_dicts`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

TensorsLike = "Sequence[torch.Tensor] | torch.Tensor"
NumbersLike = "float | Sequence[float] | torch.Tensor"

# mergekit/merge_methods/slerp.py: |cos| above this -> plain linear interpolation
SLERP_DOT_THRESHOLD = 0.9995
SLERP_EPS = 1e-8


# ---------------------------------------------------------------- helpers

def _per_model(values, k: int, name: str) -> list[float]:
    """A number for all k models, or k numbers (list or 1-D tensor)."""
    if isinstance(values, torch.Tensor):
        values = values.reshape(-1).tolist() if values.dim() else float(values)
    if isinstance(values, (int, float)):
        return [float(values)] * k
    values = [float(v) for v in values]
    if len(values) != k:
        raise ValueError(f"{name}: expected {k} values (one per model), got {len(values)}")
    return values


def _as_list(tensors) -> list:
    """The caller's list itself (so `consume` can drop its entries), or a list of a stacked tensor's rows."""
    if isinstance(tensors, torch.Tensor):
        return list(tensors.unbind(0))
    if isinstance(tensors, list):
        if not tensors:
            raise ValueError("no tensors to merge")
        return tensors
    return _as_list(list(tensors))


# elementwise work on [K, n] is done CHUNK columns at a time, so its temporaries stay small
CHUNK = 1 << 22


def _float_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------- linear

def linear(tensors, weights, normalize: bool = True, consume: bool = False) -> torch.Tensor:
    """Weighted average: sum_k w_k m_k, divided by sum_k w_k when `normalize` (mergekit's default: true).

    tensors: K tensors of shape S (or [K, *S]); weights: K numbers. Returns shape S in the inputs' dtype,
    accumulated in float32 (float64 for float64 inputs) as mergekit/merge_methods/linear.py does.
    A zero weight sum with normalize=True is an error (mergekit would divide by zero).
    consume: `tensors` is a list the function may empty as it goes (each input is freed once added).
    """
    xs = _as_list(tensors)
    k = len(xs)
    w = _per_model(weights, k, "weight")
    dtype = _float_dtype(xs[0])
    in_dtype = xs[0].dtype
    out = torch.zeros(xs[0].shape, dtype=dtype)
    for i in range(k):
        x = xs[i]
        if consume:
            xs[i] = None
        out.add_(x.to(dtype), alpha=w[i])
        del x
    if normalize:
        total = torch.tensor(w, dtype=dtype).sum()
        if total == 0:
            raise ValueError("linear: the weights sum to 0, so normalize: true cannot divide by them")
        out.div_(total)
    return out.to(in_dtype)


# ---------------------------------------------------------------- sparsification (mergekit/sparsify.py)

def _rescale_l1(tensor: torch.Tensor, masked: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """masked * (|tensor|_1 / |masked|_1), unless either norm is below eps (then masked unchanged)."""
    before = tensor.abs().sum()
    after = masked.abs().sum()
    if before < eps or after < eps:
        return masked
    return masked * (before / after)


def magnitude_prune(delta: torch.Tensor, density: float, rescale: bool = False) -> torch.Tensor:
    """Keep the k = max(1, int(density * n)) largest-|.| entries, zero the rest (TIES trim).

    density >= 1 returns `delta` unchanged; density <= 0 (or an empty tensor) returns zeros. The order among
    equal magnitudes is torch.argsort's, as in mergekit's `magnitude`. `rescale`: L1 rescale (see _rescale_l1).
    """
    if density >= 1:
        return delta
    if density <= 0 or delta.numel() == 0:
        return torch.zeros_like(delta)
    k = max(1, int(density * delta.numel()))
    mask = torch.zeros(delta.numel(), dtype=delta.dtype)
    mask[torch.argsort(delta.abs().reshape(-1).float(), descending=True)[:k]] = 1
    masked = delta * mask.reshape(delta.shape)
    return _rescale_l1(delta, masked) if rescale else masked


def magnitude_outliers_prune(delta: torch.Tensor, density: float, gamma: float = 0.01,
                             rescale: bool = False) -> torch.Tensor:
    """Model Breadcrumbs: drop the int(gamma * n) largest-|.| entries and the smallest ones so that
    target = int(density * n) entries remain; when n - target - top < 0 fewer outliers are dropped.

    With entries sorted by |.| ascending, kept = sorted[n_bot : n_bot + target], n_bot = max(0, n - target - top)
    (mergekit 0.1.5 `magnitude_outliers`). density >= 1 returns `delta` unchanged.
    """
    if density >= 1:
        return delta
    n = delta.numel()
    target = int(density * n)
    n_top = int(gamma * n)
    n_bot = max(0, n - target - n_top)
    order = torch.sort(delta.abs().reshape(-1).float(), descending=False).indices
    mask = torch.zeros(n, dtype=delta.dtype)
    mask[order[n_bot:n_bot + target]] = 1
    masked = delta * mask.reshape(delta.shape)
    return _rescale_l1(delta, masked) if rescale else masked


def bernoulli_prune(delta: torch.Tensor, density: float, rescale: bool = True,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """DARE drop: keep each entry with probability `density` (mask ~ Bernoulli(density), drawn from
    `generator`), then, when `rescale`, multiply by |delta|_1 / |masked|_1 — mergekit's L1 rescale
    (mergekit 0.1.5 `bernoulli` + `rescaled_masked_tensor`), NOT the paper's 1/density.

    density >= 1 returns `delta` unchanged and draws nothing from the generator. The mask is drawn in float32
    (bfloat16 stays bfloat16), as mergekit does on CPU.
    """
    if density >= 1:
        return delta
    work = delta.dtype if delta.dtype == torch.bfloat16 else torch.float32
    mask = torch.bernoulli(torch.full(delta.shape, density, dtype=work), generator=generator)
    d = delta.to(work)
    masked = d * mask
    out = _rescale_l1(d, masked) if rescale else masked
    return out.to(delta.dtype)


# ---------------------------------------------------------------- task arithmetic family

def sign_consensus_mask(deltas: torch.Tensor, method: str = "sum") -> torch.Tensor:
    """TIES sign election over stacked (already weighted) task vectors [K, *S] -> bool mask [K, *S].

    `sum`: the elected sign is that of sum_k delta_k (>= 0 counts as +); `count`: the sign held by more models
    (ties count as +). An entry votes for the merge when its sign equals the elected one, so zeros never do.
    (mergekit/merge_methods/generalized_task_arithmetic.py `get_mask`.)
    """
    sign = deltas.sign()
    if method == "sum":
        elected = (deltas.sum(dim=0) >= 0).to(deltas.dtype) * 2 - 1
    elif method == "count":
        elected = (sign.sum(dim=0) >= 0).to(deltas.dtype) * 2 - 1
    else:
        raise ValueError(f"unknown consensus method {method!r}; expected sum or count")
    return sign == elected


def generalized_task_arithmetic(tensors, weights, densities=1.0, *, base: torch.Tensor | None = None,
                                sparsification: str | None = None, consensus: str | None = None,
                                normalize: bool = False, rescale: bool = False, lambda_: float = 1.0,
                                gammas=0.01, generator: torch.Generator | None = None,
                                consume: bool = False) -> torch.Tensor:
    """The rule shared by task_arithmetic, ties, dare_*, breadcrumbs* (mergekit's GeneralizedTaskArithmeticMerge).

    d_k = m_k - base (or tensors[k] itself when base is None), k = 1..K, shape S.
    1. sparsify each d_k: `magnitude` (density), `random` (DARE, density, generator), `magnitude_outliers`
       (density, gamma) or none; `rescale` = L1 rescale of each sparsified d_k.
    2. weight: d_k <- w_k d_k.
    3. with a consensus (`sum`/`count`): mask_k = sign(d_k) == elected sign; merged = sum_k mask_k d_k,
       divisor = sum_k mask_k w_k (0 -> 1), elementwise;
       without: merged = sum_k d_k, divisor = sum_k w_k (|.| < 1e-8 -> 1).
    4. merged /= divisor if `normalize`; merged *= lambda_.
    Returns base + merged in the base's dtype, or merged when base is None.
    consume: `tensors` is a list the function may empty and overwrite as it goes, so the peak memory is the
    K task vectors plus a few tensors of shape S, not inputs and task vectors both.
    """
    xs = _as_list(tensors)
    k = len(xs)
    w = _per_model(weights, k, "weight")
    dens = _per_model(densities, k, "density")
    gam = _per_model(gammas, k, "gamma")
    shape = xs[0].shape
    dtype = base.dtype if base is not None else xs[0].dtype
    deltas = torch.empty((k, *shape), dtype=dtype)
    for i in range(k):
        x = xs[i]
        if consume:
            xs[i] = None
        if base is not None:
            d = x.sub_(base) if consume and x.dtype == dtype else x - base
        else:
            d = x.to(dtype)
        del x
        if sparsification == "magnitude":
            d = magnitude_prune(d, dens[i], rescale)
        elif sparsification == "random":
            d = bernoulli_prune(d, dens[i], rescale, generator)
        elif sparsification == "magnitude_outliers":
            d = magnitude_outliers_prune(d, dens[i], gam[i], rescale)
        elif sparsification is not None:
            raise ValueError(f"unknown sparsification {sparsification!r}")
        deltas[i] = d
        del d
    flat = deltas.view(k, -1)
    n = flat.shape[1]
    wt = torch.tensor(w, dtype=dtype).reshape(k, 1)
    merged = torch.empty(n, dtype=dtype)
    if not consensus:
        divisor = wt.sum(dim=0)
        divisor[divisor.abs() < 1e-8] = 1
    step = max(1, CHUNK // k)
    for s in range(0, n, step):
        c = flat[:, s:s + step]
        c.mul_(wt)
        if consensus:
            mask = sign_consensus_mask(c, consensus)
            m = (c * mask).sum(dim=0)
            div = (wt * mask).sum(dim=0)
            div[div == 0] = 1
            del mask
        else:
            m = c.sum(dim=0)
            div = divisor
        if normalize:
            m /= div
        if lambda_ != 1:
            m *= lambda_
        merged[s:s + step] = m
        del m, div, c
    del deltas, flat
    merged = merged.view(shape)
    if base is None:
        return merged
    return (base + merged).to(base.dtype)


def task_arithmetic(tensors, weights, *, base: torch.Tensor | None = None, lambda_: float = 1.0,
                    normalize: bool = False) -> torch.Tensor:
    """base + lambda * sum_k w_k (m_k - base); with normalize (default FALSE, as in mergekit's registry)
    the sum is divided by sum_k w_k. See generalized_task_arithmetic."""
    return generalized_task_arithmetic(tensors, weights, base=base, normalize=normalize, lambda_=lambda_)


def ties(tensors, weights, density=1.0, *, base: torch.Tensor | None = None, normalize: bool = True,
         lambda_: float = 1.0, consensus: str = "sum", rescale: bool = False) -> torch.Tensor:
    """TIES: trim each task vector to its `density` largest-|.| entries, elect the sign of sum_k w_k d_k
    (consensus `sum`; `count` = majority of signs), then the disjoint weighted mean
    sum_k [agree_k] w_k d_k / sum_k [agree_k] w_k (normalize default TRUE), times lambda_.

    `ties(task_vectors [K, *S], weights [K], density)` returns the merged task vector (base=None).
    """
    return generalized_task_arithmetic(tensors, weights, density, base=base, sparsification="magnitude",
                                       consensus=consensus, normalize=normalize, rescale=rescale, lambda_=lambda_)


def dare_linear(tensors, weights, density=1.0, *, base: torch.Tensor | None = None,
                generator: torch.Generator | None = None, normalize: bool = False, rescale: bool = True,
                lambda_: float = 1.0) -> torch.Tensor:
    """DARE then task arithmetic: each d_k keeps entries with probability density, L1-rescaled (rescale default
    TRUE), then base + lambda * sum_k w_k d_k (normalize default FALSE). density 1 = task arithmetic."""
    return generalized_task_arithmetic(tensors, weights, density, base=base, sparsification="random",
                                       normalize=normalize, rescale=rescale, lambda_=lambda_, generator=generator)


def dare_ties(tensors, weights, density=1.0, *, base: torch.Tensor | None = None,
              generator: torch.Generator | None = None, normalize: bool = False, rescale: bool = True,
              lambda_: float = 1.0, consensus: str = "sum") -> torch.Tensor:
    """DARE drop + L1 rescale (default true), TIES sign election (`sum`), masked sum; normalize default FALSE
    (mergekit's registry), so the result is base + lambda * sum_k [agree_k] w_k d_k."""
    return generalized_task_arithmetic(tensors, weights, density, base=base, sparsification="random",
                                       consensus=consensus, normalize=normalize, rescale=rescale,
                                       lambda_=lambda_, generator=generator)


def breadcrumbs(tensors, weights, density=1.0, gamma=0.01, *, base: torch.Tensor | None = None,
                normalize: bool = False, rescale: bool = False, lambda_: float = 1.0) -> torch.Tensor:
    """Model Breadcrumbs: each d_k loses its int(gamma n) largest and its smallest entries (see
    magnitude_outliers_prune), then base + lambda * sum_k w_k d_k (normalize and rescale default FALSE)."""
    return generalized_task_arithmetic(tensors, weights, density, base=base, sparsification="magnitude_outliers",
                                       gammas=gamma, normalize=normalize, rescale=rescale, lambda_=lambda_)


def breadcrumbs_ties(tensors, weights, density=1.0, gamma=0.01, *, base: torch.Tensor | None = None,
                     normalize: bool = False, rescale: bool = False, lambda_: float = 1.0,
                     consensus: str = "sum") -> torch.Tensor:
    """Breadcrumbs sparsification + TIES sign election (`sum`); normalize default FALSE (mergekit's registry)."""
    return generalized_task_arithmetic(tensors, weights, density, base=base, sparsification="magnitude_outliers",
                                       gammas=gamma, consensus=consensus, normalize=normalize, rescale=rescale,
                                       lambda_=lambda_)


# ---------------------------------------------------------------- slerp

def slerp(t: float, v0: torch.Tensor, v1: torch.Tensor, dot_threshold: float = SLERP_DOT_THRESHOLD,
          eps: float = SLERP_EPS) -> torch.Tensor:
    """Spherical interpolation between v0 (the base model, t=0) and v1 (t=1), over the whole flattened tensor.

    cos = <v0/|v0|, v1/|v1|> (a norm <= eps counts as 1), clamped to [-1, 1]; theta = acos(cos);
    result = sin((1-t) theta)/sin(theta) v0 + sin(t theta)/sin(theta) v1, or (1-t) v0 + t v1 when
    |cos| > 0.9995 (colinear or antipodal) or the tensor is empty. Computed in float32 (float64 for float64),
    returned in v0's dtype (mergekit/merge_methods/slerp.py).
    """
    dtype = _float_dtype(v0)
    a = v0.reshape(-1).to(dtype)
    b = v1.reshape(-1).to(dtype)
    if a.numel() == 0:
        return ((1 - t) * a + t * b).reshape(v0.shape).to(v0.dtype)
    na = torch.linalg.vector_norm(a)
    nb = torch.linalg.vector_norm(b)
    na = na if na > eps else torch.ones((), dtype=dtype)
    nb = nb if nb > eps else torch.ones((), dtype=dtype)
    dot = float(((a / na) * (b / nb)).sum().clamp(-1, 1))
    if abs(dot) > dot_threshold:
        ca, cb = 1 - t, t
    else:
        theta = math.acos(dot)
        s = math.sin(theta)
        ca, cb = math.sin((1 - t) * theta) / s, math.sin(t * theta) / s
    return (ca * a + cb * b).reshape(v0.shape).to(v0.dtype)


# ---------------------------------------------------------------- model stock

def model_stock(tensors, base: torch.Tensor, filter_wise: bool = False, consume: bool = False) -> torch.Tensor:
    """Model Stock (mergekit/merge_methods/model_stock.py); needs the base and K >= 2 models.

    offsets o_k = m_k - base; cos = mean over pairs i<j of <o_i, o_j> / max(|o_i| |o_j|, 1e-6), clamped to
    [-1, 1]; t = K cos / (1 + (K-1) cos) (t = 0 where |1 + (K-1) cos| < 1e-6);
    result = t * mean_k m_k + (1 - t) * base.
    Whole tensor flattened by default; `filter_wise`: one cos/t per row (reduced over the last dim; a 1-D
    tensor is one row). consume: `tensors` is a list whose tensors may be overwritten (by the offsets).
    """
    ws = _as_list(tensors)
    if len(ws) < 2:
        raise ValueError("model_stock needs at least 2 models besides the base")
    shape = base.shape
    if filter_wise:
        w0 = base.unsqueeze(0) if base.dim() == 1 else base
        ws = [w.unsqueeze(0) if base.dim() == 1 else w for w in ws]
    else:
        w0 = base.reshape(-1)
        ws = [w.reshape(-1) for w in ws]
    k = len(ws)
    average = ws[0] + 0  # the mean first (as sum(ws) / k), so the inputs can then become the offsets
    for w in ws[1:]:
        average += w
    average /= k
    offsets = [w.sub_(w0) if consume else w - w0 for w in ws]
    del ws
    cos = []
    for i, oa in enumerate(offsets):
        for ob in offsets[i + 1:]:
            norm = torch.norm(oa, dim=-1) * torch.norm(ob, dim=-1)
            cos.append(((oa * ob).sum(dim=-1) / norm.clamp(min=1e-6)).clamp(-1, 1))
    del offsets
    cos_theta = torch.stack(cos).mean(dim=0).unsqueeze(-1)
    denom = 1 + (k - 1) * cos_theta
    singular = denom.abs() < 1e-6
    t = torch.where(singular, torch.zeros_like(cos_theta),
                    (k * cos_theta) / torch.where(singular, torch.ones_like(denom), denom))
    return (t * average + (1 - t) * w0).reshape(shape)


# ---------------------------------------------------------------- passthrough

def passthrough(tensors, scale: float | None = None) -> torch.Tensor:
    """The one input unchanged, or times `scale` (mergekit/merge_methods/passthrough.py): frankenmerges stack
    layers of several models with one passthrough slice per layer range."""
    xs = _as_list(tensors)
    if len(xs) != 1:
        raise ValueError(f"passthrough takes exactly one input, got {len(xs)}")
    return xs[0] if scale is None else xs[0] * scale


# ---------------------------------------------------------------- ema (not a mergekit method)

def ema(prev: torch.Tensor, current: torch.Tensor, alpha: float) -> torch.Tensor:
    """Exponential moving average for in-RL merging: M = (1 - alpha) M_prev + alpha c, alpha in [0, 1]."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"ema: alpha must be in [0, 1], got {alpha}")
    return (1 - alpha) * prev + alpha * current.to(prev.dtype)


# ---------------------------------------------------------------- registry + uniform entry point

REQUIRED = object()


@dataclass(frozen=True)
class MethodInfo:
    """What a method takes (mergekit's ParameterSpec/InputContract for it).

    per_model: parameters bound to each input (non-base inputs, or every input when `per_input_includes_base`),
    with defaults (REQUIRED = no default); shared: parameters set once (top-level `parameters:`).
    min_inputs/max_inputs count the base too, as mergekit's InputContract does.
    """
    name: str
    needs_base: bool
    per_model: dict = field(default_factory=dict)
    shared: dict = field(default_factory=dict)
    min_inputs: int = 1
    max_inputs: int | None = None
    per_input_includes_base: bool = False
    random: bool = False


def _gta_info(name: str, normalize: bool, rescale: bool, gamma: bool = False, random: bool = False) -> MethodInfo:
    per_model = {"weight": REQUIRED, "density": 1.0}
    if gamma:
        per_model["gamma"] = 0.01
    return MethodInfo(name, needs_base=True, per_model=per_model,
                      shared={"int8_mask": False, "normalize": normalize, "rescale": rescale, "lambda": 1.0},
                      random=random)


# defaults from mergekit/merge_methods/registry.py (GeneralizedTaskArithmeticMerge instances), linear.py,
# slerp.py and model_stock.py
METHODS: dict[str, MethodInfo] = {
    "linear": MethodInfo("linear", needs_base=False, per_model={"weight": REQUIRED}, shared={"normalize": True},
                         per_input_includes_base=True),
    "task_arithmetic": _gta_info("task_arithmetic", normalize=False, rescale=False),
    "ties": _gta_info("ties", normalize=True, rescale=False),
    "dare_linear": _gta_info("dare_linear", normalize=False, rescale=True, random=True),
    "dare_ties": _gta_info("dare_ties", normalize=False, rescale=True, random=True),
    "breadcrumbs": _gta_info("breadcrumbs", normalize=False, rescale=False, gamma=True),
    "breadcrumbs_ties": _gta_info("breadcrumbs_ties", normalize=False, rescale=False, gamma=True),
    "slerp": MethodInfo("slerp", needs_base=True, shared={"t": REQUIRED}, min_inputs=2, max_inputs=2),
    "model_stock": MethodInfo("model_stock", needs_base=True, shared={"filter_wise": False}, min_inputs=3),
    # mergekit/merge_methods/passthrough.py: one input, copied (times `scale` when given); the frankenmerge method
    "passthrough": MethodInfo("passthrough", needs_base=False, per_model={"scale": None}, min_inputs=1,
                              max_inputs=1, per_input_includes_base=True),
}

_GTA = {  # name -> (sparsification, consensus)
    "task_arithmetic": (None, None),
    "ties": ("magnitude", "sum"),
    "dare_linear": ("random", None),
    "dare_ties": ("random", "sum"),
    "breadcrumbs": ("magnitude_outliers", None),
    "breadcrumbs_ties": ("magnitude_outliers", "sum"),
}


def method_info(name: str) -> MethodInfo:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown merge method {name!r}; expected one of {', '.join(sorted(METHODS))}") from None


def with_defaults(info: MethodInfo, shared: dict | None, per_model: list[dict] | None) -> tuple[dict, list[dict]]:
    """Fills defaults; raises ValueError naming a missing required parameter."""
    out_shared = {}
    for key, default in info.shared.items():
        value = (shared or {}).get(key, default)
        if value is REQUIRED:
            raise ValueError(f"{info.name}: parameter {key!r} is required")
        out_shared[key] = value
    out_models = []
    for i, params in enumerate(per_model or []):
        row = {}
        for key, default in info.per_model.items():
            value = params.get(key, default)
            if value is REQUIRED:
                raise ValueError(f"{info.name}: parameter {key!r} is required for model {i}")
            row[key] = value
        out_models.append(row)
    return out_shared, out_models


def merge_tensor(method: str, tensors: list[torch.Tensor], base: torch.Tensor | None,
                 per_model: list[dict], shared: dict | None = None,
                 generator: torch.Generator | None = None, consume: bool = False) -> torch.Tensor:
    """Merges one tensor name. `tensors`: the non-base models' tensors (every input for linear);
    `per_model`: one dict of resolved numbers per entry of `tensors`; `shared`: the shared parameters;
    missing ones take the method's defaults. Non-float tensors (int buffers) take the base's value
    (or the first model's). Returns a tensor of the inputs' shape. consume: the list `tensors` (not `base`)
    may be emptied and its tensors overwritten, to bound the peak memory (the streaming merger's case)."""
    info = method_info(method)
    shared, per_model = with_defaults(info, shared, per_model)
    if len(per_model) != len(tensors):
        raise ValueError(f"{method}: {len(tensors)} tensors but {len(per_model)} parameter sets")
    ref = base if base is not None else tensors[0]
    if not ref.is_floating_point():
        return ref.clone()
    if info.needs_base and base is None:
        raise ValueError(f"{method} needs a base tensor")
    col = lambda key: [p[key] for p in per_model]  # noqa: E731
    if method == "linear":
        return linear(tensors, col("weight"), normalize=bool(shared["normalize"]), consume=consume)
    if method in _GTA:
        sparsification, consensus = _GTA[method]
        return generalized_task_arithmetic(
            tensors, col("weight"), col("density"), base=base, sparsification=sparsification,
            consensus=consensus, normalize=bool(shared["normalize"]), rescale=bool(shared["rescale"]),
            lambda_=float(shared["lambda"]), gammas=col("gamma") if "gamma" in info.per_model else 0.01,
            generator=generator, consume=consume)
    if method == "slerp":
        if len(tensors) != 1:
            raise ValueError(f"slerp merges the base with exactly one other model, got {len(tensors)}")
        return slerp(float(shared["t"]), base, tensors[0])
    if method == "model_stock":
        return model_stock(tensors, base, filter_wise=bool(shared["filter_wise"]), consume=consume)
    if method == "passthrough":
        return passthrough(tensors, per_model[0]["scale"])
    raise AssertionError(method)
