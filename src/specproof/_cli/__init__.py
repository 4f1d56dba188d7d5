"""Subcommands of the ``specproof`` command (see ``specproof.cli``)."""
