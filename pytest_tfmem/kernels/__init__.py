"""Notebooks run as tests (nbmake, nbval): their kernels book their own start and first imports apart."""
