"""`protege ...` commands."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import typer

from protege.config import ConfigError, load_config
from protege.tools.sandbox import Limits  # stdlib only: its defaults are the CLI's

app = typer.Typer(add_completion=False, no_args_is_help=True, help="protege: RL + imitation post-training pipeline.")
config_app = typer.Typer(no_args_is_help=True, help="Inspect the configuration.")
app.add_typer(config_app, name="config")
data_app = typer.Typer(no_args_is_help=True, help="Import and validate datasets.")
app.add_typer(data_app, name="data")
eval_app = typer.Typer(no_args_is_help=True, help="Score, run and compare benchmark evaluations.")
app.add_typer(eval_app, name="eval")
sandbox_app = typer.Typer(no_args_is_help=True, help="Run Python the way the RL trainer runs model-written code.")
app.add_typer(sandbox_app, name="sandbox")
model_app = typer.Typer(no_args_is_help=True, help="Check and pin your own student (model.path).")
app.add_typer(model_app, name="model")


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _one_line(exc: Exception) -> str:
    """An error as the project's one line: an OS error as 'FILE: what went wrong', without errno numbers."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror.lower()}" if exc.filename else exc.strerror.lower()
    return str(exc)


def _config(params: Path):
    try:
        return load_config(params)
    except ConfigError as exc:
        _fail(str(exc))


@config_app.command("show")
def config_show(params: Path = typer.Option(Path("params.yaml"), help="params file")) -> None:
    """Print the resolved configuration (defaults filled in) as JSON."""
    typer.echo(json.dumps(_config(params).model_dump(), indent=2))


@data_app.command("import")
def data_import(input: Path = typer.Option(..., "--input", help="a LLaVA-style .json/.jsonl file or a .parquet table"),
                out: Path = typer.Option(..., "--out", help="folder for NAME.parquet, images/ and the report"),
                name: str = typer.Option("train", help="table name (train, rl, test, ...)"),
                fmt: str = typer.Option("", "--format", help="llava | parquet (default: from the file suffix)"),
                images: Path = typer.Option(None, help="folder that image paths are relative to (default: the "
                                                       "input's folder); paths may not lead out of it"),
                allow_outside_images: bool = typer.Option(False, "--allow-outside-images",
                                                          help="also read absolute image paths and paths that "
                                                               "lead out of --images (symlinks included)"),
                images_in_place: bool = typer.Option(False, "--images-in-place",
                                                     help="the table names your image files where they are "
                                                          "(checked and hashed, not copied under OUT/images)")
                ) -> None:
    """Import a dataset into protege's question-row schema, validated by its Great Expectations suite."""
    from protege.data.importers import cache_folder, import_dataset
    from protege.errors import UserFacingError

    fmt = fmt or ("parquet" if input.suffix == ".parquet" else "llava")
    try:
        res = import_dataset(input, fmt, out, name, images, allow_outside_images, images_in_place=images_in_place,
                             say=lambda line: typer.echo(f"{input.name}: {line}", err=True),
                             cache=cache_folder(out))  # a rejected file's checked images wait for the next run
    except UserFacingError as exc:
        _fail(str(exc), code=1)
    typer.echo(f"{input}: {res.rows_read} rows read, {res.duplicates_dropped} duplicates dropped, "
               f"{res.rows_written} written to {res.table} ({res.images_written} images); report {res.report}")


