"""`pto-patch verify`: one verify run (`pto_patch.run.verification`), and its report file if asked."""

from __future__ import annotations

from pto_patch.run.report import VerifyReport, write_report
from pto_patch.run.verification import VerifyOptions, verify_model


def run_verify(options: VerifyOptions) -> VerifyReport:
    report = verify_model(options)  # a --report-file in a hub cache is refused in its plan, before the run
    if options.report_file is not None:
        report.report_file = str(options.report_file)
        if not write_report(report.to_json(), options.report_file):
            report.report_file = None  # kept in the cache instead: the CLI names where
    return report
