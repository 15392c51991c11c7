"""`pto-patch doctor`: the stack, the devices, PyPTO's NPU pre-flight, and each op's kernels checked."""

from __future__ import annotations

from typing import Annotated

import typer

from pto_patch.cli.options import DeviceOpt, DtypeOpt, JsonOpt, app


@app.command()
def doctor(
    device: DeviceOpt = None,
    dtype: DtypeOpt = "bf16",
    pypto: Annotated[
        bool,
        typer.Option(
            "--pypto", help="Also check the pypto backend on a CPU, through its interpreter (slow)."
        ),
    ] = False,
    tokens: Annotated[
        int, typer.Option("--tokens", help="Rows each op is checked at (decode: 16 or fewer).")
    ] = 4,
    as_json: JsonOpt = False,
) -> None:
    """Show what the kernels run with here and check every op on each backend against the reference."""
    from pto_patch.cli import render
    from pto_patch.run.diagnosis.doctor import run_doctor

    report = run_doctor(device, dtype, with_pypto=pypto, tokens=tokens)
    render.show(report, as_json=as_json)
    raise typer.Exit(report.exit_code)
