"""protege merge vs mergekit on the same YAML: the max |difference| of every tensor, per method.

Builds tiny 12-layer Qwen2 checkpoints (a random base, saved sharded, and three "fine-tunes" = base + small
noise, one saved sharded), writes one mergekit YAML per case (each method on the models: form; slices with
per-slice / per-source parameters, gradients and filters; a passthrough frankenmerge), runs `protege merge`
(this interpreter) and `mergekit-yaml` (another venv) on it, and compares the outputs tensor by tensor and
their config.json's num_hidden_layers. Every case must agree to float32 rounding, DARE at density 0.5 too:
at the same seed protege draws its masks in mergekit's order (protege.merging.plan); statistics of the task
vector are printed for those cases as well.

    .venv/bin/python benchmarks/mergekit_parity.py --mergekit /work/mergekit-venv/bin/mergekit-yaml [--only ties,slerp]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=12, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)


def build_checkpoints(root: Path) -> dict[str, Path]:
    """base + a, b, c (= base + N(0, 0.02) noise each, different seeds); base and c are sharded (max_shard_size
    20KB), so the file order is not the name order; bfloat16 copies of base, a and b."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    root.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    base = Qwen2ForCausalLM(Qwen2Config(**TINY))
    out = {"base": root / "base"}
    base.save_pretrained(out["base"], max_shard_size="20KB")
    for i, name in enumerate(("a", "b", "c"), start=1):
        g = torch.Generator().manual_seed(i)
        model = Qwen2ForCausalLM(Qwen2Config(**TINY))
        with torch.no_grad():
            for (n, p), (_, q) in zip(model.named_parameters(), base.named_parameters()):
                p.copy_(q + 0.02 * torch.randn(q.shape, generator=g))
        out[name] = root / name
        model.save_pretrained(out[name], **({"max_shard_size": "20KB"} if name == "c" else {}))
        if name in ("a", "b"):  # bfloat16 copies: magnitudes tie often, so the ranking's tie order matters
            model.to(torch.bfloat16).save_pretrained(root / f"{name}_bf16")
            out[f"{name}_bf16"] = root / f"{name}_bf16"
    base.to(torch.bfloat16).save_pretrained(root / "base_bf16")
    out["base_bf16"] = root / "base_bf16"
    return out


def configs(c: dict[str, Path]) -> dict[str, dict]:
    """One mergekit YAML per case; `random: True` marks the cases compared by statistics only."""
    p = {k: str(v) for k, v in c.items()}
    three = lambda params: [{"model": p[m], "parameters": params[i]} for i, m in enumerate("abc")]  # noqa: E731
    gta = lambda method, params, top=None, **kw: {  # noqa: E731
        "merge_method": method, "base_model": p["base"], "models": three(params), "parameters": top or {}, **kw}
    dens = lambda d: [{"weight": 1.0, "density": d}, {"weight": 0.5, "density": d},  # noqa: E731
                      {"weight": [0.2, 0.9], "density": d}]
    return {
        "linear": {"merge_method": "linear", "models": [
            {"model": p["a"], "parameters": {"weight": 1.0}},
            {"model": p["b"], "parameters": {"weight": [{"filter": "self_attn", "value": 2.0}, {"value": 0.5}]}},
            {"model": p["c"], "parameters": {"weight": [0.2, 0.8, 0.4]}}]},
        "task_arithmetic": gta("task_arithmetic", [{"weight": 1.0}, {"weight": -0.5}, {"weight": [0.3, 0.9]}],
                               {"lambda": 0.8}),
        "ties": gta("ties", [{"weight": 1.0, "density": 0.6}, {"weight": 0.5, "density": [0.3, 0.9]},
                             {"weight": 0.7, "density": [{"filter": "mlp", "value": 0.4}, {"value": 0.8}]}]),
        "ties_unnormalized": gta("ties", dens(0.5), {"normalize": False, "lambda": 1.5}),
        "ties_bf16_in_float32": {"merge_method": "ties", "base_model": p["base_bf16"], "dtype": "float32",
                                 "out_dtype": "bfloat16", "models": [
                                     {"model": p["a_bf16"], "parameters": {"weight": 1.0, "density": 0.3}},
                                     {"model": p["b_bf16"], "parameters": {"weight": 0.6, "density": 0.7}}]},
        "dare_linear_d1": gta("dare_linear", dens(1.0)),
        "dare_ties_d1": gta("dare_ties", dens(1.0)),
        "dare_linear_d0.5": dict(gta("dare_linear", dens(0.5)), random=True),
        "dare_ties_d0.5": dict(gta("dare_ties", dens(0.5)), random=True),
        "breadcrumbs": gta("breadcrumbs", [{"weight": 1.0, "density": 0.8, "gamma": 0.05},
                                           {"weight": 0.5, "density": 0.6, "gamma": 0.1},
                                           {"weight": 0.8, "density": 0.9, "gamma": 0.0}]),
        "breadcrumbs_ties": gta("breadcrumbs_ties", [{"weight": 1.0, "density": 0.8, "gamma": 0.05},
                                                     {"weight": 0.5, "density": 0.6, "gamma": 0.1},
                                                     {"weight": 0.8, "density": 0.9, "gamma": 0.01}]),
        "slerp": {"merge_method": "slerp", "base_model": p["base"],
                  "models": [{"model": p["base"]}, {"model": p["a"]}],
                  "parameters": {"t": [{"filter": "self_attn", "value": [0.0, 0.5, 1.0]}, {"value": 0.3}]}},
        "model_stock": {"merge_method": "model_stock", "base_model": p["base"],
                        "models": [{"model": p[m]} for m in "abc"]},
        "model_stock_filter_wise": {"merge_method": "model_stock", "base_model": p["base"],
                                    "models": [{"model": p[m]} for m in "abc"], "parameters": {"filter_wise": True}},
        **slice_configs(p),
    }


