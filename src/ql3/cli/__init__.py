"""The ``ql3`` command line: one module per command group; ``main(argv) -> int``."""