@app.command()
def stage(name: str = typer.Argument(..., help="stage name, as in dvc.yaml"),
          params: Path = typer.Option(Path("params.yaml"), help="params file"),
          nodes: int | None = typer.Option(None, "--nodes", help="machines the stage spans (default: the "
                                           "section's nodes, or PROTEGE_NODES)"),
          node_rank: int | None = typer.Option(None, "--node-rank", help="this machine's place, 0..nodes-1 "
                                               "(default: PROTEGE_NODE_RANK, else 0); node 0 writes the outputs"),
          rdzv_endpoint: str | None = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of the rendezvous, "
                                                   "node 0's address (default: the section's rdzv_endpoint, or "
                                                   "PROTEGE_RDZV_ENDPOINT)")) -> None:
    """Run one pipeline stage in the current project folder (this is what dvc.yaml calls). A training stage
    starts its own ranks: `processes` per machine, on `nodes` machines that each run this command."""
    from protege import tracking
    from protege.errors import UserFacingError
    from protege.stages import stage_module

    cfg = _config(params)
    try:
        module = stage_module(name)
    except KeyError as exc:
        _fail(exc.args[0])
    root = Path.cwd()
    ranks = _launch_ranks(cfg, name, params, nodes, node_rank, rdzv_endpoint)
    if ranks is not None:  # this process started the stage's ranks and waited for them
        if ranks:
            _fail(f"{name}: stopped (a rank failed, above)", code=1)
        return
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    from protege import provenance

    try:
        from protege.plan import check_stage_fits
        from protege.runtime.launch import init_group

        # a launched rank binds its GPU and joins its group before rank 0 prepares folders
        init_group(_on_cuda(cfg, name), _collective_timeout(cfg, name))

        from protege.runtime.distributed import world

        note = check_stage_fits(cfg, name, root, world()[1])  # before any compute: refuses what cannot fit
        if note:
            typer.echo(f"{name}: {note}", err=True)
        provenance.set_current(stage_record(name, cfg, root))
        with tracking.stage_run(name, root, cfg.tracking) as run:
            run.log_metrics({"process_startup_s": _process_age_s()})  # imports etc. before the run opened
            _note_restart(name, run)
            module.run(cfg, root, run)
        _leave_group()
    except (UserFacingError, FileNotFoundError, FloatingPointError) as exc:
        _fail(f"{name}: {_one_line(exc)}", code=1)
    finally:
        provenance.set_current(None)  # a stage run in-process (tests, the study) leaves no record behind


def _section(cfg, name: str):
    from protege.stage_names import TRAINING_SECTIONS

    if name not in TRAINING_SECTIONS:
        return None, None
    out = cfg
    for part in TRAINING_SECTIONS[name].split("."):
        out = getattr(out, part)
    return TRAINING_SECTIONS[name], out


def _on_cuda(cfg, name: str) -> bool:
    import torch

    _, section = _section(cfg, name)
    return section is not None and section.device != "cpu" and torch.cuda.is_available()


def _collective_timeout(cfg, name: str) -> float:
    _, section = _section(cfg, name)
    return float(section.collective_timeout_s) if section is not None else 1800.0


def _launch_ranks(cfg, name: str, params: Path, nodes: int | None = None, node_rank: int | None = None,
                  endpoint: str | None = None) -> int | None:
    """A training stage whose section asks for several processes, several nodes or restarts starts its ranks
    here under torch's elastic agent and returns the exit code; None when this process runs the stage itself
    (one process without restarts, or already a launched rank)."""
    from protege.errors import UserFacingError
    from protege.runtime.launch import launch, launched, resolve_nodes, resolve_processes

    key, section = _section(cfg, name)
    if section is None:
        if (nodes or 1) > 1 or endpoint:
            _fail(f"{name}: only training stages span several nodes; run it without --nodes/--rdzv-endpoint")
        return None
    if launched():
        return None
    try:
        n = resolve_processes(section.processes, section.backend, section.device, key)
        where = resolve_nodes(section, key, nodes, node_rank, endpoint)
    except UserFacingError as exc:
        _fail(f"{name}: {exc}", code=1)
    if n == 1 and where.count == 1 and where.max_restarts == 0:
        return None
    backend = "NCCL" if _on_cuda(cfg, name) else "gloo"
    span = f" on each of {where.count} nodes (this is node {where.rank})" if where.count > 1 else ""
    again = f", up to {where.max_restarts} restart(s)" if where.max_restarts else ""
    typer.echo(f"{name}: {n} processes ({backend}){span}{again}; rank 0 records and writes", err=True)
    return launch([sys.executable, "-m", "protege", "stage", name, "--params", str(params)], n,
                  _on_cuda(cfg, name), cfg.threads, where, run_id=f"protege-{name}")


def _leave_group() -> None:
    """Every rank leaves the group together once the stage is done: a gloo group left to the interpreter's exit
    can abort a rank in its threads' teardown ("terminate called without an active exception")."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        try:
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()
        except (RuntimeError, ValueError):  # no usable default group (a launcher's own, or none): nothing to leave
            pass


def _note_restart(name: str, run) -> None:
    """A group the elastic agent restarted after a rank died: said, and kept with the stage's run."""
    from protege.runtime.launch import restarts

    count = restarts()
    if count:
        typer.echo(f"{name}: restart {count} after a rank failed; resuming from the last saved training state",
                   err=True)
        run.log_metrics({"elastic_restarts": float(count)})
        run.set_tags({"elastic_restarts": str(count)})