def slice_configs(p: dict[str, str]) -> dict[str, dict]:
    """slices: the classic slerp YAML (gradients under filters), TIES over two slices with slice- and
    source-level parameters, DARE over shifted layer ranges (mergekit's draw order), a passthrough frankenmerge."""
    src = lambda m, a, b, **params: {"model": p[m], "layer_range": [a, b],  # noqa: E731
                                     **({"parameters": params} if params else {})}
    return {
        "slices_slerp": {"merge_method": "slerp", "base_model": p["base"],
                         "slices": [{"sources": [src("base", 0, 12), src("a", 0, 12)]}],
                         "parameters": {"t": [{"filter": "self_attn", "value": [0, 0.5, 0.3, 0.7, 1]},
                                              {"filter": "mlp", "value": [1, 0.5, 0.7, 0.3, 0]},
                                              {"value": 0.5}]}},
        "slices_ties": {"merge_method": "ties", "base_model": p["base"], "parameters": {"density": 0.9, "weight": 1},
                        "slices": [
                            {"sources": [src("a", 0, 6, density=0.5), src("b", 0, 6, weight=[0.2, 0.9]),
                                         src("base", 0, 6)],
                             "parameters": {"density": [{"filter": "self_attn", "value": 0.3}, {"value": 0.7}]}},
                            {"sources": [src("a", 6, 12), src("c", 6, 12, weight={"filter": "mlp", "value": 2}),
                                         src("base", 6, 12)],
                             "parameters": {"weight": 0.5, "normalize": False, "lambda": [1.0, 2.0]}}]},
        "slices_dare_ties_d0.5": {"merge_method": "dare_ties", "base_model": p["base"],
                                  "parameters": {"weight": 1.0, "density": 0.5},
                                  # the draw order is that of the largest input name: a's layers in slice 0,
                                  # and slice 1 (layers.10, layers.11 < layers.2 as strings) partly first
                                  "slices": [{"sources": [src("b", 0, 6), src("a", 2, 8), src("base", 1, 7)]},
                                             {"sources": [src("c", 9, 12), src("b", 9, 12), src("base", 9, 12)]}],
                                  "random": True},
        "passthrough_frankenmerge": {"merge_method": "passthrough", "slices": [
            {"sources": [src("a", 0, 8)]},
            {"sources": [src("b", 4, 12, scale=[{"filter": "o_proj", "value": 0.0}, {"value": 1.0}])]},
            {"sources": [src("c", 10, 12)]}]},
    }


# mergekit 0.1.5 under transformers 5 sets num_hidden_layers on the output config of a slices merge but leaves
# its per-layer `layer_types` list at the old length, so the config's save raises after every tensor is written.
# The comparison runs mergekit-yaml through this wrapper, which only resizes that list (no tensor is touched).
MERGEKIT_WRAPPER = """
import sys
import mergekit.merge as mm
_model_out_config = mm._model_out_config
def _resized(*args, **kwargs):
    res = _model_out_config(*args, **kwargs)
    for c in (res, getattr(res, "text_config", None)):
        types, n = getattr(c, "layer_types", None), getattr(c, "num_hidden_layers", None)
        if isinstance(types, list) and types and isinstance(n, int) and len(types) != n:
            c.layer_types = [types[min(i, len(types) - 1)] for i in range(n)]
    return res
mm._model_out_config = _resized
from mergekit.scripts.run_yaml import main
main()
"""


