"""The generators behind `make protos` and `make docs`; run them from the repository root as
modules (`python -m scripts.gen_bad_input_table`) so that they import the project and tests/."""