def stage_record(name: str, cfg, root: Path) -> dict:
    """protege.json for what stage `name` writes: the resolved params it reads (its params in dvc.yaml; the
    whole configuration where the project has no dvc.yaml), the code version and its data inputs' digests."""
    from protege import __version__, tracking
    from protege.dvc_lockfile import read_dvc_yaml
    from protege.lineage import git_state
    from protege.pipeline import entry_path

    values = cfg.model_dump(mode="json")
    spec = {}
    if (root / "dvc.yaml").exists():
        spec = read_dvc_yaml(root).get(name, {})
    keys = [str(k) for k in spec.get("params", [])] if spec else list(values)
    # dvc.yaml lists a section's keys one by one (a key that changes nothing is left out); the record nests
    # them again, so it reads as params.yaml does
    params: dict = {}
    for key in keys:
        node = values
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        *path, last = key.split(".")
        into = params
        for part in path:
            into = into.setdefault(part, {})
        into[last] = node
    deps = [entry_path(d) for d in spec.get("deps", [])]
    inputs = {d: tracking.input_digest(root, d) for d in deps
              if not d.startswith("protege/") and (root / d).exists()}
    git = git_state(root)
    return {"stage": name, "params": params, "inputs": inputs,
            "code": {"protege": __version__, "git_commit": git and git["commit"], "git_dirty": git and git["dirty"]}}


def _process_age_s() -> float:
    """Seconds since this process started (Linux /proc; 0 where it is not available)."""
    import time

    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return max(0.0, time.time() - (boot + ticks / os.sysconf("SC_CLK_TCK")))
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0


@app.command()
def plan(params: Path = typer.Option(Path("params.yaml"), help="params file"),
         model: Path = typer.Option(None, help="a folder with the model's config.json (default: model.path, or "
                                               "models/base for the embedded student); weights are not read"),
         gpu_memory: str = typer.Option(None, "--gpu-memory", help="device memory per rank, e.g. 80GB (default: "
                                                                  "the detected GPU's, or none on a CPU machine)"),
         processes: int = typer.Option(1, min=1, help="ranks the stages run on (ZeRO partitions over them)"),
         prompt_tokens: int = typer.Option(1024, min=1, help="tokens of the longest prompt, image tokens included"),
         answer_tokens: int = typer.Option(256, min=1, help="tokens of the longest SFT target"),
         device_type: str = typer.Option("gpu", "--device", help="gpu: memory per rank on the accelerator, "
                                         "with host memory and disk; cpu: a CPU run's resident memory per process"),
         nodes: int = typer.Option(1, min=1, help="machines the processes spread over (host memory per node)"),
         job: bool = typer.Option(False, "--job", help="also print the Kubernetes job variables (memory, "
                                  "ephemeral_storage, shm_size, gpus) deploy/k8s/gpu-base-job-template.json takes")
         ) -> None:
    """Estimate each training stage's memory per rank for the configured model, and whether it fits."""
    import json
    import os

    from protege.errors import UserFacingError
    from protege.plan import (Lengths, host_plan, host_table, job_variables, model_shape, parse_memory, plan_stages,
                              table)

    if device_type not in ("gpu", "cpu"):
        _fail(f"--device {device_type!r}: expected gpu or cpu", code=2)
    cpu = device_type == "cpu"
    cfg = _config(params)
    if model is not None:  # planned as your own model (the discriminator's `auto` is then LoRA)
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(model)})})
    try:
        device = parse_memory(gpu_memory) if gpu_memory else None
        if cpu and device is None:  # fits this machine's memory
            device = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if device is None:
            import torch

            if torch.cuda.is_available():
                device = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        shape = model_shape(cfg, Path.cwd(), model)
        plans = plan_stages(cfg, shape, processes=processes, device_bytes=device,
                            lengths=Lengths(prompt_tokens, answer_tokens), device_type="cpu" if cpu else "cuda")
        host = None if cpu else host_plan(cfg, shape, processes=processes, nodes=nodes)
    except UserFacingError as exc:
        _fail(str(exc), code=1)
    typer.echo(f"model: {shape.params / 1e9:.2f}B parameters ({shape.layers} layers, hidden {shape.hidden}, "
               f"vocabulary {shape.vocab:,}), {cfg.model.dtype}; {processes} process(es); prompts up to "
               f"{prompt_tokens} tokens" + ("; on the CPU (resident memory per process)" if cpu else ""))
    typer.echo(table(plans, device, processes))
    if device:
        for p in plans:
            if p.peak > device:
                typer.echo(p.refusal(device))
    if host is not None:
        typer.echo("")
        typer.echo(host_table(host))
        if job:
            typer.echo("")
            typer.echo("job variables: " + json.dumps(job_variables(host)))


