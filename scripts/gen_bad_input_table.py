"""Writes the bad-input table of docs/reliability.md from the bad-input tests' case tables
(`make docs`), or checks it is current (--check). Prints how many inputs it holds.

Every row is a case one of those tests sends to a real process, with the status and message
fragment it asserts. The case tables are module-level data, read here without starting anything;
only the text between the section's two marker comments is rewritten.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from google.protobuf.message import Message

from scripts.generated_page import write_or_check

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "reliability.md"
BEGIN, END = "<!-- bad-inputs:begin -->", "<!-- bad-inputs:end -->"
# A cell longer than this is cut: the test file has the whole input.
MAX_CELL = 160
# A character (not a digit) repeated this often is written once with its count: "y"×4097.
RUN = 8


@dataclass(frozen=True, slots=True)
class Row:
    api: str      # the service and the call or endpoint
    name: str     # the case's short name, as the test's id spells it
    sent: str     # what goes on the wire
    status: str   # the status asserted
    says: str     # the fragment of the message asserted
    test: str     # the test module


# -- how an input is shown ------------------------------------------------------------------------

def squeeze(text: str) -> str:
    return re.sub(r"(\D)\1{%d,}" % (RUN - 1), lambda m: f"{m.group(1)}×{len(m.group(0))}", text)


def items(values: list[str]) -> str:
    if len(values) >= RUN and len(set(values)) == 1:
        return f"[{values[0]}]×{len(values)}"
    if len(values) > RUN:
        return f"[{', '.join(values[:3])}, … {len(values)} in all]"
    return f"[{', '.join(values)}]"


def scalar(value: object) -> str:
    if isinstance(value, str) and len(value) >= RUN and len(set(value)) == 1:
        return f"{json.dumps(value[0])}×{len(value)}"
    if isinstance(value, str):
        return squeeze(json.dumps(value, ensure_ascii=False))
    if isinstance(value, bytes):
        return squeeze(repr(value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def proto(message: Message) -> str:
    """`field=value` for every field set, nested messages in braces, lists shortened."""
    parts = []
    for field, value in message.ListFields():
        if isinstance(value, Message):
            # An empty message says nothing (its fields take defaults) unless a oneof chose it.
            if value.ListFields() or field.containing_oneof is not None:
                parts.append(f"{field.name}={{{proto(value)}}}")
        elif isinstance(value, (str, bytes, int, float)):
            parts.append(f"{field.name}={scalar(value)}")
        else:  # a repeated field
            parts.append(f"{field.name}=" + items([
                f"{{{proto(v)}}}" if isinstance(v, Message) else scalar(v) for v in value]))
    return " ".join(parts)


def json_like(value: object) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {json_like(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return items([json_like(v) for v in value])
    return scalar(value) if isinstance(value, str) else json.dumps(value)


def shown(value: object) -> str:
    """A case's input as the table shows it; a str is a description already."""
    if isinstance(value, Message):
        return f"{type(value).__name__} {proto(value)}".strip()
    if isinstance(value, bytes):
        return squeeze(repr(value))
    if isinstance(value, (dict, list)):
        return json_like(value)
    return squeeze(str(value))


def status_name(status: object) -> str:
    return getattr(status, "name", str(status))


# -- the tables of the three test modules ---------------------------------------------------------

def test_file(module: ModuleType) -> str:
    return Path(module.__file__).resolve().relative_to(ROOT).as_posix()


def gateway_rows() -> list[Row]:
    from tests.gateway import test_gateway_bad_input as t
    test = test_file(t)
    rows = [Row("gateway gRPC `Generate`", name, shown(request), status_name(status), says, test)
            for name, (request, status, says) in t.GRPC_CASES.items()]
    rows += [Row("gateway gRPC `Generate`, raw bytes", name, shown(body), status_name(status),
                 says, test) for name, (body, status, says) in t.GRPC_WIRE_CASES.items()]
    rows += [Row(f"gateway HTTP `/v1/{endpoint}`", name, shown(body),
                 f"{status}" + (f", param `{param}`" if param else ""), says, test)
             for name, (endpoint, body, status, says, param) in t.HTTP_CASES.items()]
    return rows


