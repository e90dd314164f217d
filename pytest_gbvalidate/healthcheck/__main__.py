"""`python -m pytest_gbvalidate.healthcheck` (cli.py). A command that cannot be imported (a dependency missing) says
nothing of the node: one line and the mode's "no verdict" status, not a traceback and exit 1, which Slurm and NPD
would read as a failed check. Both are written out here, as what holds them may be what failed to import."""

import sys

SLURM_EXIT_NOT_RUN = 10  # slurm.EXIT_NOT_RUN
NPD_EXIT_UNKNOWN = 2  # npd.EXIT_UNKNOWN
SLURM_LINE_MAX_CHARS = 1000  # slurm.LINE_MAX_CHARS
NPD_MAX_OUTPUT_LENGTH = 80  # npd.DEFAULT_MAX_OUTPUT_LENGTH: NPD's default


def cannot_import(error: ImportError, argv: list[str]) -> tuple[str, int]:
    """The line and exit status of a command that could not be imported: Slurm's in `slurm` mode, else NPD's."""
    said = " ".join(f"cannot import the health check: {type(error).__name__}: {error}".split())
    said = "".join(c if c.isascii() and c.isprintable() else ascii(c)[1:-1] for c in said)  # as verdict.escaped
    if argv[:1] == ["slurm"]:
        line = f"ERROR:  gbvalidate:  Health check could not run:  {said}"
        return _cut(line, SLURM_LINE_MAX_CHARS), SLURM_EXIT_NOT_RUN
    return _cut(f"unknown: {said}", NPD_MAX_OUTPUT_LENGTH), NPD_EXIT_UNKNOWN


def _cut(line: str, max_chars: int) -> str:
    return line if len(line) <= max_chars else line[: max_chars - 3] + "..."


if __name__ == "__main__":
    try:
        from pytest_gbvalidate.healthcheck.cli import main
    except ImportError as exc:
        line, status = cannot_import(exc, sys.argv[1:])
        print(line, flush=True)
        sys.exit(status)
    sys.exit(main())