@app.command()
def dag(project: Path = typer.Option(Path("."), help="project folder (holds dvc.yaml and params.yaml)"),
        params: Path = typer.Option(Path("params.yaml"), help="params file"),
        check: bool = typer.Option(False, "--check", help="only say whether dvc.yaml is current; exit 1 if not")
        ) -> None:
    """Write dvc.yaml for the params: the world stage for `data.source: world`, the data stage importing your
    files for `files` (`protege pipeline` does this itself before it runs; run it before a bare `dvc repro`)."""
    from protege import dag as dag_file

    cfg = _config(project / params)
    if check:
        dvc_yaml = project / "dvc.yaml"
        current = dvc_yaml.is_file() and dvc_yaml.read_text() == dag_file.render(cfg, project)
        typer.echo(f"{project / 'dvc.yaml'}: {'current' if current else 'out of date: run `protege dag`'}")
        raise typer.Exit(0 if current else 1)
    changed = dag_file.write(cfg, project)
    stages = dag_file.stages_in(project)
    typer.echo(f"{project / 'dvc.yaml'}: {'written' if changed else 'already current'} for data.source "
               f"{cfg.data.source} ({len(stages)} stages: {', '.join(stages)})")


@app.command()
def pipeline(project: Path = typer.Option(Path("."), help="project folder (holds dvc.yaml and params.yaml)"),
             params: Path = typer.Option(Path("params.yaml"), help="params file, checked before anything runs")) -> None:
    """Run the whole pipeline as a Prefect flow (each stage through DVC, tracked in MLflow)."""
    from protege.pipeline import missing_dag_params

    cfg = _config(project / params)
    if cfg.model.path is not None:
        _pin(project, params, cfg)
    from protege import dag as dag_file

    if dag_file.write(cfg, project):
        typer.echo(f"{project / 'dvc.yaml'}: written for data.source {cfg.data.source}", err=True)
    missing = missing_dag_params(project, str(params))
    if missing:
        _fail(f"{project / params}: dvc.yaml tracks {', '.join(missing)} but the file does not set them; "
              "write them out (`protege config show` prints every value)")
    # the flow lives outside the library (the library never imports Prefect): run it as its own process
    code = subprocess.call([sys.executable, "-m", "flows.pipeline", "--project", str(project)], env=os.environ.copy())
    raise typer.Exit(code)


def _pin(project: Path, params: Path, cfg) -> str:
    """Writes model.path's content digest as model.digest (DVC then sees a changed model as a changed param)."""
    from protege.errors import UserFacingError
    from protege.pipeline import set_param
    from protege.stages.student_model import model_path, pinned_digest

    try:
        digest = pinned_digest(cfg, project)
    except UserFacingError as exc:
        _fail(str(exc), code=1)
    if set_param(project, "model.digest", digest, str(params)):
        typer.echo(f"{project / params}: model.digest = {digest} ({model_path(cfg, project)})", err=True)
    return digest


@model_app.command("pin")
def model_pin(project: Path = typer.Option(Path("."), help="project folder"),
              params: Path = typer.Option(Path("params.yaml"), help="params file")) -> None:
    """Record model.path's content digest in the params file as model.digest (the stages refuse a model.path
    whose files changed since; `protege pipeline` pins before it runs)."""
    cfg = _config(project / params)
    if cfg.model.path is None:
        _fail(f"{project / params}: model.path is not set (the embedded world's student needs no pin)")
    typer.echo(_pin(project, params, cfg))


