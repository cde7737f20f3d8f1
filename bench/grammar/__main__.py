"""Grammar-engine benchmark: what structured output costs a request (compiling its constraint)
and every token (computing the mask), for each installed engine on the same tokenizer and
constraints, so the executor's choice (llguidance; docs/structured-output.md) is a measurement.

    .venv/bin/python -m bench.grammar            # 32k-token vocabulary, 5 rounds
    .venv/bin/python -m bench.grammar --quick    # smoke run; writes nothing unless told

Each constraint gets one token sequence it accepts, drawn once with llguidance under random
logits; every engine replays exactly that sequence, filling the mask before each token (and
after the last, where EOS becomes allowed) and accepting the token. Compile time is everything
before the first mask, with each engine's cache off. The engines run one after another in each
round, in an order that alternates between rounds.

Writes the `## Structured output` section of docs/benchmarks.md (report.py) and
docs/img/grammar_bench.png (plot.py); `--results-dir` also keeps grammar_bench.json.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from tqdm import tqdm

from bench.grammar import report as grammar_report
from bench.grammar.engines import Refused, installed
from bench.grammar.plot import write_plot
from bench.grammar.report import Measurement, Results
from bench.grammar.workloads import CONSTRAINTS, EOS, sample_tokens, token_bytes, train_tokenizer
from bench.report import add_output_flags, output_paths, publish, text_grid, with_overrides

SEED = 20261125


@dataclass(frozen=True, slots=True)
class Preset:
    vocab_size: int
    rounds: int


FULL = Preset(vocab_size=32000, rounds=5)
QUICK = Preset(vocab_size=1024, rounds=1)


def run(preset: Preset, quick: bool = False) -> Results:
    tokenizer = train_tokenizer(preset.vocab_size)
    tokenizer_json, eos_id = tokenizer.to_str(), tokenizer.token_to_id(EOS)
    vocab = token_bytes(tokenizer)
    engines = installed(tokenizer_json, vocab, eos_id)
    samples = {c.name: sample_tokens(tokenizer_json, eos_id, len(vocab), c, SEED)
               for c in CONSTRAINTS}
    results = Results(len(vocab), preset.rounds, {name: len(t) for name, t in samples.items()},
                      {engine.name: version(engine.name) for engine in engines}, quick=quick)
    total = preset.rounds * sum(engine.supports(c) for engine in engines for c in CONSTRAINTS)
    with tqdm(total=total, desc="grammar engines", unit="run") as progress:
        for round_index in range(preset.rounds):
            order = engines if round_index % 2 == 0 else engines[::-1]
            for constraint in CONSTRAINTS:
                for position, engine in enumerate(order):
                    if not engine.supports(constraint):
                        continue
                    results.measurements.append(measure(engine, constraint, samples,
                                                        round_index, position))
                    progress.update()
    return results


def measure(engine, constraint, samples, round_index: int, position: int) -> Measurement:
    start = time.perf_counter()
    compiled = engine.compile(constraint)
    compile_s = time.perf_counter() - start
    measurement = Measurement(engine.name, constraint.name, round_index, position, compile_s)
    try:
        measurement.mask_s = engine.replay(compiled, samples[constraint.name])
    except Refused as refusal:
        measurement.refused = str(refusal)
    return measurement


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.grammar", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_flags(parser)
    parser.add_argument("--vocab-size", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--results-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    preset = with_overrides(QUICK if args.quick else FULL, vocab_size=args.vocab_size,
                            rounds=args.rounds)
    results = run(preset, quick=args.quick)
    header, rows = grammar_report.grid(results)
    print(text_grid(header, rows))
    out_md, out_png = output_paths(args, "grammar_bench.png")
    publish(grammar_report.HEADING, results, grammar_report, write_plot, args.results_dir,
            out_png, out_md)


if __name__ == "__main__":
    main()
