#!/usr/bin/env python3
"""Summarise a CSV file column by column, reading it once."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import Counter


def parse_number(value: str) -> float | None:
    try:
        return float(value.replace(",", ""))
    except ValueError:
        return None


class Column:
    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0
        self.blanks = 0
        self.numbers: list[float] = []
        self.texts = 0
        self.values: Counter[str] = Counter()

    def add(self, value: str) -> None:
        self.count += 1
        value = value.strip()
        if not value:
            self.blanks += 1
            return
        self.values[value] += 1
        number = parse_number(value)
        if number is None:
            self.texts += 1
        else:
            self.numbers.append(number)

    def summary(self, top: int) -> dict[str, object]:
        kind = "number" if self.numbers and not self.texts else "text" if self.texts and not self.numbers else "mixed"
        if not self.numbers and not self.texts:
            kind = "empty"
        result: dict[str, object] = {"column": self.name, "type": kind, "count": self.count, "blanks": self.blanks}
        if self.numbers:
            result.update(
                min=min(self.numbers), max=max(self.numbers), mean=round(sum(self.numbers) / len(self.numbers), 4)
            )
        result["top"] = ", ".join(f"{v} ({n})" for v, n in self.values.most_common(top))
        return result


def summarise(stream: object, delimiter: str, top: int) -> list[dict[str, object]]:
    reader = csv.reader(stream, delimiter=delimiter)  # type: ignore[arg-type]
    header = next(reader, [])
    columns = [Column(name or f"column {i + 1}") for i, name in enumerate(header)]
    for row in reader:
        for column, value in zip(columns, row, strict=False):
            column.add(value)
    return [column.summary(top) for column in columns]


def print_table(rows: list[dict[str, object]]) -> None:
    try:
        from tabulate import tabulate
    except ImportError:
        keys = list(dict.fromkeys(k for row in rows for k in row))
        print("\t".join(keys))
        for row in rows:
            print("\t".join(str(row.get(k, "")) for k in keys))
        return
    print(tabulate(rows, headers="keys"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path")
    parser.add_argument("--delimiter", default=",")
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with open(args.path, newline="", encoding="utf-8-sig") as stream:
        rows = summarise(stream, args.delimiter, args.top)
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