@model_app.command("check")
def model_check(path: Path = typer.Argument(..., help="a Hugging Face checkpoint folder"),
                trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="run the family's own code")
                ) -> None:
    """Check a folder the way every stage will read it, before any compute: config, safetensors weights, an
    image-text-to-text class, the processor and its chat template; prints what protege reads off it."""
    from protege.errors import UserFacingError
    from protege.models.hf_folder import architecture, check_folder
    from protege.models.processor import StudentProcessor

    try:
        config = check_folder(path, trust_remote_code)
        p = StudentProcessor.from_pretrained(path, trust_remote_code)
        info = {"architecture": architecture(config), "model_type": config["model_type"],
                "processor": type(p.processor).__name__, "end_of_turn": p.end_of_turn,
                "stop_token_ids": p.stop_token_ids, "image_token_id": p.image_token_id,
                "placed_image_token_ids": p.vision_token_ids, "prompt": p.prompt("QUESTION", 1)}
    except (UserFacingError, OSError, ValueError) as exc:
        _fail(_one_line(exc), code=1)
    typer.echo(json.dumps(info, indent=2, ensure_ascii=False))


@app.command()
def lineage(model_uri: str = typer.Argument(..., help="models:/NAME@ALIAS or models:/NAME/VERSION"),
            as_json: bool = typer.Option(False, "--json", help="print the checked lineage as JSON"),
            project: Path = typer.Option(Path("."), help="the pipeline's project folder (holds dvc.lock)")) -> None:
    """Print a registered model's chain back to its source data, with each recorded hash checked against the
    working tree (a warning on stderr for every path that changed)."""
    from protege.errors import UserFacingError
    from protege.lineage import lineage_of, render

    try:
        report = lineage_of(project, model_uri)
    except UserFacingError as exc:
        _fail(str(exc), code=1)
    typer.echo(json.dumps(report, indent=2) if as_json else render(report))
    for warning in report["warnings"]:
        typer.echo(f"warning: {warning}", err=True)


def _bench_names(value: str) -> list[str] | None:
    return None if value in ("", "all") else [v.strip() for v in value.split(",") if v.strip()]


@eval_app.command("score")
def eval_score(benchmark: str = typer.Option(..., help="benchmark name, e.g. mmbench, chartqa, mathvista"),
               data: Path = typer.Option(..., help="the benchmark file (.tsv, .parquet or MM-Vet .json)"),
               predictions: Path = typer.Option(..., help='JSONL: {"index": ..., "prediction": "..."} per line'),
               out: Path = typer.Option(..., help="folder for summary.json, items.jsonl and units.json"),
               protocol: str = typer.Option(None, help="lmms-eval | lenient | vlmevalkit (multiple choice); "
                                                       "default: evaluate.protocol of --params, else lmms-eval"),
               fmt: str = typer.Option("", "--format", help="tsv | parquet | json (default: from the suffix)"),
               bootstrap: int = typer.Option(1000, min=100, help="resamples for the 95% CI"),
               seed: int = typer.Option(0),
               params: Path = typer.Option(None, help="use this params file's evaluate.protocol, evaluate.judge "
                                                      "and evaluate.mmvet_grader_prompt (default: rules only)")) -> None:
    """Score any model's predictions on one benchmark file (no student model is loaded)."""
    from protege.errors import UserFacingError
    from protege.eval.readers import read_benchmark
    from protege.eval.score import (
        check_coverage,
        read_predictions,
        score_benchmark,
        write_scores,
    )
    from protege.eval.scorers import suite_protocol
    from protege.eval.suite import completer_for, grader_prompt, scored_split

    try:
        complete = grader = None
        if params is not None:
            cfg = _config(params)
            complete = completer_for(cfg.evaluate.judge, Path.cwd(), cfg.seed)
            grader = grader_prompt(cfg.evaluate, Path.cwd())
            if protocol is None:  # a suite-wide setting: vlmevalkit leaves open benchmarks to lmms-eval
                protocol = suite_protocol(benchmark, cfg.evaluate.protocol)
        protocol = protocol or "lmms-eval"
        items = scored_split(read_benchmark(benchmark, data, fmt or None))
        preds = read_predictions(predictions)
        check_coverage(items, preds, predictions)
        summary, rows, units = score_benchmark(benchmark, items, preds, protocol, complete, bootstrap, seed, grader)
    except (UserFacingError, ValueError, KeyError) as exc:
        _fail(str(exc).strip("'\""), code=1)
    write_scores(out, summary, rows, units)
    lo, hi = summary["ci"]
    typer.echo(f"{benchmark}: {summary['score']:.2f} (95% CI {lo:.2f}-{hi:.2f}) on {summary['items']} items "
               f"({summary['units']} scored units, {summary['protocol']}); rows in {out / 'items.jsonl'}")
    if summary.get("judge") and summary["judge"]["unusable"]:
        from protege.eval.judging import JudgeTally

        typer.echo(f"{benchmark}: {JudgeTally(**summary['judge']).line()}; each scored as the harness scores it "
                   "(notes in items.jsonl)", err=True)


