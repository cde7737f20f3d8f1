"""What the soak found, as the terminal's tables and as the `## Soak` section of
docs/reliability.md, which lives between two markers so the rest of the page is never touched:

    <!-- soak:begin -->
    ## Soak
    ...
    <!-- soak:end -->

How the soak measures and how to read the section is written once, by hand, in
docs/reliability.md (`## Soak: how it is measured`, outside the markers).
"""
from __future__ import annotations

import textwrap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench.load.impatient_clients import OUTCOMES, Result
from bench.report import (Row, image_link, list_item, machine_description, markdown_grid,
                          markdown_table, method_link, text_grid, text_table, today)
from bench.soak.memory import EARLY, LATE, MAX_GROWTH, MIN_JUDGED_S, Growth, MemorySamples
from bench.soak.stack import EVENTS_MAX, NUM_BLOCKS

BEGIN, END = "<!-- soak:begin -->", "<!-- soak:end -->"


@dataclass(slots=True)
class SoakResults:
    command: str
    minutes: float
    concurrency: int
    kinds: list[str]
    results: list[Result]
    load_s: float                          # from the first request to the last one ending
    # Per allocator restart: seconds into the load when it was killed, seconds it was away.
    restarts: list[tuple[float, float]]
    restarts_planned: int
    # The gateway's undisturbed answer to a prompt that differed from the in-process engine's.
    reference_mismatches: list[str]
    wrong_answers: list[str]
    leftovers: dict[str, int]
    audit: str                             # pagedctl audit's output
    audit_clean: bool
    gateway_outcomes: dict[str, int]
    memory: MemorySamples
    growth: list[Growth]
    machine: str = field(default_factory=machine_description)

    @property
    def failed(self) -> list[Result]:
        return [result for result in self.results if result.outcome == "error"]

    def longest_lull(self) -> float:
        """Seconds: a stall of the whole stack (or of the machine) shows up here."""
        ends = sorted(result.ended_at for result in self.results)
        return max((later - earlier for earlier, later in zip(ends, ends[1:])), default=0.0)

    @property
    def memory_judged(self) -> bool:
        return self.load_s >= MIN_JUDGED_S and bool(self.growth)

    def rows(self) -> list[Row]:
        tally = Counter(result.outcome for result in self.results)
        tokens = sum(result.tokens_received() for result in self.results)
        greedy = [result for result in self.results if result.plan.greedy]
        restarts = ", ".join(f"killed at {at / 60:.1f} min, SERVING again after {away:.1f} s"
                             for at, away in self.restarts) or "none"
        left = ", ".join(f"{name} {count}" for name, count in self.leftovers.items())
        rows = [
            Row("requests started / per second", f"{len(self.results)} / "
                f"{len(self.results) / self.load_s:.1f}"),
            Row("ended: finished / gave up mid-stream / gave up before output",
                f"{tally['finished']} / {tally['gave-up-mid-stream']} / "
                f"{tally['gave-up-before-output']}"),
            Row("output tokens delivered to clients / per second",
                f"{tokens} / {tokens / self.load_s:.0f}"),
            Row("longest stretch in which no request ended", f"{self.longest_lull():.1f} s"),
            Row("allocator `kill -9` and restart on the same Redis", restarts,
                str(self.restarts_planned), len(self.restarts) == self.restarts_planned),
            Row("requests that failed (neither finished nor given up)",
                str(len(self.failed)), "0", not self.failed),
            Row("gateway's undisturbed greedy answers equal to the in-process engine's",
                f"{len(self.reference_mismatches)} differ", "0 differ",
                not self.reference_mismatches),
            Row("greedy answers checked: finished / partial (a prefix of the answer)",
                f"{sum(r.finished for r in greedy)} / "
                f"{sum(r.outcome == 'gave-up-mid-stream' for r in greedy)}"),
            Row("answers wrong (greedy: not the engine's; sampled: not max_tokens long)",
                str(len(self.wrong_answers)), "0", not self.wrong_answers),
            Row("left once clients are gone", left, "all 0",
                set(self.leftovers.values()) <= {0}),
            Row("`Audit` of the allocator", "clean" if self.audit_clean else "VIOLATIONS",
                "clean", self.audit_clean),
            Row("gateway's count of requests by outcome", ", ".join(
                f"{outcome} {count}" for outcome, count in sorted(self.gateway_outcomes.items()))),
        ]
        for g in self.growth:
            rows.append(Row(f"RSS growth, {g.process} (last 20 % vs 20-40 % of the run)",
                            f"{g.growth_mib:+.1f} MiB ({g.growth_share:+.1%})",
                            f"< {MAX_GROWTH:.0%}", g.stable if self.memory_judged else None))
        return rows

    @property
    def passed(self) -> bool:
        return all(row.met is not False for row in self.rows())

    def outcome_grid(self) -> tuple[list[str], list[list[str]]]:
        tally = Counter((result.plan.kind, result.outcome) for result in self.results)
        header = ["kind", *OUTCOMES, "all"]
        rows = [[kind, *(str(tally[kind, outcome]) for outcome in OUTCOMES),
                 str(sum(tally[kind, outcome] for outcome in OUTCOMES))] for kind in self.kinds]
        return header, rows

    def memory_grid(self) -> tuple[list[str], list[list[str]]]:
        header = ["process", "first sample", f"mean {EARLY[0]:.0%}-{EARLY[1]:.0%}",
                  f"mean {LATE[0]:.0%}-{LATE[1]:.0%}", "last sample", "growth"]
        rows = [[g.process, f"{g.start_mib:.0f}", f"{g.early_mib:.1f}", f"{g.late_mib:.1f}",
                 f"{g.end_mib:.0f}", f"{g.growth_mib:+.1f} ({g.growth_share:+.1%})"]
                for g in self.growth]
        return header, rows


