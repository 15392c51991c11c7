"""`pto-patch verify`: one verify run (`pto_patch.run.verification`), and its report file if asked."""

from __future__ import annotations

from pathlib import Path

from pto_patch.run.report import VerifyReport, write_report
from pto_patch.run.report_folder import check_report_place
from pto_patch.run.verification import VerifyOptions, verify_model


def run_verify(options: VerifyOptions) -> VerifyReport:
    if options.report_file is not None:  # refused before the run, not after it
        check_report_place(Path(options.report_file).parent, "--report-file")
    report = verify_model(options)
    if options.report_file is not None:
        report.report_file = str(options.report_file)
        write_report(report.to_json(), options.report_file)
    return report
