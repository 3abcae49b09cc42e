"""A strict reader of the Prometheus text exposition format (version 0.0.4), for the
tests of `jobns status --format prometheus`: every line is a HELP, a TYPE or a sample of
the family last declared; names, labels and values as the format defines them. The
result is also read back with prometheus_client's own parser."""

from __future__ import annotations

import math
import re

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(rf"^({NAME})(\{{(?:{LABEL}(?:,{LABEL})*)?\}})? (\S+)$")
LABELS = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: str) -> Samples:
    assert text.endswith("\n") and "\n\n" not in text, "one sample or comment per line"
    families: Samples = {}
    current = ""
    helped: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert re.fullmatch(NAME, name) and name not in helped, line
            helped.add(name)
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in TYPES and name not in families and name in helped, line
            families[name] = []
            current = name
        else:
            m = SAMPLE.match(line)
            assert m and m[1] == current, f"not a sample of {current}: {line!r}"
            labels = {
                k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                for k, v in LABELS.findall(m[2] or "")
            }
            value = float(m[3])
            assert not math.isnan(value), line
            assert labels not in [s for s, _ in families[current]], f"duplicate: {line}"
            families[current].append((labels, value))
    from prometheus_client.parser import text_string_to_metric_families

    theirs = {f.name: len(f.samples) for f in text_string_to_metric_families(text)}
    assert theirs == {k: len(v) for k, v in families.items()}
    return families
