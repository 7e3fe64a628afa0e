"""The `leaseproof` commands, one module each. Every module offers the same four
names, which `leaseproof.conformance.frontends.cli` looks up only for the command
a run names: `DESCRIPTION` and `EXITS` (its `--help` text and exit statuses),
`add_arguments(parser)` and `command(args, out, err) -> exit status`."""