@eval_app.command("run")
def eval_run(model: Path = typer.Option(..., help="a student checkpoint folder (safetensors + configs)"),
             benchmarks: str = typer.Option("all", help="comma-separated names, or all (of evaluate.benchmarks)"),
             out: Path = typer.Option(Path("reports/eval-run"), help="folder for the per-benchmark results"),
             name: str = typer.Option("", help="label of this model in the report (default: folder name)"),
             params: Path = typer.Option(Path("params.yaml"), help="params file (evaluate section)"),
             batch_size: int = typer.Option(0, help="override evaluate.batch_size (1 = one at a time)")) -> None:
    """Generate answers (batched, greedy) with a checkpoint, score them, report, and log an MLflow run."""
    from protege import tracking
    from protege.errors import UserFacingError
    from protege.eval.report import model_metrics, new_report, write_report
    from protege.eval.suite import (
        benchmark_files,
        completer_for,
        evaluate_model,
        grader_prompt,
        load_suite,
    )
    from protege.models.student import load_student

    cfg = _config(params)
    ev = cfg.evaluate if not batch_size else cfg.evaluate.model_copy(update={"batch_size": batch_size})
    label = name or model.resolve().name
    root = Path.cwd()
    try:
        files = benchmark_files(ev, root)
        suite = load_suite(files, _bench_names(benchmarks), mini=ev.benchmarks == "mini")
        grader = grader_prompt(ev, root)
        net, processor = load_student(model)
    except (UserFacingError, FileNotFoundError, OSError) as exc:
        _fail(str(exc), code=1)
    with tracking.stage_run("eval-run", root, cfg.tracking) as run:
        run.log_params({**ev.model_dump(exclude={"judge"}), "model": str(model), "label": label}, "eval.")
        summary = evaluate_model(net, processor, suite, ev, out / label, completer_for(ev.judge, root, cfg.seed),
                                 cfg.seed, log=lambda m: typer.echo(f"{label} {m}", err=True), grader=grader)
        report = new_report(ev, {b: files[b] for b in suite}, label)
        report["models"][label] = {"path": str(model), **summary}
        report["score"] = summary["average"]
        run.log_metrics(model_metrics(summary))
        for f in write_report(report, out / "report.json", out / "report.md", out / "report.png"):
            run.log_artifact(f)
        run.log_artifact(out / label, f"eval/{label}")
        lo, hi = summary["average_ci"]
        typer.echo(f"{label}: average {summary['average']:.2f} (95% CI {lo:.2f}-{hi:.2f}) over {len(suite)} "
                   f"benchmarks; {summary['mean_tokens']:.1f} tokens and {1000 * summary['seconds_per_answer']:.1f} "
                   f"ms per answer; report {out / 'report.md'}; MLflow run {run.run_id}")


@eval_app.command("compare")
def eval_compare(run_a: str = typer.Argument(..., help="MLflow run id of A (evaluate stage or eval run)"),
                 run_b: str = typer.Argument(..., help="MLflow run id of B"),
                 model_a: str = typer.Option("", help="model label inside run A (default: merged, or the only one)"),
                 model_b: str = typer.Option("", help="model label inside run B"),
                 bootstrap: int = typer.Option(1000, min=100), seed: int = typer.Option(0)) -> None:
    """B - A per benchmark and on average, with a paired bootstrap over the items both runs scored."""
    import tempfile

    from protege import tracking
    from protege.errors import UserFacingError
    from protege.eval.compare import compare, markdown, read_sources, read_units

    def side(run_id: str, label: str, tmp: Path) -> tuple[dict, str]:
        root = tracking.download_artifacts(Path.cwd(), run_id, "eval", tmp / run_id)
        labels = sorted(p.name for p in root.iterdir() if p.is_dir())
        chosen = label or ("merged" if "merged" in labels else labels[0] if len(labels) == 1 else "")
        if chosen not in labels:
            raise UserFacingError(f"run {run_id} holds models {labels}; pick one with --model-a / --model-b")
        return read_units(root / chosen), f"{run_id[:8]}:{chosen}", read_sources(root / chosen)

    try:
        with tempfile.TemporaryDirectory() as tmp:
            a, label_a, src_a = side(run_a, model_a, Path(tmp))
            b, label_b, src_b = side(run_b, model_b, Path(tmp))
        typer.echo(markdown(compare(a, b, bootstrap, seed, src_a, src_b), label_a, label_b), nl=False)
    except (UserFacingError, ValueError) as exc:
        _fail(str(exc), code=1)


