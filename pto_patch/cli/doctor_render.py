"""`pto-patch doctor`'s text: the stack, the devices, PyPTO's NPU pre-flight, then one row per op and backend."""

from __future__ import annotations

from typing import Any

from pto_patch.cli.console import err, escape, out


def _value(value: Any) -> str:
    return "-" if value is None else escape(str(value))


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def doctor_text(report) -> None:
    from rich import box

    from pto_patch.cli.console import folding_table  # text output only

    stack = report.stack
    out.print("[bold]stack[/]", markup=True)
    out.print(
        f"  python {stack['python']} ({_value(stack['python_executable'])}), {_value(stack['platform'])}"
    )
    releases = ", ".join(
        f"{name} {_value(stack[name])}"
        for name in ("torch", "torch_npu", "transformers", "vllm", "vllm_ascend")
    )
    out.print(f"  {releases}")
    out.print(
        f"  CANN {_value(stack['cann'])} (ASCEND_HOME_PATH {_value(stack['ascend_home_path'])}), torchair {_value(stack['torchair'])}"
    )
    out.print(f"  pypto {_value(stack['pypto'])}, runtime: {_value(stack['pypto_runtime'])}")
    pair = stack.get("torch_npu_pair")
    if pair and pair["status"] != "no torch_npu":
        mark = "ok  " if pair["status"] == "published" else "[yellow]WARN[/]"
        hint = f": {pair['hint']}" if pair["hint"] else ""
        out.print(f"  {mark} {escape(pair['line'] + hint)}", markup=True, highlight=False)
    found = report.devices
    npus = ", ".join(found["npu"]) or "none"
    cudas = ", ".join(found["cuda"]) or "none"
    out.print("[bold]devices[/]", markup=True)
    out.print(
        f"  NPU: {len(found['npu'])} ({npus}); CUDA: {len(found['cuda'])} ({cudas}); CPU: {found['cpu']}"
    )
    preflight = report.pypto["preflight"]
    verdict = "[green]ready[/]" if preflight["ready"] else "[yellow]not ready[/]"
    out.print(f"[bold]pypto on an NPU[/]: {verdict}", markup=True)
    for check in preflight["checks"]:
        mark = "ok  " if check["ok"] else "FAIL"
        hint = "" if check["ok"] or not check["hint"] else f": {check['hint']}"
        out.print(f"  {mark} {check['detail'] + hint}", highlight=False)
    prepared = report.pypto.get("prepared")
    if prepared and prepared["settings"]:
        settings = ", ".join(f"{k}={v}" for k, v in prepared["settings"].items())
        out.print(f"  set: {settings}", highlight=False)
    table = folding_table(
        title=f"ops on {report.device}, {report.dtype}, {report.tokens} token(s), GutenOCR-3B widths, vs float64",
        title_justify="left",
        box=box.SIMPLE,
        pad_edge=False,
    )
    for column in ("op", "backend", "status", "rel err", "max abs", "run ms", "1st ms", "compile s"):
        left = column in ("op", "backend", "status")
        table.add_column(column, justify="left" if left else "right")
    for check in report.checks:
        status = check.status if check.status == "ok" else f"[red]{check.status}[/]"
        if check.status == "not run":
            status = "not run"
        table.add_row(
            check.op,
            check.backend,
            status,
            _number(check.rel_error, ".2e"),
            _number(check.max_abs_error, ".3g"),
            _number(check.run_ms, ".2f"),
            _number(check.first_call_ms, ".1f"),
            _number(check.compile_s, ".2f"),
        )
    out.print(table)
    for check in report.checks:
        if check.reason:
            out.print(f"  {check.op} on {check.backend}: {check.reason}", highlight=False)
    if report.device_checks:
        out.print("[bold]what a first 910B run must check[/]", markup=True)
    for check in report.device_checks:
        mark = {"ok": "ok  ", "not run": "not run"}.get(check.status, f"[red]{check.status.upper()}[/]")
        out.print(f"  {mark} {check.name}: {escape(check.checks)}", markup=True, highlight=False)
        if check.reason:
            out.print(f"       {check.reason}", highlight=False)
    out.print(f"  kernels from {report.kernels_path}; {report.seconds:.1f} s")
    for failure in report.failures:
        err.print(f"[bold red]failed:[/] {escape(failure)}", markup=True, highlight=False)
    skipped = sum(check.status == "not run" for check in report.device_checks)
    if report.passed:
        note = f" ({skipped} device check(s) did not run: not passed, not failed)" if skipped else ""
        out.print(f"[bold green]PASSED[/]{note}", markup=True)
    else:
        out.print(f"[bold red]FAILED[/] ({len(report.failures)} check(s)); exit code 3", markup=True)