def terminal_report(r: SoakResults) -> str:
    memory_note = ("" if r.memory_judged else
                   f"\n(memory not judged: the run was under {MIN_JUDGED_S / 60:.0f} minutes)")
    return "\n\n".join([text_table(r.rows()), text_grid(*r.outcome_grid()),
                        "RSS, MiB\n" + text_grid(*r.memory_grid()) + memory_note])


def settings_lines(r: SoakResults) -> list[str]:
    """The run's settings, one list item each; what they mean is in the method section."""
    restart = ("killed with SIGKILL at half time and started again on the same port and Redis"
               if r.restarts_planned else "not restarted")
    return [
        f"{r.minutes:g} minutes of mixed load from {r.concurrency} clients at a time; the "
        f"allocator {restart}.",
        f"Caches: the executor's pool has {NUM_BLOCKS:,} blocks and the allocator keeps "
        f"{EVENTS_MAX:,} KV events in Redis (`--events-max`).",
    ]


def section(r: SoakResults, out_png: Path | None, out_md: Path) -> str:
    plot = f"\n\n{image_link(out_png, out_md, 'soak memory')}" if out_png else ""
    settings = "\n".join(list_item(line) for line in settings_lines(r))
    return f"""## Soak

{fill(f"Measured {today()} on {r.machine}.")}

Command: `{r.command}`

{method_link("Soak")}

{settings}

{markdown_table(r.rows())}

How each request ended, by kind:

{markdown_grid(*r.outcome_grid())}

Resident memory (MiB):

{markdown_grid(*r.memory_grid())}{plot}
"""


def fill(paragraph: str) -> str:
    return textwrap.fill(paragraph, width=100, break_long_words=False, break_on_hyphens=False)


def write_section(page: Path, body: str) -> None:
    """Puts `body` between the soak markers, which are added at the end of the page if missing."""
    text = page.read_text() if page.exists() else ""
    block = f"{BEGIN}\n{body.strip()}\n{END}"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + block + "\n"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)
