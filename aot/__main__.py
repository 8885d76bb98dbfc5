"""``python -m aot``: the ``aot`` command line."""

from aot.cli.main import main

if __name__ == "__main__":
    main()
