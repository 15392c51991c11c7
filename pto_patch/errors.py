"""Every error the user can meet, each with a one-line message, a hint and an exit code.

The CLI turns these into output in one place (`pto_patch.cli.console.report_error`); nothing
else prints errors.
"""

from __future__ import annotations

# Documented exit codes (README "Exit codes").
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_VERIFY_FAILED = 3
EXIT_DRIFTED = 4
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports it (128 + SIGINT)
EXIT_TERMINATED = 143  # SIGTERM (128 + 15): `kill PID`, a scheduler's time-out


class PtoPatchError(Exception):
    """A failure with a message for the user, a hint for the fix, and an exit code."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str, hint: str = "", *, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code


class ModelFolderError(PtoPatchError):
    """The model folder is missing, or its config.json is missing, malformed or of another model."""


class SpecError(PtoPatchError):
    """An unknown or malformed model spec: a bad `--model` value, refused before anything loads."""

    exit_code = EXIT_USAGE


class SourceNotFoundError(PtoPatchError):
    """transformers (or the modeling source it should provide) cannot be found."""


class AnchorNotFoundError(PtoPatchError):
    """A codemod could not find the code it is meant to change in this transformers release."""


class DriftError(PtoPatchError):
    """A patched file was edited after apply; restore refuses to overwrite it."""

    exit_code = EXIT_DRIFTED


class DownloadError(PtoPatchError):
    """The checkpoint could not be fetched or is incomplete."""


class UsageError(PtoPatchError):
    """A bad option value or pair of options, refused before anything loads."""

    exit_code = EXIT_USAGE


class FolderBusyError(PtoPatchError):
    """Another pto-patch holds the model folder's lock."""
