"""DARE's drop masks through the whole file merge: each model's kept fraction is Binomial(n, density) on every
tensor (1-D norms and tiny tensors included), the models' masks are independent, and the masks are the ones
mergekit draws for the same seed (one generator, tensors in sorted-name order, models in config order).

The checkpoints make each model's mask readable from the output: base entries are multiples of 1/8 and model k
is base + 2^k everywhere, so with rescale off the merged task vector is sum_k mask_k 2^k, exactly, and its
bits are the masks."""
import json
import math

import pytest
import torch
import yaml
from safetensors.torch import save_file

from protege.merging import merge_folders, merge_state_dicts
from protege.merging.io import Checkpoint

LAYERS = 12  # more than 10: sorted names (layers.10 < layers.2) differ from the layer order


def shapes() -> dict[str, tuple[int, ...]]:
    out = {"model.embed_tokens.weight": (32, 16), "model.norm.weight": (16,), "lm_head.weight": (32, 16)}
    for i in range(LAYERS):
        out[f"model.layers.{i}.input_layernorm.weight"] = (16,)
        out[f"model.layers.{i}.self_attn.q_proj.weight"] = (16, 16)
        out[f"model.layers.{i}.self_attn.k_proj.bias"] = (4,)
        out[f"model.layers.{i}.layer_scale"] = (1,)
    return out


def save_sharded(state: dict[str, torch.Tensor], folder) -> None:
    """Two shards, tensors dealt alternately, so the files' order is not the names' order."""
    folder.mkdir()
    names = list(state)
    weight_map = {}
    for s in range(2):
        part = {n: state[n] for n in names[s::2]}
        fname = f"model-0000{s + 1}-of-00002.safetensors"
        save_file(part, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("dare")
    g = torch.Generator().manual_seed(0)
    base = {n: torch.randint(-8, 9, s, generator=g).float() / 8 for n, s in shapes().items()}
    save_sharded(base, root / "base")
    out = {"base": root / "base"}
    for k in range(3):
        out[f"m{k}"] = root / f"m{k}"
        out[f"m{k}"].mkdir()
        save_file({n: t + 2 ** k for n, t in base.items()}, str(out[f"m{k}"] / "model.safetensors"))
    return out


def dare_config(tmp_path, folders, method, densities, rescale=False, name="merge.yaml"):
    data = {"merge_method": method, "base_model": str(folders["base"]), "parameters": {"rescale": rescale},
            "models": [{"model": str(folders[f"m{k}"]), "parameters": {"weight": 1.0, "density": d}}
                       for k, d in enumerate(densities)]}
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def sd(folder) -> dict[str, torch.Tensor]:
    ck = Checkpoint(folder)
    return {n: ck.get(n) for n in ck.names()}


def masks(out: dict[str, torch.Tensor], base: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """Model k's mask per tensor, read from bit k of the merged task vector."""
    res = {}
    for n, t in out.items():
        code = (t - base[n]).round().to(torch.int64)
        assert torch.equal(code.float(), t - base[n]), n  # exactly a sum of powers of two: nothing else mixed in
        res[n] = ((code >> k) & 1).bool()
    return res


def within(kept: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(kept / n - p) <= sigmas * math.sqrt(p * (1 - p) / n) + 1e-12


@pytest.mark.parametrize("method", ["dare_linear", "dare_ties"])
def test_kept_fraction_is_binomial_on_every_tensor(tmp_path, folders, method):
    densities = [0.5, 0.3, 0.8]
    cfg = dare_config(tmp_path, folders, method, densities)
    base = sd(folders["base"])
    totals = {k: [0, 0] for k in range(3)}       # kept, entries over the 1-D tensors of every seed
    both = [0, 0]                                # models 0 and 1 both kept, entries
    for seed in range(8):
        merge_folders(cfg, tmp_path / f"out{seed}", seed=seed)
        out = sd(tmp_path / f"out{seed}")
        got = [masks(out, base, k) for k in range(3)]
        for k, p in enumerate(densities):
            for n, m in got[k].items():
                assert within(int(m.sum()), m.numel(), p), (seed, k, n, m.float().mean().item())
                if m.dim() == 1:
                    totals[k][0] += int(m.sum())
                    totals[k][1] += m.numel()
        for n in got[0]:
            both[0] += int((got[0][n] & got[1][n]).sum())
            both[1] += got[0][n].numel()
        # a generator reseeded per tensor (or per model) would repeat a mask: every q_proj mask is new
        qs = [got[0][f"model.layers.{i}.self_attn.q_proj.weight"] for i in range(LAYERS)]
        assert len({tuple(q.reshape(-1).tolist()) for q in qs}) == LAYERS
    for k, p in enumerate(densities):  # 8 seeds x 268 entries: 5 sigma is about +-0.05 at p = 0.5
        kept, n = totals[k]
        assert n == 8 * (16 + LAYERS * (16 + 4 + 1)) and within(kept, n, p), (k, kept / n)
    assert within(both[0], both[1], densities[0] * densities[1])  # independent masks: p0 * p1, not min(p0, p1)


def mergekit_masks(densities, seed: int) -> dict[str, list[torch.Tensor]]:
    """mergekit 0.1.5's draws: one generator (its global one, seeded by --random-seed), output tensors in the
    order of its schedule (sorted names), then each non-base model in config order; density 1 draws nothing."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(shapes()):
        row = []
        for d in densities:
            if d >= 1:
                row.append(torch.ones(shapes()[name], dtype=torch.bool))
            else:
                row.append(torch.bernoulli(torch.full(shapes()[name], d), generator=g).bool())
        out[name] = row
    return out


@pytest.mark.parametrize("method", ["dare_linear", "dare_ties"])
def test_masks_are_mergekits_for_the_seed(tmp_path, folders, method):
    densities = [0.5, 1.0, 0.3]
    cfg = dare_config(tmp_path, folders, method, densities)
    merge_folders(cfg, tmp_path / "out", seed=7, max_shard_bytes=3000)
    out, base = sd(tmp_path / "out"), sd(folders["base"])
    want = mergekit_masks(densities, seed=7)
    for k in range(3):
        got = masks(out, base, k)
        for n in want:
            assert torch.equal(got[n], want[n][k]), (k, n)


def test_rescale_keeps_the_mask_and_state_dicts_draw_alike(tmp_path, folders):
    densities = [0.5, 0.3, 0.8]
    merge_folders(dare_config(tmp_path, folders, "dare_linear", densities), tmp_path / "plain", seed=3)
    merge_folders(dare_config(tmp_path, folders, "dare_linear", densities, rescale=True, name="r.yaml"),
                  tmp_path / "rescaled", seed=3)
    plain, rescaled, base = sd(tmp_path / "plain"), sd(tmp_path / "rescaled"), sd(folders["base"])
    for n in plain:
        assert torch.equal(plain[n] != base[n], rescaled[n] != base[n]), n
    # the in-memory merge draws in the same order from the same seed: the same tensors
    states = [sd(folders[f"m{k}"]) for k in range(3)]
    mem = merge_state_dicts("dare_linear", states, base, {"weight": 1.0, "density": densities, "rescale": False},
                            generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(mem[n], plain[n]) for n in plain)
