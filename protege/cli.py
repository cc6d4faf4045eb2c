"""`protege ...` commands."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import typer

from protege.config import ConfigError, load_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help="protege: RL + imitation post-training pipeline.")
config_app = typer.Typer(no_args_is_help=True, help="Inspect the configuration.")
app.add_typer(config_app, name="config")
data_app = typer.Typer(no_args_is_help=True, help="Import and validate datasets.")
app.add_typer(data_app, name="data")


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


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
                                                       "input's folder)")) -> None:
    """Import a dataset into protege's question-row schema, validated by its Great Expectations suite."""
    from protege.data.importers import import_dataset
    from protege.errors import UserFacingError

    fmt = fmt or ("parquet" if input.suffix == ".parquet" else "llava")
    try:
        res = import_dataset(input, fmt, out, name, images)
    except UserFacingError as exc:
        _fail(str(exc), code=1)
    typer.echo(f"{input}: {res.rows_read} rows read, {res.duplicates_dropped} duplicates dropped, "
               f"{res.rows_written} written to {res.table} ({res.images_written} images); report {res.report}")


@app.command()
def stage(name: str = typer.Argument(..., help="stage name, as in dvc.yaml"),
          params: Path = typer.Option(Path("params.yaml"), help="params file")) -> None:
    """Run one pipeline stage in the current project folder (this is what dvc.yaml calls)."""
    from protege import tracking
    from protege.errors import UserFacingError
    from protege.stages import stage_module

    cfg = _config(params)
    try:
        module = stage_module(name)
    except KeyError as exc:
        _fail(exc.args[0])
    root = Path.cwd()
    try:
        with tracking.stage_run(name, root) as run:
            module.run(cfg, root, run)
    except (UserFacingError, FileNotFoundError, FloatingPointError) as exc:
        _fail(f"{name}: {exc}", code=1)


@app.command()
def pipeline(project: Path = typer.Option(Path("."), help="project folder (holds dvc.yaml and params.yaml)"),
             params: Path = typer.Option(Path("params.yaml"), help="params file, checked before anything runs")) -> None:
    """Run the whole pipeline as a Prefect flow (each stage through DVC, tracked in MLflow)."""
    from protege.pipeline import missing_dag_params

    _config(project / params)
    missing = missing_dag_params(project, str(params))
    if missing:
        _fail(f"{project / params}: dvc.yaml tracks {', '.join(missing)} but the file does not set them; "
              "write them out (`protege config show` prints every value)")
    # the flow lives outside the library (the library never imports Prefect): run it as its own process
    code = subprocess.call([sys.executable, "-m", "flows.pipeline", "--project", str(project)], env=os.environ.copy())
    raise typer.Exit(code)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
