"""A config written as YAML with each key under its comment: what `python -m draftsmith init` writes."""

from __future__ import annotations

import textwrap

import yaml

WIDTH = 110
LAYOUT_KEYS = ("layer_types", "sliding_window")

Notes = dict[str, str]  # a section's comments by key
SECTION, LAYOUT = "", "layout"  # the keys of a section's own comment and of the drafter's layer kinds


def flow(value: object) -> str:
    """One value as YAML on one line."""
    return (
        yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False)
        .removesuffix("\n...\n")
        .strip()
    )


def comment(text: str, indent: str) -> list[str]:
    """`text` as comment lines (a leading indent of the text is kept: a command to copy)."""
    lead = text[: len(text) - len(text.lstrip())]
    return textwrap.wrap(
        text.lstrip(),
        WIDTH,
        initial_indent=f"{indent}# {lead}",
        subsequent_indent=f"{indent}# {lead}",
        break_on_hyphens=False,
        break_long_words=False,  # a path or a command stays whole, to be copied
    )


def render(config: dict, notes: dict[str, Notes], header: list[str]) -> str:
    """The config as YAML, each key under its comment; the drafter's layer kinds last, under theirs."""
    lines = [line for paragraph in header for line in comment(paragraph, "")]
    for section, value in config.items():
        said = notes.get(section, {})
        lines += [""] + comment(said.get(SECTION, ""), "")
        if not isinstance(value, dict):
            lines.append(f"{section}: {flow(value)}")
            continue
        lines.append(f"{section}:")
        for key, item in value.items():
            if key not in LAYOUT_KEYS:
                lines += comment(said.get(key, ""), "  ") + [f"  {key}: {flow(item)}"]
        if LAYOUT in said:
            lines += comment(said[LAYOUT], "  ")
            lines += [f"  {k}: {flow(value[k])}" for k in LAYOUT_KEYS if k in value]
    text = "\n".join(lines) + "\n"
    if yaml.safe_load(text) != config:
        raise AssertionError("init wrote YAML that does not read back as the config it meant")
    return text