def _mergekit_command(mergekit: str) -> list[str]:
    """mergekit-yaml's own interpreter (its shebang) running MERGEKIT_WRAPPER."""
    first = Path(mergekit).read_text(errors="replace").splitlines()[0]
    python = first[2:].strip() if first.startswith("#!") else sys.executable
    return [python, "-c", MERGEKIT_WRAPPER]


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from protege.merging.io import Checkpoint

    ck = Checkpoint(folder)
    return {n: ck.get(n).float() for n in ck.names()}


def run_case(name: str, cfg: dict, root: Path, mergekit: str, base: dict[str, torch.Tensor] | None = None,
             seed: int = 0) -> dict:
    """Merges one case with both tools; returns {max_abs_diff, worst, tensors, ...}."""
    cfg = dict(cfg)
    random = cfg.pop("random", False)
    work = root / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    path = work / "merge.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    ours, theirs = work / "protege", work / "mergekit"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "protege.cli", "merge", str(path), str(ours), "--seed", str(seed)],
                       capture_output=True, text=True)
    t_ours = time.perf_counter() - t0
    if r.returncode:
        return {"case": name, "error": f"protege: {r.stderr.strip()[-500:]}"}
    t0 = time.perf_counter()
    r = subprocess.run([*_mergekit_command(mergekit), str(path), str(theirs), "--random-seed", str(seed),
                        "--no-copy-tokenizer", "--quiet"], capture_output=True, text=True)
    t_theirs = time.perf_counter() - t0
    if r.returncode:
        return {"case": name, "error": f"mergekit: {r.stderr.strip()[-800:]}"}
    a, b = _tensors(ours), _tensors(theirs)
    layers = [json.loads((d / "config.json").read_text()).get("num_hidden_layers") for d in (ours, theirs)]
    common = sorted(set(a) & set(b))
    diffs = {n: (a[n] - b[n]).abs().max().item() if a[n].numel() else 0.0 for n in common}
    worst = max(diffs, key=diffs.get)
    res = {"case": name, "tensors": len(common), "only_protege": sorted(set(a) - set(b)),
           "only_mergekit": sorted(set(b) - set(a)), "max_abs_diff": diffs[worst], "worst": worst,
           "max_abs_value": max(a[n].abs().max().item() for n in common), "random": random,
           "num_hidden_layers": {"protege": layers[0], "mergekit": layers[1]},
           "seconds": {"protege": round(t_ours, 1), "mergekit": round(t_theirs, 1)}}
    if random and base is not None:
        # the task vector's statistics: kept fraction (entries != base), mean |delta|, std(delta)
        def stats(x):
            d = torch.cat([(x[n] - base[n]).reshape(-1) for n in common if n in base])
            return {"kept": (d != 0).float().mean().item(), "mean_abs": d.abs().mean().item(), "std": d.std().item()}
        res["stats"] = {"protege": stats(a), "mergekit": stats(b)}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mergekit", required=True, help="path to mergekit-yaml (its own venv)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the checkpoints and outputs here")
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--json", action="store_true", help="print one JSON line per case")
    args = ap.parse_args(argv)
    root = args.workdir or Path(tempfile.mkdtemp(prefix="mergekit-parity-"))
    try:
        ckpts = build_checkpoints(root / "ckpts")
        base = _tensors(ckpts["base"])
        cases = configs(ckpts)
        only = [c for c in args.only.split(",") if c]
        bad = 0
        print(f"{'case':<26}{'tensors':>8}{'max |diff|':>14}  worst tensor / statistics", flush=True)
        for name, cfg in cases.items():
            if only and name not in only:
                continue
            res = run_case(name, cfg, root / "runs", args.mergekit, base)
            if args.json:
                print(json.dumps(res), flush=True)
                continue
            if "error" in res:
                bad += 1
                print(f"{name:<26}  ERROR {res['error']}", flush=True)
                continue
            line = f"{name:<26}{res['tensors']:>8}{res['max_abs_diff']:>14.3e}  "
            if res["random"] and "stats" in res:
                s = res["stats"]
                line += ("kept {:.3f} vs {:.3f}, mean|d| {:.3e} vs {:.3e}, std {:.3e} vs {:.3e} (protege vs mergekit)"
                         .format(s["protege"]["kept"], s["mergekit"]["kept"], s["protege"]["mean_abs"],
                                 s["mergekit"]["mean_abs"], s["protege"]["std"], s["mergekit"]["std"]))
            else:
                line += res["worst"]
            nl = res["num_hidden_layers"]
            if nl["protege"] != nl["mergekit"]:
                line += f"  [num_hidden_layers: protege {nl['protege']}, mergekit {nl['mergekit']}]"
            bad += res["max_abs_diff"] > 1e-5 or nl["protege"] != nl["mergekit"]
            if res["only_protege"] or res["only_mergekit"]:
                line += f"  [only protege: {res['only_protege']}, only mergekit: {res['only_mergekit']}]"
            print(line, flush=True)
        return 1 if bad else 0
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
