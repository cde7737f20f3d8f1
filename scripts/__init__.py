"""The generators behind `make protos` and `make docs`. The docs generators import
scripts.generated_page, and the bad-input table imports the bad-input tests (tests.<area>.*), so
`make docs` runs them from the repository root as modules: `python -m scripts.gen_bad_input_table`.
"""
