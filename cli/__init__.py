"""The ``aot`` command line (installed as ``aot.cli``): thin click commands over the library."""
