"""One module per command; importing this package registers them all on `pto_patch.cli.options.app`, in
the order `pto-patch --help` lists them. Each imports its engine inside the command, so registering
them costs only their option declarations."""

from pto_patch.cli.commands import (  # noqa: F401 - imported to register
    apply,
    bench,
    demo,
    doctor,
    download,
    make_tiny,
    models,
    restore,
    skill,
    status,
    tune,
    verify,
)