def allocator_rows() -> list[Row]:
    from pagedserve.allocator.v1 import allocator_pb2 as pb
    from tests.allocator import test_allocator_bad_input as t
    test = test_file(t)

    def op_status(status: int) -> str:
        return f"OK; op {pb.OpStatus.Name(status).removeprefix('OP_STATUS_')}"

    def step(ops: list) -> str:
        return "; ".join(shown(op).removeprefix("BlockOp ") for op in ops)

    rows = []
    for case in t.REQUEST_ERRORS:
        call, code, says = case.values
        rows.append(Row(f"allocator `{call.shows.split()[0]}`", case.id, shown(call.shows),
                        status_name(code), says, test))
    for case in t.OP_FAILURES:
        setup, op, status, says = case.values
        sent = f"Step {step([op])}" + (f", after Step {step(setup)}" if setup else "")
        rows.append(Row("allocator `Step`, one op", case.id, sent, op_status(status), says,
                        test))
    for case in t.FOREIGN_OPS:
        op, status, says = case.values
        rows.append(Row("allocator `Step`, one op", case.id,
                        f"Step {step([op])} by another executor than the one holding 'theirs'",
                        op_status(status), says, test))
    rows += [Row(f"allocator `{method}`, raw bytes", name, shown(body), status_name(code), says,
                 test) for name, (method, body, code, says) in t.WIRE_CASES.items()]
    return rows


def executor_rows() -> list[Row]:
    from tests.executor import test_executor_bad_input as t
    test = test_file(t)
    rows = [Row(f"executor `Session` submit, {t.ON_STREAM.split(', ')[1]}", name,
                shown(request), status_name(status), says, test)
            for name, (request, status, says) in t.SUBMISSIONS.items()]
    for name, (where, sent, status, says) in t.OTHER_CASES.items():
        rpc, _, how = where.partition(", ")
        rows.append(Row(f"executor `{rpc}`" + (f", {how}" if how else ""), name, shown(sent),
                        status_name(status), says, test))
    return rows


def all_rows() -> list[Row]:
    return gateway_rows() + executor_rows() + allocator_rows()


# -- the section ----------------------------------------------------------------------------------

def cell(text: str, code: bool = False) -> str:
    text = " ".join(text.split())
    if len(text) > MAX_CELL:
        text = text[:MAX_CELL - 1] + "…"
    text = text.replace("|", "\\|")
    return f"`{text}`" if code and text else text


def render(rows: list[Row]) -> str:
    services = {}
    for row in rows:
        service = row.api.split()[0]
        services[service] = services.get(service, 0) + 1
    counts = ", ".join(f"{service} {count}" for service, count in services.items())
    lines = [BEGIN,
             f"{len(rows)} inputs ({counts}). Generated by `scripts/gen_bad_input_table.py` "
             "from the tests' case tables; do not edit by hand.", "",
             "| service / API | input | sent | status | the answer says | test |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {row.api} | {cell(row.name)} | {cell(row.sent, code=True)} | {row.status} | "
              f"{cell(row.says, code=True)} | `{row.test}` |" for row in rows]
    return "\n".join([*lines, END])


def rewritten(document: str, section: str) -> str:
    start, end = document.find(BEGIN), document.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{OUTPUT.relative_to(ROOT)} lacks the markers {BEGIN} ... {END}")
    return document[:start] + section + document[end + len(END):]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the table is stale instead of writing it")
    check = parser.parse_args().check
    rows = all_rows()
    print(f"{len(rows)} bad inputs")
    text = rewritten(OUTPUT.read_text(), render(rows))
    return write_or_check(OUTPUT, text, check,
                          f"the bad-input table of {OUTPUT.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
