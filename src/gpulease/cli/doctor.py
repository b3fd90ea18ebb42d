"""`gpulease doctor`: check a Python environment's driver, CUDA and framework builds."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from gpulease import doctor as checks
from gpulease.cli.output import OutputFormat, OutputOption, console, fail


def _target_python(python: str | None) -> str | None:
    """The interpreter to check: --python, else the active venv's (inside an instance: the
    template's), else None for this very process."""
    if python:
        return python
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:
        candidate = Path(venv) / "bin" / "python"
        if candidate.exists() and candidate.resolve() != Path(sys.executable).resolve():
            return str(candidate)
    return None


def doctor(
    python: Annotated[
        str | None,
        typer.Option("--python", help="the interpreter to check (default: the active venv's)"),
    ] = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Check the NVIDIA driver, the CUDA it supports, torch/torchvision/jax builds,
    torch.cuda.is_available() and CUDA_VISIBLE_DEVICES, and print a fix for each problem.
    Inside an instance, `python -m gpulease.doctor` runs the same checks."""
    target = _target_python(python)
    if target is None:
        report = checks.run_checks()
        if output is OutputFormat.json:
            console().print_json(data=report.to_json())
        else:
            console().print(checks.render(report), markup=False, soft_wrap=True)
        if report.failed:
            raise typer.Exit(1)
        return
    with tempfile.TemporaryDirectory(prefix="gpulease-doctor-") as place:
        checks.install(Path(place))
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH")}
        env["PYTHONPATH"] = place
        argv = [target, "-m", "gpulease.doctor"]
        if output is OutputFormat.json:
            argv.append("--json")
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            fail(f"could not run {target}: {exc}")
    if done.returncode not in (0, 1):
        fail(f"{target} -m gpulease.doctor failed ({done.returncode}): {done.stderr.strip()}")
    sys.stdout.write(done.stdout)
    if done.returncode == 1:
        raise typer.Exit(1)
