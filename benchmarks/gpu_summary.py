"""The GPU checks' closing summary (benchmarks/gpu_check.sh, gpu_check_offline.sh): one short line per part from
the folder of logs the scripts fill, and the exit status (1 when any part failed).

Each part NAME left, in that folder (whose file `parts` lists them in the order they ran), NAME.status (`ok`,
`failed <exit status>`, `timeout <seconds>` or `skipped <why>`, written by the script), NAME.log (its whole
output) and NAME.json (its last JSON line, when it printed one; a part that prints a table instead is shown by
its last lines).

    python benchmarks/gpu_summary.py LOGS_DIR [--prefix gpu_check] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def gib(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def num(x, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def device_peak(r: dict) -> str:
    if r.get("device_peak_gib") is None:
        return "device memory not sampled (no CUDA device)"
    return (f"device peak {gib(r['device_peak_gib'])} GiB (+{gib(r.get('device_added_gib'))} over the start, "
            f"{r.get('device_memory_source')})")


def rl_line(r: dict) -> str:
    peak = f"{device_peak(r)}, torch peak {gib(r.get('torch_peak_gib'))} GiB"
    return (f"rollouts {num(r['rollout_tokens_per_s'], '.0f')} tokens/s | update {num(r['update_s'])} s | weight sync "
            f"{num(r['sync_s'])} s | step {num(r['step_s'])} s | {r['sequences_per_step']} sequences/step, "
            f"{r['steps']} steps | {r['tensors_changed']}/{r['tensors_total']} tensors changed (whole"
            f"{', gathered from ZeRO-3 shards' if r.get('partitioned') else ''}), "
            f"{r['frozen_changed']} frozen changed"
            f" | {peak}, plan {gib(r.get('plan_gib'))} GiB | {r['dtype']}, {r['trainable']}, {r['backend']}"
            f"{' ZeRO-' + str(r['zero']) if r['backend'] == 'deepspeed' else ''}, "
            f"vocabulary {r['vocab'] or 'as trained'}"
            + (f" | tis weight {r['tis_weight_mean']:.3f}" if "tis_weight_mean" in r else ""))


def resume_line(r: dict) -> str:
    return (f"stopped after {r['steps_before_stop']} of {r['steps']} steps, resumed {r['steps_after_resume']} in a "
            f"fresh process: {r['tensors_differing']}/{r['tensors']} tensors differ from the uninterrupted run's (max "
            f"|diff| {r['max_abs_diff']:.3g}, allowed {r['atol']:g}); {r['moved_after_resume']} moved after the "
            "resume"
            f" | {r['seconds']:.0f} s for three runs | uninterrupted run: " + rl_line(r["full_run"]))


def sync_line(r: dict) -> str:
    images = (f"{r['prompts_with_images']}/{r['prompts']} prompts with images ({r['image_tokens_per_prompt']:.0f} "
              "image tokens each), engine prompt ids == trainer's" if r["prompts_with_images"] else
              f"{r['prompts']} text-only prompts, engine prompt ids == trainer's")
    return (f"engine start {r['startup_s']:.1f} s ({'eager' if r['enforce_eager'] else 'CUDA graphs'}) | sync "
            f"{r['sync_s']:.3f} s | first tokens agree with torch {r['agree_before']:.2f} before, "
            f"{r['agree_after']:.2f} after the sync (stale until synced {r['stale_until_sync']:.2f}) | {images} | sampling "
            f"{r['sampling_tokens_per_s']:.0f} tokens/s over {r['sampling_sequences']} sequences | {device_peak(r)}")


def stage_line(r: dict) -> str:
    return (f"`protege stage rl` with rl.processes {r['processes']} on {r['device']} (ZeRO-{r['zero']}): "
            f"{r['launch_line']!s}; report says {r['reported_processes']} processes, checkpoints "
            f"{', '.join(r['checkpoints']) or 'none'}; {r['stage_s']:.0f} s")


def driver_line(r: dict) -> str:
    return (f"driver {r['driver']} (CUDA {r['driver_cuda']}), torch {r['torch']} built for CUDA {r['torch_cuda']}"
            f"{', vllm ' + r['vllm'] if r.get('vllm') else ''}: {r['why']}")


def activation_line(r: dict) -> str:
    parts = []
    for name, v in r["variants"].items():
        cuda = (f" (CUDA: retained {v['cuda_retained_per_hidden']:.1f}, peak less weight gradients "
                f"{v['cuda_peak_less_grads_per_hidden']:.1f})" if "cuda_retained_per_hidden" in v else "")
        per_token = v["bytes_per_token"]
        size = f"{per_token / 1024:.0f} KiB" if per_token >= 10240 else f"{per_token:.0f} B"
        plan = f", plan {v['plan_per_hidden']:.1f}" if "plan_per_hidden" in v else ""
        parts.append(f"{name} {size}/token = {v['per_hidden']:.1f} x hidden{plan}{cuda}")
    return (f"{r['family']} layer (hidden {r['hidden_size']}), {r['tokens']} tokens, {r['dtype']}, {r['attn']}: "
            + "; ".join(parts))


def generic_line(r: dict) -> str:
    shown = {k: v for k, v in r.items() if k != "part" and not isinstance(v, (dict, list))}
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in list(shown.items())[:14])


TABLE_LINES = 4
LINES = {"rl": rl_line, "resume": resume_line, "sync": sync_line, "stage": stage_line, "driver": driver_line,
         "activation_bytes": activation_line}


def failure_reason(log: Path) -> str:
    if not log.exists():
        return "no log"
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    said = [ln for ln in lines if "FAILED" in ln or "Error" in ln]
    return (said or lines or ["(no output)"])[-1][:400]


def summarize(logs: Path, prefix: str) -> tuple[list[str], dict]:
    order = logs / "parts"  # the scripts list each part there as it starts
    listed = order.read_text().split() if order.exists() else []
    names = [n for n in dict.fromkeys(listed) if (logs / f"{n}.status").exists()]
    names += sorted({p.stem for p in logs.glob("*.status")} - set(names))
    out, record = [], {}
    for name in names:
        status = (logs / f"{name}.status").read_text().strip()
        js = logs / f"{name}.json"
        result = None
        if js.exists() and js.read_text().strip():
            try:
                result = json.loads(js.read_text())
            except json.JSONDecodeError:
                result = None
        record[name] = {"status": status, "result": result}
        if status == "ok" and result is not None:
            line = LINES.get(result.get("part"), generic_line)
            try:
                text = line(result)
            except (KeyError, TypeError, ValueError) as exc:  # a part that printed other keys: show them raw
                text = f"({type(exc).__name__} {exc}) " + generic_line(result)
            out.append(f"{prefix}: {name:22s} ok | {text}")
        elif status == "ok":  # a part that prints a table, not a JSON line: its last lines
            tail = [ln.rstrip() for ln in (logs / f"{name}.log").read_text(errors="replace").splitlines()
                    if ln.strip() and not ln.startswith(("[", "Writing", "WARNING", "INFO"))][-TABLE_LINES:]
            out.append(f"{prefix}: {name:22s} ok" + "".join(f"\n{prefix}:     {ln}" for ln in tail))
        elif status.startswith("skipped"):
            out.append(f"{prefix}: {name:22s} SKIPPED: {status[len('skipped'):].strip()}")
        else:
            out.append(f"{prefix}: {name:22s} FAILED ({status}): {failure_reason(logs / f'{name}.log')} "
                       f"(log {logs / f'{name}.log'})")
    return out, record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs", type=Path)
    ap.add_argument("--prefix", default="gpu_check")
    ap.add_argument("--json", type=Path, help="also write every part's status and result to this file")
    args = ap.parse_args(argv)
    lines, record = summarize(args.logs, args.prefix)
    for line in lines:
        print(line)
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))
    failed = [n for n, r in record.items() if not (r["status"] == "ok" or r["status"].startswith("skipped"))]
    ran = [n for n, r in record.items() if r["status"] == "ok"]
    print(f"{args.prefix}: {'FAILED: ' + ', '.join(failed) if failed else 'OK'} ({len(ran)} parts ran, "
          f"{len(record) - len(ran) - len(failed)} skipped)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