@app.command()
def study(file: Path = typer.Argument(..., help="study file (YAML): variants, seeds, baseline, claims"),
          dry_run: bool = typer.Option(False, "--dry-run", help="list the runs (variant, seed, overrides, finished "
                                                                "or not), each part's game and warm starts, its "
                                                                "claims with their preconditions, and run nothing"),
          project: Path = typer.Option(Path("."), help="project folder: its params.yaml and shared upstream "
                                                       "artifacts (data/, models/sft, models/discriminator)"),
          jobs: int = typer.Option(1, min=1, help="runs at once, each in its own process with one torch thread")
          ) -> None:
    """Train and evaluate every variant x seed of a study from the project's shared upstream artifacts, as
    nested MLflow runs under one parent; report reports/study/NAME.{md,json,png} with CIs and verdicts. A file
    with `parts:` runs its studies' runs in one queue and writes their claims in one table (its `report`)."""
    from protege.errors import UserFacingError
    from protege.study.runner import (
        check_upstream,
        describe_claims,
        describe_game,
        describe_warm_starts,
        finish_study,
        finish_suite,
        plan,
        queue_estimate,
        read_open_study,
    )
    from protege.study.spec import describe, load_suite

    try:
        suite = load_suite(file, project)
    except ConfigError as exc:
        _fail(str(exc))
    plans = {s.name: plan(s) for s in suite.studies}
    pending = {s.name: [p for p in plans[s.name] if not p.finished] for s in suite.studies}
    if dry_run:
        for spec in suite.studies:
            planned, todo = plans[spec.name], pending[spec.name]
            label = f"part {spec.part} ({spec.task})" if spec.part else f"study {spec.name} ({file})"
            typer.echo(f"{label}: {len(spec.variants)} variants, seeds {spec.seeds}, baseline "
                       f"{spec.baseline}; {len(planned)} runs, {len(planned) - len(todo)} finished, {len(todo)} to run"
                       + (f"; every variant: {describe(spec.common)}" if spec.common else ""))
            width = max(len(p.run.variant) for p in planned)
            for p in planned:
                what = ("train: false (SFT checkpoint)" if not p.run.train else
                        describe(p.run.overrides, "(the common overrides only)" if spec.common else
                                 "(params as they are)"))
                warm = "" if p.run.warm_seed is None else f" warm start {p.run.warm_seed:<3}"
                typer.echo(f"  {p.run.variant:<{width}}  seed {p.run.seed:<4}{warm} "
                           f"{'finished' if p.finished else 'to run  '}  {what}")
            game = describe_game(spec)
            for line in ([game] if game else []) + describe_warm_starts(spec, [p.run for p in todo]):
                typer.echo(f"  {line}")
            for line in describe_claims(spec):
                typer.echo(f"  {line}")
            try:
                check_upstream(spec, [p.run for p in todo])
            except UserFacingError as exc:
                typer.echo(f"note: {exc}")
        typer.echo(queue_estimate(suite.studies, plans, jobs))
        raise typer.Exit(0)
    try:
        for spec in suite.studies:
            check_upstream(spec, [p.run for p in pending[spec.name]])
    except UserFacingError as exc:
        _fail(str(exc), code=1)
    if not any(pending.values()):
        # nothing to train: the reports again, in seconds, without starting a flow
        for spec in suite.studies:
            finish_study(spec, read_open_study(spec))
        if suite.has_parts:
            finish_suite(suite)
        raise typer.Exit(0)
    typer.echo(queue_estimate(suite.studies, plans, jobs))
    # the flow lives outside the library (the library never imports Prefect): run it as its own process
    code = subprocess.call([sys.executable, "-m", "flows.study", "--study", str(suite.path), "--project",
                            str(suite.project), "--jobs", str(jobs)], env=os.environ.copy())
    raise typer.Exit(code)


