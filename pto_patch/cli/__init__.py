"""The command line: the Typer app (`app`), its commands built lazily (`lazy_commands`), option values
(`values`), one console, and all text and JSON output (`render`, `tune_render`); `skill install`.
May import every other package; none imports it.
"""