@app.command("merge")
def merge(config: Path = typer.Argument(..., help="a mergekit-style merge YAML (models: or slices: with sources, "
                                                  "layer_range and filters; base_model, merge_method, parameters, "
                                                  "dtype, out_dtype, tokenizer_source)"),
          out_dir: Path = typer.Argument(..., help="output folder (must not exist; written atomically)"),
          max_shard_size: str = typer.Option("5GB", "--max-shard-size", help="largest output shard, e.g. 5GB, "
                                                                              "500MB, 2GiB"),
          seed: int = typer.Option(0, help="seed of the generator the random methods (dare_*) draw from"),
          overwrite: bool = typer.Option(False, "--overwrite", help="replace OUT_DIR if it exists (only once "
                                                                    "the new output is complete)")) -> None:
    """Merge safetensors checkpoints as a mergekit config says, streamed tensor by tensor (no whole model in
    memory); the result loads with transformers' from_pretrained."""
    from protege.errors import UserFacingError
    from protege.merging.io import parse_size
    from protege.merging.streaming import merge_folders

    try:
        shard_bytes = parse_size(max_shard_size)
    except ValueError as exc:
        _fail(f"--max-shard-size: {exc}", code=1)
    step = [0]

    def progress(done: int, total: int, name: str) -> None:
        if done == total or done == 1 or done >= step[0]:
            typer.echo(f"merge: {done}/{total} tensors ({name})", err=True)
            step[0] = done + max(1, total // 50)

    try:
        out = merge_folders(config, out_dir, progress=progress, max_shard_bytes=shard_bytes, seed=seed,
                            overwrite=overwrite)
    except UserFacingError as exc:
        _fail(str(exc), code=1)
    typer.echo(f"merged -> {out}")


LIMITS = Limits()


@sandbox_app.command("run")
def sandbox_run(file: Path = typer.Argument(..., help="a Python file to run"),
                timeout_s: float = typer.Option(LIMITS.timeout_s, "--timeout-s", help="wall-clock limit, seconds"),
                cpu_s: int = typer.Option(LIMITS.cpu_s, "--cpu-s", help="CPU time limit, seconds"),
                memory_mb: int = typer.Option(LIMITS.memory_mb, "--memory-mb", help="address-space limit, MB"),
                nproc: int = typer.Option(LIMITS.nproc, "--nproc", help="processes + threads the program may have"),
                output_bytes: int = typer.Option(LIMITS.output_bytes, "--output-bytes",
                                                 help="stdout and stderr kept, each"),
                file_mb: int = typer.Option(LIMITS.file_mb, "--file-mb", help="largest file the program can write, MB"),
                disk_mb: int = typer.Option(LIMITS.disk_mb, "--disk-mb", help="all the program can write in its "
                                                                              "folder, MB (bubblewrap only)"),
                unsafe: bool = typer.Option(False, "--unsafe", help="no isolation (rlimits, clean env and a temp "
                                                                    "dir only): never for untrusted code")) -> None:
    """Run FILE in the sandbox and print the outcome as JSON (stdout, stderr, exit_code, limit, ms,
    isolation); exits 0 whenever the file ran, even if the program failed."""
    from protege.tools.sandbox import Sandbox, SandboxUnavailable

    if not file.is_file():
        _fail(f"{file}: no such file")
    try:
        limits = Limits(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, nproc=nproc,
                        output_bytes=output_bytes, file_mb=file_mb, disk_mb=disk_mb)
        outcome = Sandbox(limits, unsafe=unsafe).run_file(file)
    except (ValueError, SandboxUnavailable, OSError) as exc:
        _fail(str(exc))
    typer.echo(json.dumps(outcome.to_json(), indent=2))


def main() -> None:
    # `protege stage` under a pipeline run: a warm host (protege/stage_host.py) runs it without paying for
    # the imports again; anything else, or no host, runs here
    if len(sys.argv) > 1 and sys.argv[1] == "stage":
        from protege.stage_client import run_via_host

        code = run_via_host(sys.argv[1:])
        if code is not None:
            sys.exit(code)
    app()


if __name__ == "__main__":
    main()
